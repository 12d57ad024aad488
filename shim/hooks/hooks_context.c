/* hooks_context.c: contexts that go, and what changes the context a launch's stream
 * belongs to.
 * - cuCtxDestroy, cuDevicePrimaryCtxReset (what cudaDeviceReset calls) and the last
 *   cuDevicePrimaryCtxRelease (which "automatically resets" the primary context, cuda.h)
 *   destroy the context's streams and events, pump's own among them; using them afterwards
 *   is undefined behaviour on the driver. Before the real call pump's workers are left
 *   with no job under way or queued (prefetch_worker.h: those queued are made then, while
 *   the context is there); after it pump forgets what it made there (prefetch.c), the
 *   freed blocks it kept there (managed_all_cache.c: the context's memory went) and, with
 *   its device's last context, the allocations it knew there, and makes it anew when the
 *   context is used again: the same primary context keeps its handle across a reset.
 * - Those, and a thread's current context set, pushed, popped or made by a context's
 *   creation, change which context a stream handle names: pump forgets the answers it
 *   remembered (context_cache.h) around each. */
#include "capacity.h"
#include "context_cache.h"
#include "device_memory.h"
#include "hooks_common.h"
#include "managed_all_cache.h"
#include "prefetch.h"
#include "prefetch_worker.h"
#include "ranges.h"

#define PUMP_CONTEXT_CHANGE_HOOK(id, params, args) \
    CUresult pump_##id params                      \
    {                                              \
        PUMP_REAL_OR_RETURN(id, real);             \
        pump_context_change_begin();               \
        CUresult r = real args;                    \
        pump_context_change_end();                 \
        return r;                                  \
    }
PUMP_CONTEXT_CHANGE_HOOK(ctx_set_current, (CUcontext ctx), (ctx))
PUMP_CONTEXT_CHANGE_HOOK(ctx_push_current, (CUcontext ctx), (ctx))
PUMP_CONTEXT_CHANGE_HOOK(ctx_pop_current, (CUcontext * ctx), (ctx))
PUMP_CONTEXT_CHANGE_HOOK(ctx_create, (CUcontext * ctx, unsigned int flags, CUdevice device), (ctx, flags, device))
PUMP_CONTEXT_CHANGE_HOOK(ctx_create_v3,
                         (CUcontext * ctx, CUexecAffinityParam *params, int count, unsigned int flags,
                          CUdevice device),
                         (ctx, params, count, flags, device))
PUMP_CONTEXT_CHANGE_HOOK(ctx_create_v4,
                         (CUcontext * ctx, CUctxCreateParams *params, unsigned int flags, CUdevice device),
                         (ctx, params, flags, device))

/* The context went, and pump's streams, events and kept blocks there with it; where it was the
 * last of pump's contexts on its device (device: -1 where unknown), the device's allocations
 * too: a context's destruction frees them, and a program need not free them first (kept, they
 * would count against the capacity for good, and a later allocation be refused). */
static void context_gone(CUcontext ctx, int device)
{
    pump_context_forget(ctx);
    pump_unpooled_forget_context(ctx);
    if (device >= 0 && !pump_context_live_on(device)) {
        pump_ranges_drop_device(device, pump_capacity_release);
        pump_device_memory_drop_device(device);
    }
}

CUresult pump_ctx_destroy(CUcontext ctx)
{
    PUMP_REAL_OR_RETURN(ctx_destroy, real);
    int device = -1;
    if (pump_active()) {
        pump_worker_quiesce();
        device = pump_context_device_of(ctx);
    }
    pump_context_change_begin();
    CUresult r = real(ctx);
    if (r == CUDA_SUCCESS && pump_active())
        context_gone(ctx, device);
    pump_context_change_end();
    return r;
}

/* The device's primary context while it is active, else NULL. Retaining an
 * active primary context creates nothing, and the release after it leaves its
 * count as it was. */
static CUcontext active_primary(CUdevice dev, PFN_cuDevicePrimaryCtxRelease_v11000 release)
{
    unsigned int flags;
    int active = 0;
    CUcontext ctx = NULL;
    if (release == NULL || pump_driver.primary_ctx_get_state == NULL || pump_driver.primary_ctx_retain == NULL ||
        pump_driver.primary_ctx_get_state(dev, &flags, &active) != CUDA_SUCCESS || !active ||
        pump_driver.primary_ctx_retain(&ctx, dev) != CUDA_SUCCESS)
        return NULL;
    release(dev);
    return ctx;
}

#define PUMP_RESET_HOOK(id)                                                              \
    CUresult pump_##id(CUdevice dev)                                                     \
    {                                                                                    \
        PUMP_REAL_OR_RETURN(id, real);                                                   \
        PFN_cuDevicePrimaryCtxRelease_v11000 release = PUMP_REAL(primary_ctx_release_v2); \
        if (release == NULL)                                                             \
            release = PUMP_REAL(primary_ctx_release);                                    \
        CUcontext ctx = pump_active() ? active_primary(dev, release) : NULL;             \
        if (ctx != NULL)                                                                 \
            pump_worker_quiesce();                                                       \
        pump_context_change_begin();                                                     \
        CUresult r = real(dev);                                                          \
        if (r == CUDA_SUCCESS && ctx != NULL)                                            \
            context_gone(ctx, (int)dev);                                                 \
        pump_context_change_end();                                                       \
        return r;                                                                        \
    }
PUMP_RESET_HOOK(primary_ctx_reset)
PUMP_RESET_HOOK(primary_ctx_reset_v2)

/* Forgets the context when this release was its last (it is no longer active). */
#define PUMP_RELEASE_HOOK(id)                                                             \
    CUresult pump_##id(CUdevice dev)                                                      \
    {                                                                                     \
        PUMP_REAL_OR_RETURN(id, real);                                                    \
        CUcontext ctx = pump_active() ? active_primary(dev, real) : NULL;                 \
        if (ctx != NULL) /* perhaps its last release: it is not known before */           \
            pump_worker_quiesce();                                                        \
        pump_context_change_begin();                                                      \
        CUresult r = real(dev);                                                           \
        unsigned int flags;                                                               \
        int active = 1;                                                                   \
        if (r == CUDA_SUCCESS && ctx != NULL &&                                           \
            pump_driver.primary_ctx_get_state(dev, &flags, &active) == CUDA_SUCCESS && !active) \
            context_gone(ctx, (int)dev);                                                  \
        pump_context_change_end();                                                        \
        return r;                                                                         \
    }
PUMP_RELEASE_HOOK(primary_ctx_release)
PUMP_RELEASE_HOOK(primary_ctx_release_v2)
