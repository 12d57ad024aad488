/* managed_all.h: whether the program's device allocations become managed
 * memory (PUMP_MANAGED_ALL), and the managed pool a stream-ordered allocation
 * comes from instead. The hooks that convert are in hooks_memory.c. */
#ifndef PUMP_MANAGED_ALL_H
#define PUMP_MANAGED_ALL_H

#include "shim.h"

/* True when PUMP_MANAGED_ALL=1 and every visible device has concurrent
 * managed access; decided once, at the first call after cuInit. */
PUMP_HIDDEN bool pump_managed_all(void);

/* Whether a device allocation whose hook returns to `caller` (the hook's
 * __builtin_return_address(0)) becomes managed: pump_managed_all(), except
 * for memory of a library that shares its buffers with other processes by
 * IPC handle (NCCL, MPI, NVSHMEM, UCX), which managed memory does not have. */
PUMP_HIDDEN bool pump_managed_all_for(const void *caller);

/* The managed pool an allocation on `stream` (legacy-ABI handle, see
 * pump_stream_of) should come from, or NULL to leave the allocation as the
 * program asked: the stream is being captured, the program made another pool
 * its device's current one, or the driver has no managed pools. With a pool,
 * *device is the stream's device (its ordinal). */
PUMP_HIDDEN CUmemoryPool pump_managed_pool_for(CUstream stream, int *device);

/* The program set the release threshold of `program_pool`: if it is a device's
 * default pool whose managed pool pump uses instead, that one takes it too. */
PUMP_HIDDEN void pump_managed_pool_follow(CUmemoryPool program_pool);

/* The managed pool pump uses in place of `program_pool` (a device's default
 * pool), or NULL. */
PUMP_HIDDEN CUmemoryPool pump_managed_pool_standing_in(CUmemoryPool program_pool);
/* The device whose default pool `program_pool` is, where pump stands in for it, or -1. */
PUMP_HIDDEN int pump_managed_pool_device(CUmemoryPool program_pool);
/* The release threshold the program set on the device's default pool, as last followed (0:
 * the driver's default, or never followed). */
PUMP_HIDDEN uint64_t pump_managed_pool_threshold(int device);

#endif
