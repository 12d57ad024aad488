/* hooks_pool.c: the program's settings of a device's default memory pool, which
 * managed_all replaces by the device's managed pool for stream-ordered allocations
 * (managed_all.c): the release threshold it sets, and the trims it asks for
 * (PyTorch's torch.cuda.empty_cache under its cudaMallocAsync backend trims the
 * device's default pool to 0), reach the managed pool standing in too (and the blocks pump
 * keeps where the driver will not prefetch that pool's memory, managed_all_cache.h), so that
 * it keeps, and gives back, what the program's pool would have. And the pools memory
 * queries ask (pool_memory.h): one the program makes a device's current pool joins
 * them (what it keeps counts even after another is made current), one it destroys
 * leaves them. */
#include "hooks_common.h"
#include "managed_all.h"
#include "managed_all_cache.h"
#include "pool_memory.h"

CUresult pump_mem_pool_set_attribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value)
{
    PUMP_REAL_OR_RETURN(mem_pool_set_attribute, real);
    CUresult r = real(pool, attr, value);
    if (r == CUDA_SUCCESS && attr == CU_MEMPOOL_ATTR_RELEASE_THRESHOLD && pump_active())
        pump_managed_pool_follow(pool);
    return r;
}

/* The program's own trim answers; the managed pool's is best effort. */
CUresult pump_mem_pool_trim_to(CUmemoryPool pool, size_t min_bytes_to_keep)
{
    PUMP_REAL_OR_RETURN(mem_pool_trim_to, real);
    CUresult r = real(pool, min_bytes_to_keep);
    CUmemoryPool managed = r == CUDA_SUCCESS && pump_active() ? pump_managed_pool_standing_in(pool) : NULL;
    if (managed != NULL) {
        (void)real(managed, min_bytes_to_keep);
        pump_unpooled_trim(pool, min_bytes_to_keep, PUMP_REAL(mem_free));
    }
    return r;
}

CUresult pump_device_set_mem_pool(CUdevice device, CUmemoryPool pool)
{
    PUMP_REAL_OR_RETURN(device_set_mem_pool, real);
    CUresult r = real(device, pool);
    if (r == CUDA_SUCCESS && pump_active())
        pump_pool_memory_add((int)device, pool);
    return r;
}

CUresult pump_mem_pool_destroy(CUmemoryPool pool)
{
    PUMP_REAL_OR_RETURN(mem_pool_destroy, real);
    return pump_pool_memory_destroy(pool, real);
}
