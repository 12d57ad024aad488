/* timing_events.h: a pair of timing events bracketing work on a stream, as pump's probes use
 * them (link_rate.c: one of pump's prefetches; kernel_time.c: a program's kernel): made in
 * the work's context, read later without waiting; and the probe that owns such a pair, one
 * state machine for both. */
#ifndef PUMP_TIMING_EVENTS_H
#define PUMP_TIMING_EVENTS_H

#include "shim.h"

/* Makes *start and *end (timing on) in ctx: false when the driver refused. */
PUMP_HIDDEN bool pump_timing_events_make(CUcontext ctx, CUevent *start, CUevent *end);
/* Whether what was recorded between start and end is over: *ns is then the GPU's time for it
 * (0 when the driver gave none); false, and *ns untouched, while it runs. */
PUMP_HIDDEN bool pump_timing_events_read(CUevent start, CUevent end, uint64_t *ns);

/* A probe's states, moved by compare-and-swap: the thread that takes BUSY owns the probe's
 * events until it lets go, and holds no lock meanwhile. BROKEN: the driver refused its events
 * in this life of its context; the context's next life tries again (issue 42, risk 8). */
enum pump_probe_state { PUMP_PROBE_IDLE, PUMP_PROBE_BUSY, PUMP_PROBE_IN_FLIGHT, PUMP_PROBE_BROKEN };

/* Zeroed with its context's slot (prefetch_context.h). */
struct pump_timing_probe {
    uint32_t state;      /* atomic: enum pump_probe_state */
    uint32_t forgets;    /* atomic: the context's forgets when its events were made, or refused */
    bool made;           /* events made (under BUSY) */
    CUevent start, end;  /* recorded before and after the work timed */
};

/* Takes the probe (BUSY) if its state is one of `from` (a mask of 1 << state; BROKEN counts
 * only where it broke in an earlier life of its context, forgets being the context's count
 * now): the state it was taken from, or PUMP_PROBE_BUSY when it was not taken. */
PUMP_HIDDEN uint32_t pump_probe_take(struct pump_timing_probe *p, uint32_t forgets, uint32_t from);
/* Under BUSY: lets go, in state `to`. */
PUMP_HIDDEN void pump_probe_let_go(struct pump_timing_probe *p, uint32_t to);
/* Under BUSY: the events, made in ctx once per life of the context (forgets); false where the
 * driver refused them (let go BROKEN then). */
PUMP_HIDDEN bool pump_probe_events(struct pump_timing_probe *p, CUcontext ctx, uint32_t forgets);
/* Under BUSY, a probe in flight: whether it is over; *ns is then the GPU's time for the work
 * (0: none given, or the context went since, its events with it). */
PUMP_HIDDEN bool pump_probe_read(struct pump_timing_probe *p, uint32_t forgets, uint64_t *ns);

#endif
