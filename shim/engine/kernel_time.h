/* kernel_time.h: the GPU times a few launches of each launch key, and pumpd hears how long
 * each kernel ran (a KERNEL record). Its plans place transfers on the kernels' own clock: the
 * launching thread runs ahead of the GPU (up to the driver's queue) and, after a pause, at
 * the host's pace, so the intervals between launch calls are not kernel times. */
#ifndef PUMP_KERNEL_TIME_H
#define PUMP_KERNEL_TIME_H

#include "timing_events.h"

#define PUMP_KERNEL_PROBES 64  /* launches of one context timed at once */

/* One context's probes: two timing events each and the launch key they time. Zeroed with
 * the context's slot (prefetch_context.h); a probe whose context went is dropped. */
struct pump_kernel_probes {
    struct pump_timing_probe probe[PUMP_KERNEL_PROBES];
    uint64_t key[PUMP_KERNEL_PROBES];      /* the timed launch's key (under BUSY) */
    uint32_t in_flight;                    /* atomic: probes recorded and not yet read */
    uint64_t next_look_ns;                 /* atomic: not looked at before this */
};

struct pump_context;

/* Whether a launch with this key is due to be timed: its key's first
 * PUMP_KERNEL_FIRST_SAMPLES, then one a PUMP_KERNEL_KEY_INTERVAL_NS (pump_channel.h). No
 * driver call. */
PUMP_HIDDEN bool pump_kernel_due(uint64_t key);
/* Just before a launch on `stream` (capturing: -1 not asked yet, else whether it is being
 * captured; asked here if need be): records a probe's start there. Returns the probe + 1
 * for pump_kernel_time_end, 0 when none was taken (capture, all busy, events refused). */
PUMP_HIDDEN int pump_kernel_time_begin(struct pump_context *c, CUstream stream, uint64_t key, int *capturing);
/* Just after the launch (launched: the driver took it): the probe's end recorded. */
PUMP_HIDDEN void pump_kernel_time_end(struct pump_context *c, int probe, CUstream stream, bool launched);
/* At a launch: reports c's probes that have finished, looking at most every
 * PUMP_KERNEL_LOOK_NS; never waits for one. */
PUMP_HIDDEN void pump_kernel_time_poll(struct pump_context *c);
/* After a synchronisation returned: every context's finished probes reported now (a step's
 * last launches are heard before pumpd reads the step). */
PUMP_HIDDEN void pump_kernel_time_synchronised(void);

#endif
