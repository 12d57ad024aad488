/* hooks_sync.c: synchronisations. After one returns, the host may read or
 * write memory the program allocated managed itself (migrating it back), so
 * pump's beliefs of that memory expire: its next launches prefetch it again.
 * Memory managed_all made managed keeps them: the program believes it is
 * device memory and never touches it from the host (residency.h). The daemon
 * hears of each.
 */
#include "channel.h"
#include "hooks_common.h"
#include "residency.h"

#define PUMP_SYNC_HOOK(id, params, args)              \
    CUresult pump_##id params                         \
    {                                                 \
        PUMP_REAL_OR_RETURN(id, real);                \
        CUresult r = real args;                       \
        uint32_t epoch = pump_epoch_synchronised();   \
        if (pump_active())                            \
            pump_channel_sync(epoch);                 \
        return r;                                     \
    }
PUMP_SYNC_HOOK(ctx_synchronize, (void), ())
/* CUDA 13's form, with a context argument: what the CUDA 13 runtime asks for. */
PUMP_SYNC_HOOK(ctx_synchronize_v2, (CUcontext ctx), (ctx))
PUMP_SYNC_HOOK(stream_synchronize, (CUstream stream), (stream))
PUMP_SYNC_HOOK(stream_synchronize_ptsz, (CUstream stream), (stream))
PUMP_SYNC_HOOK(event_synchronize, (CUevent event), (event))
