/* hooks_sync.c: synchronisations. After one returns, the host may read or
 * write memory the program allocated managed itself (migrating it back), so
 * pump's beliefs of that memory expire: its next launches prefetch it again.
 * Memory managed_all made managed keeps them: the program believes it is
 * device memory and never touches it from the host (residency.h). Where pump's
 * own budget is in force (managed memory can exceed the device), the device's
 * memory is read again (budget.h), and the kernels the GPU timed are reported
 * (kernel_time.h). The daemon hears of each.
 */
#include "budget.h"
#include "channel.h"
#include "hooks_common.h"
#include "kernel_time.h"
#include "managed_all_cache.h"
#include "residency.h"

/* stream: the synchronised stream's, or NULL for the calling thread's current context.
 * settled: what the synchronisation showed done, for the blocks pump keeps freed
 * (managed_all_cache.h; a block whose free has run may go back to the driver). */
#define PUMP_SYNC_HOOK(id, params, args, stream, settled) \
    CUresult pump_##id params                         \
    {                                                 \
        PUMP_REAL_OR_RETURN(id, real);                \
        CUresult r = real args;                       \
        uint32_t epoch = pump_epoch_synchronised();   \
        if (pump_active()) {                          \
            if (r == CUDA_SUCCESS) {                  \
                pump_budget_synchronised(stream);     \
                pump_kernel_time_synchronised();      \
                settled;                              \
            }                                         \
            pump_channel_sync(epoch);                 \
        }                                             \
        return r;                                     \
    }
#define PUMP_SETTLE_CONTEXT(ctx) pump_unpooled_synchronised((ctx), NULL, false, PUMP_REAL(mem_free))
#define PUMP_SETTLE_STREAM(s) pump_unpooled_synchronised(NULL, (s), true, PUMP_REAL(mem_free))
PUMP_SYNC_HOOK(ctx_synchronize, (void), (), NULL, PUMP_SETTLE_CONTEXT(NULL))
/* CUDA 13's form, with a context argument: what the CUDA 13 runtime asks for. */
PUMP_SYNC_HOOK(ctx_synchronize_v2, (CUcontext ctx), (ctx), NULL, PUMP_SETTLE_CONTEXT(ctx))
PUMP_SYNC_HOOK(stream_synchronize, (CUstream stream), (stream), stream, PUMP_SETTLE_STREAM(stream))
PUMP_SYNC_HOOK(stream_synchronize_ptsz, (CUstream stream), (stream), pump_stream_of(stream, true),
               PUMP_SETTLE_STREAM(pump_stream_of(stream, true)))
/* An event tells nothing of which frees ran. */
PUMP_SYNC_HOOK(event_synchronize, (CUevent event), (event), NULL, (void)0)
