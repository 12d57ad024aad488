/* pool_memory.h: what the process's memory pools keep on each device, under managed_all.
 *
 * A pool keeps the memory of its freed allocations, up to its release threshold (PyTorch's
 * cudaMallocAsync backend sets the device pool's to UINT64_MAX): device memory the process
 * holds beside its live allocations (device_memory.h counts those), so memory queries count it
 * as used (capacity.h). The pools asked: each device's current pool (cuMemAllocAsync's), those
 * the program made current (cuDeviceSetMemPool) and those it allocated device memory from by
 * name (cuMemAllocFromPoolAsync); a pool leaves when the program destroys it. Not the managed pool pump takes (managed_all.h): what it
 * keeps is managed memory, which the driver evicts rather than failing an allocation. */
#ifndef PUMP_POOL_MEMORY_H
#define PUMP_POOL_MEMORY_H

#include "shim.h"

/* Pools remembered per device; beyond, a new one is left out (logged once). */
#define PUMP_POOL_MEMORY_POOLS 8

/* Remembers that `pool` (NULL: none) handed out device memory on `device` (devices.h; -1:
 * none). No driver call: allocations made again and again cost a scan of the device's few. */
PUMP_HIDDEN void pump_pool_memory_add(int device, CUmemoryPool pool);
/* cuMemPoolDestroy through `destroy`, the pool forgotten if it succeeds; no memory query asks
 * a pool while it is being destroyed. */
PUMP_HIDDEN CUresult pump_pool_memory_destroy(CUmemoryPool pool, CUresult (*destroy)(CUmemoryPool));
/* Under managed_all, the bytes device's pools keep beyond their live allocations (reserved
 * less used), asked of the driver in relaxed capture mode: one cuDeviceGetMemPool and two
 * cuMemPoolGetAttribute for each pool. 0 otherwise, or where the driver cannot say. */
PUMP_HIDDEN uint64_t pump_pool_memory_kept(int device);

PUMP_HIDDEN void pump_pool_memory_before_fork(void);
PUMP_HIDDEN void pump_pool_memory_after_fork(void);

#endif
