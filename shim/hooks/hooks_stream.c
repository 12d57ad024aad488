/* hooks_stream.c: stream destruction. pump's allocator for PyTorch orders each free after
 * the streams pump saw launches on (stream_users.c); a destroyed stream is forgotten before
 * the driver destroys it, so that pump never names a dead handle to the driver; and its
 * handle may then name a stream of another context (context_cache.h), or a new stream that
 * must not take the blocks the old one freed without waiting for their frees
 * (managed_all_cache.h), nor wait for a discard of what the old one freed (passed_discards.h). */
#include "context_cache.h"
#include "hooks_common.h"
#include "managed_all_cache.h"
#include "passed_discards.h"
#include "stream_users.h"

CUresult pump_stream_destroy(CUstream stream)
{
    PUMP_REAL_OR_RETURN(stream_destroy, real);
    if (pump_active()) {
        pump_stream_users_forget(stream);
        pump_kept_stream_gone(stream);
        pump_passed_discards_forget(stream);
    }
    pump_context_change_begin();
    CUresult r = real(stream);
    pump_context_change_end();
    return r;
}
