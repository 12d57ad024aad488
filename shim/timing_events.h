/* timing_events.h: a pair of timing events bracketing work on a stream, as pump's probes use
 * them (link_rate.c: one of pump's prefetches; kernel_time.c: a program's kernel): made in
 * the work's context, read later without waiting. */
#ifndef PUMP_TIMING_EVENTS_H
#define PUMP_TIMING_EVENTS_H

#include "shim.h"

/* Makes *start and *end (timing on) in ctx: false when the driver refused. */
PUMP_HIDDEN bool pump_timing_events_make(CUcontext ctx, CUevent *start, CUevent *end);
/* Whether what was recorded between start and end is over: *ns is then the GPU's time for it
 * (0 when the driver gave none); false, and *ns untouched, while it runs. */
PUMP_HIDDEN bool pump_timing_events_read(CUevent start, CUevent end, uint64_t *ns);

#endif
