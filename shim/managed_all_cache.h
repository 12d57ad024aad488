/* managed_all_cache.h: managed_all's stream-ordered allocations where the driver will not
 * prefetch a managed pool's memory: cuMemAllocManaged blocks, freed in stream order into a
 * cache that hands them out again as a pool would (see managed_all_cache.c). */
#ifndef PUMP_MANAGED_ALL_CACHE_H
#define PUMP_MANAGED_ALL_CACHE_H

#include "shim.h"

/* What is known of a device's managed pool: not asked yet, its memory prefetched, or refused
 * (stream-ordered allocations then come from cuMemAllocManaged). */
enum pump_pool_prefetch { PUMP_POOL_UNASKED, PUMP_POOL_PREFETCHED, PUMP_POOL_REFUSED };
PUMP_HIDDEN enum pump_pool_prefetch pump_pool_prefetch_of(int device);
/* The answer for `device` (the first one given stands), said once. */
PUMP_HIDDEN void pump_pool_prefetch_decided(int device, enum pump_pool_prefetch answer);

/* A kept block of exactly `size` bytes on `device`, usable on `stream` in stream order (the
 * stream made to wait, on the GPU, for the free that kept it): 0 when there is none. */
PUMP_HIDDEN CUdeviceptr pump_unpooled_take(size_t size, int device, CUstream stream);
/* Whether [ptr, ptr+size), freed on `stream`, was kept (false: the stream is being captured;
 * the caller hands the free to the driver). */
PUMP_HIDDEN bool pump_unpooled_keep(CUdeviceptr ptr, size_t size, int device, CUstream stream);
/* Whether ptr is a block the cache keeps (freed already: a second free is the program's
 * error). */
PUMP_HIDDEN bool pump_unpooled_holds(CUdeviceptr ptr);

typedef CUresult (*pump_unpooled_free_fn)(CUdeviceptr ptr);
/* A synchronisation returned: of `stream`, or of the whole context `ctx` (NULL: the calling
 * thread's current one) when stream_only is false. The blocks freed there are known done;
 * each device keeping more than its release threshold gives done blocks back with free_fn
 * (cuMemFree), oldest first. */
PUMP_HIDDEN void pump_unpooled_synchronised(CUcontext ctx, CUstream stream, bool stream_only,
                                            pump_unpooled_free_fn free_fn);
/* The program trimmed `program_pool`, a device's default pool whose managed pool pump stands
 * in with: the device keeps at most `keep` bytes of done blocks. */
PUMP_HIDDEN void pump_unpooled_trim(CUmemoryPool program_pool, size_t keep, pump_unpooled_free_fn free_fn);
/* The context went (destroyed or reset), its memory with it: its kept blocks are forgotten. */
PUMP_HIDDEN void pump_unpooled_forget_context(CUcontext ctx);

#endif
