/* hooks_context.c: contexts that go. cuCtxDestroy, cuDevicePrimaryCtxReset
 * (what cudaDeviceReset calls) and the last cuDevicePrimaryCtxRelease (which
 * "automatically resets" the primary context, cuda.h) destroy the context's
 * streams and events, pump's own among them; using them afterwards is
 * undefined behaviour on the driver. pump forgets what it made there
 * (prefetch.c), and makes it anew when the context is used again: the same
 * primary context keeps its handle across a reset.
 */
#include "hooks_common.h"
#include "prefetch.h"

CUresult pump_ctx_destroy(CUcontext ctx)
{
    PUMP_REAL_OR_RETURN(ctx_destroy, real);
    CUresult r = real(ctx);
    if (r == CUDA_SUCCESS && pump_active())
        pump_context_forget(ctx);
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
        CUresult r = real(dev);                                                          \
        if (r == CUDA_SUCCESS && ctx != NULL)                                            \
            pump_context_forget(ctx);                                                    \
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
        CUresult r = real(dev);                                                           \
        unsigned int flags;                                                               \
        int active = 1;                                                                   \
        if (r == CUDA_SUCCESS && ctx != NULL &&                                           \
            pump_driver.primary_ctx_get_state(dev, &flags, &active) == CUDA_SUCCESS && !active) \
            pump_context_forget(ctx);                                                     \
        return r;                                                                         \
    }
PUMP_RELEASE_HOOK(primary_ctx_release)
PUMP_RELEASE_HOOK(primary_ctx_release_v2)
