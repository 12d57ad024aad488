/* context_cache.c: launch streams' contexts, remembered per thread (see context_cache.h).
 *
 * An answer is kept with the generation it was asked in and holds while the generation has
 * not moved. A change ends by moving it; while one is under way (`changing`), nothing is
 * remembered, so an answer asked before a stream's destruction returned is never kept for
 * the stream that reuses its handle afterwards.
 */
#include "context_cache.h"

#define CACHED_STREAMS 8 /* per thread: a job launches on a few streams */

static _Atomic uint64_t generation = 1;
static _Atomic uint32_t changing;

struct cached {
    CUstream stream;
    CUcontext ctx;
    uint64_t generation;  /* 0: empty */
};

static _Thread_local struct cached cached[CACHED_STREAMS] __attribute__((tls_model("initial-exec")));

static CUcontext ask_driver(CUstream stream)
{
    CUcontext ctx = NULL;
    if (pump_driver.stream_get_ctx == NULL || pump_driver.stream_get_ctx(stream, &ctx) != CUDA_SUCCESS)
        ctx = NULL;  /* a driver before 9.2: the current context */
    if (ctx == NULL && pump_driver.ctx_get_current(&ctx) != CUDA_SUCCESS)
        ctx = NULL;
    return ctx;
}

PUMP_HIDDEN CUcontext pump_stream_context(CUstream stream)
{
    uintptr_t key = (uintptr_t)stream;
    struct cached *entry = &cached[(key ^ key >> 6) % CACHED_STREAMS];  /* handles are aligned pointers */
    uint64_t now = atomic_load_explicit(&generation, memory_order_acquire);
    bool stable = atomic_load_explicit(&changing, memory_order_acquire) == 0;
    if (PUMP_LIKELY(stable && entry->generation == now && entry->stream == stream))
        return entry->ctx;
    CUcontext ctx = ask_driver(stream);
    if (ctx != NULL && stable)
        *entry = (struct cached){stream, ctx, now};
    return ctx;
}

PUMP_HIDDEN void pump_context_change_begin(void)
{
    atomic_fetch_add_explicit(&changing, 1, memory_order_acq_rel);
}

PUMP_HIDDEN void pump_context_change_end(void)
{
    atomic_fetch_add_explicit(&generation, 1, memory_order_acq_rel);
    atomic_fetch_sub_explicit(&changing, 1, memory_order_acq_rel);
}
