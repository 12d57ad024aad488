/* link_rate.h: the GPU times one of pump's prefetches now and then, and pumpd hears
 * how many bytes took how long (a LINK record): its plans leave room for transfers at
 * the rate the link gives pump's prefetches, which no constant knows (PCIe generation
 * and width, the host's memory, other traffic) and NVML's counters only sample. */
#ifndef PUMP_LINK_RATE_H
#define PUMP_LINK_RATE_H

#include "timing_events.h"

/* One context's probe: two timing events (recorded before and after the timed prefetch) and
 * what they measure. Zeroed with the context's slot (prefetch_context.h); its events go with
 * the context. */
struct pump_link_probe {
    struct pump_timing_probe probe;
    uint64_t bytes;      /* the timed prefetch's */
    uint64_t armed_ns;   /* when the last was armed (under BUSY) */
    uint32_t armed;      /* probes armed so far (under BUSY) */
    uint64_t next_ns;    /* atomic: not looked at before this (pump_channel_now_ns) */
};

/* Before a prefetch of `bytes` to `device` on `stream` (of context ctx, whose forgets count
 * is `forgets`): reports a probe that has finished, and times this prefetch if none is in
 * flight and the next is due (link_rate.c says when). True: the caller calls
 * pump_link_probe_end after its prefetch call. No lock is held across a driver call. */
PUMP_HIDDEN bool pump_link_probe_begin(struct pump_link_probe *p, CUcontext ctx, uint32_t forgets, CUstream stream,
                                       int device, uint64_t bytes);
/* After the prefetch begun with a probe: its end is recorded (ok: the driver took it). */
PUMP_HIDDEN void pump_link_probe_end(struct pump_link_probe *p, CUstream stream, bool ok);

#endif
