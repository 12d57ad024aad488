/* hooks_common.h: the preamble every hook starts with. */
#ifndef PUMP_HOOKS_COMMON_H
#define PUMP_HOOKS_COMMON_H

#include "hooks.h"

/* Declares `real`, the driver's function behind hook `id`, or returns the
 * error the driver-less program would see. */
#define PUMP_REAL_OR_RETURN(id, real)                                       \
    pump_pfn_##id real = pump_driver_ready() ? PUMP_REAL(id) : NULL;        \
    if (PUMP_UNLIKELY(real == NULL))                                        \
        return pump_missing_entry()

static inline bool pump_active(void)
{
    return !atomic_load_explicit(&pump_passthrough, memory_order_relaxed);
}

/* In a _ptsz entry point the NULL stream is the per-thread default stream;
 * pump's own calls use the legacy ABI, so name that stream explicitly. */
static inline CUstream pump_stream_of(CUstream stream, bool per_thread)
{
    return (per_thread && stream == NULL) ? CU_STREAM_PER_THREAD : stream;
}

#endif
