/* hooks_context.c: the entry points that change which context a launch stream belongs to,
 * hooked only so that pump forgets what it remembered of them (context_cache.h): a thread's
 * current context set, pushed, popped, or made by a context's creation; a stream, a context
 * or a primary context destroyed (its handle may then name another). */
#include "context_cache.h"
#include "hooks_common.h"

#define PUMP_CONTEXT_CHANGE_HOOK(id, params, args) \
    CUresult pump_##id params                      \
    {                                              \
        PUMP_REAL_OR_RETURN(id, real);             \
        pump_context_change_begin();               \
        CUresult r = real args;                    \
        pump_context_change_end();                 \
        return r;                                  \
    }
PUMP_CONTEXT_CHANGE_HOOK(stream_destroy, (CUstream stream), (stream))
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
PUMP_CONTEXT_CHANGE_HOOK(ctx_destroy, (CUcontext ctx), (ctx))
PUMP_CONTEXT_CHANGE_HOOK(primary_ctx_release, (CUdevice device), (device))
PUMP_CONTEXT_CHANGE_HOOK(primary_ctx_reset, (CUdevice device), (device))
