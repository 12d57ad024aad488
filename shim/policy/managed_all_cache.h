/* managed_all_cache.h: stream-ordered managed memory pump keeps once freed (see
 * managed_all_cache.c): managed_all's cuMemAllocManaged blocks where the driver will not
 * prefetch a managed pool's memory, and the blocks pump's allocator for PyTorch places. */
#ifndef PUMP_MANAGED_ALL_CACHE_H
#define PUMP_MANAGED_ALL_CACHE_H

#include "placement.h"
#include "shim.h"

/* What is known of a device's managed pool: not asked yet, its memory prefetched, or refused
 * (stream-ordered allocations then come from cuMemAllocManaged). */
enum pump_pool_prefetch { PUMP_POOL_UNASKED, PUMP_POOL_PREFETCHED, PUMP_POOL_REFUSED };
/* The answer for `device`. PREFETCHED turns to REFUSED, once, said with what pump does now, when
 * the driver has since refused to prefetch some of the pool's memory (pump_pool_refusal_of):
 * the pool's blocks kept here are then neither handed out again nor kept at their frees. */
PUMP_HIDDEN enum pump_pool_prefetch pump_pool_prefetch_of(int device);
/* The probe's answer for `device` (the first one given stands), said once. */
PUMP_HIDDEN void pump_pool_prefetch_decided(int device, enum pump_pool_prefetch answer);

/* A kept block of exactly `size` bytes on `device`, usable on `stream` in stream order (the
 * stream made to wait, on the GPU, for the free that kept it): 0 when there is none. `place`
 * (NULL: managed_all's own allocations, which take cuMemAllocManaged's blocks only): the block
 * it prefers where that one is kept, else any other it does not reserve for a later allocation
 * (placement.h), a pool's included while the driver prefetches that pool's memory; *pooled says
 * which kind was taken. */
PUMP_HIDDEN CUdeviceptr pump_kept_take(size_t size, int device, CUstream stream, const struct pump_place *place,
                                       bool *pooled);
/* Whether [ptr, ptr+size), freed on `stream`, was kept (false: the stream is being captured, or
 * no memory; the caller hands the free to the driver). pooled: a managed pool's block. */
PUMP_HIDDEN bool pump_kept_keep(CUdeviceptr ptr, size_t size, int device, CUstream stream, bool pooled);
/* The block at ptr, kept (a no-op where it is not), holds a dead tensor whose whole 2 MiB blocks
 * pump may discard once the GPU has passed its free (its use token): nothing of the program's
 * touches it until pump hands it out again (torch_allocator.c). */
PUMP_HIDDEN void pump_kept_dead(CUdeviceptr ptr);
/* A dead block claimed for its discard: neither handed out, nor given back, until settled. */
struct pump_kept_claim {
    CUdeviceptr ptr;
    uint64_t token;   /* the free's point on its stream */
    CUstream stream;  /* freed on */
};
/* Claims `device`'s oldest dead block not claimed yet (false: none). */
PUMP_HIDDEN bool pump_kept_dead_claim(int device, struct pump_kept_claim *claim);
/* The claim ends: the block is dead still (`again`: to claim later) or not any more; `mark`
 * (0: none) names its discard, which whoever takes the block or gives it back waits for. */
PUMP_HIDDEN void pump_kept_dead_settle(const struct pump_kept_claim *claim, bool again, uint64_t mark);
/* Whether ptr is a block the cache keeps (freed already: a second free is the program's
 * error). */
PUMP_HIDDEN bool pump_unpooled_holds(CUdeviceptr ptr);
/* `stream` is being destroyed: blocks it freed wait for their free on every stream from now on. */
PUMP_HIDDEN void pump_kept_stream_gone(CUstream stream);

typedef CUresult (*pump_unpooled_free_fn)(CUdeviceptr ptr);
typedef CUresult (*pump_kept_free_async_fn)(CUdeviceptr ptr, CUstream stream);
/* `steps` steps are marked: the pools' blocks kept for placement and not taken since a few
 * steps, and those of pools whose memory is refused now, go back to their pools (free_fn where
 * their free ran, else free_async_fn on their stream). */
PUMP_HIDDEN void pump_kept_release_unplaced(uint64_t steps, pump_unpooled_free_fn free_fn,
                                            pump_kept_free_async_fn free_async_fn);
/* A synchronisation returned: of `stream`, or of the whole context `ctx` (NULL: the calling
 * thread's current one) when stream_only is false. The blocks freed there are known done;
 * done blocks of pools whose memory is refused now, and each device's keeping more than its
 * release threshold, oldest first, are given back with free_fn (cuMemFree). */
PUMP_HIDDEN void pump_unpooled_synchronised(CUcontext ctx, CUstream stream, bool stream_only,
                                            pump_unpooled_free_fn free_fn);
/* The program trimmed `program_pool`, a device's default pool whose managed pool pump stands
 * in with: the device keeps at most `keep` bytes of done blocks. */
PUMP_HIDDEN void pump_unpooled_trim(CUmemoryPool program_pool, size_t keep, pump_unpooled_free_fn free_fn);
/* The context went (destroyed or reset), its memory with it: its kept blocks are forgotten. */
PUMP_HIDDEN void pump_unpooled_forget_context(CUcontext ctx);

#endif
