/* prefetch.h: the prefetch engine, PUMP's rule at launch time. */
#ifndef PUMP_PREFETCH_H
#define PUMP_PREFETCH_H

#include "scan.h"

/* Before a launch on `stream` in the calling thread's current context:
 * enqueues the prefetch of every found allocation not believed resident on
 * a prefetch stream of that context's device (as far as the budget allows),
 * records an event, and makes `stream` wait on it (on the GPU). Never waits
 * on the CPU. Returns the device prefetched to, or -1 if unknown. */
PUMP_HIDDEN int pump_prefetch_for_launch(CUstream stream, const struct pump_scan *scan);

#endif
