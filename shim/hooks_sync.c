/* hooks_sync.c: synchronisations. After one returns, the host may read or
 * write managed memory (migrating it back), so pump's residency beliefs
 * expire: the next launches prefetch again.
 */
#include "hooks_common.h"

CUresult pump_ctx_synchronize(void)
{
    PUMP_REAL_OR_RETURN(ctx_synchronize, real);
    CUresult r = real();
    pump_epoch_advance();
    return r;
}

#define PUMP_STREAM_SYNC_HOOK(id)             \
    CUresult pump_##id(CUstream stream)       \
    {                                         \
        PUMP_REAL_OR_RETURN(id, real);        \
        CUresult r = real(stream);            \
        pump_epoch_advance();                 \
        return r;                             \
    }
PUMP_STREAM_SYNC_HOOK(stream_synchronize)
PUMP_STREAM_SYNC_HOOK(stream_synchronize_ptsz)

CUresult pump_event_synchronize(CUevent event)
{
    PUMP_REAL_OR_RETURN(event_synchronize, real);
    CUresult r = real(event);
    pump_epoch_advance();
    return r;
}
