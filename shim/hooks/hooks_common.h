/* hooks_common.h: the preamble every hook starts with. */
#ifndef PUMP_HOOKS_COMMON_H
#define PUMP_HOOKS_COMMON_H

#include "hooks.h"

/* How many of pump's hooks this thread is inside. A driver or a stacked
 * interposer that calls back into an exported name from within a hook (a
 * libcuda linked without -Bsymbolic, another LD_PRELOAD shim) enters a second
 * hook: that one does no work of pump's (pump_active() is false there) and so
 * takes none of its locks again; it only forwards to the driver. */
extern PUMP_HIDDEN _Thread_local unsigned int pump_hook_depth
    __attribute__((tls_model("initial-exec"))); /* preloaded: static TLS, no call per access */

static inline void pump_hook_leave(const bool *entered)
{
    (void)entered;
    pump_hook_depth--;
}

/* Declares `real`, the driver's function behind hook `id`, or returns the
 * error the driver-less program would see; then counts the hook as entered
 * until it returns. */
#define PUMP_REAL_OR_RETURN(id, real)                                       \
    pump_pfn_##id real = pump_driver_ready() ? PUMP_REAL(id) : NULL;        \
    if (PUMP_UNLIKELY(real == NULL))                                        \
        return pump_missing_entry();                                        \
    __attribute__((cleanup(pump_hook_leave), unused)) const bool pump_hook_entered = (pump_hook_depth++, true)

/* Whether pump does its work here: not in pass-through, not re-entered. */
static inline bool pump_active(void)
{
    return !atomic_load_explicit(&pump_passthrough, memory_order_relaxed) && pump_hook_depth <= 1;
}

/* At every kernel launch: the first registers pump's exit handler again, so that it runs before
 * the CUDA runtime's teardown (lifecycle.c). */
PUMP_HIDDEN void pump_lifecycle_launched(void);

/* In a _ptsz entry point the NULL stream is the per-thread default stream;
 * pump's own calls use the legacy ABI, so name that stream explicitly. */
static inline CUstream pump_stream_of(CUstream stream, bool per_thread)
{
    return (per_thread && stream == NULL) ? CU_STREAM_PER_THREAD : stream;
}

#endif
