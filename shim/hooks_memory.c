/* hooks_memory.c: allocations and frees. Managed allocations enter the range
 * table (and count against the capacity cap); frees leave it. Plain device
 * allocations are forwarded untouched, except that memory the driver hands
 * out can never still be a managed allocation: any stale entry there (a free
 * pump did not see) is dropped.
 */
#include "capacity.h"
#include "channel.h"
#include "hooks_common.h"
#include "residency.h"

/* Memory the driver just handed out: whatever pump listed there is stale. */
static void forget_stale(CUdeviceptr base, size_t size)
{
    uint64_t stale = pump_ranges_drop(base, size);
    if (stale > 0)
        pump_capacity_release(stale);
}

/* False when the table is full: the allocation then stays invisible to pump
 * (no prefetch, and outside the capacity count, since no free would see it). */
static bool track_managed(CUdeviceptr base, size_t size, unsigned int flags)
{
    forget_stale(base, size);
    struct pump_range *range = pump_ranges_insert(base, size, flags);
    if (range == NULL)
        return false;
    pump_residency_attach(range);
    PUMP_COUNT(managed_allocs, 1);
    pump_channel_alloc(range, base, size, flags);
    return true;
}

static void untrack(CUdeviceptr base)
{
    uint64_t size;
    if (pump_ranges_remove(base, &size)) {
        pump_capacity_release(size);
        PUMP_COUNT(managed_frees, 1);
        pump_channel_free(base, size);
    }
}

CUresult pump_mem_alloc_managed(CUdeviceptr *dptr, size_t bytesize, unsigned int flags)
{
    PUMP_REAL_OR_RETURN(mem_alloc_managed, real);
    if (!pump_active() || dptr == NULL || bytesize == 0)
        return real(dptr, bytesize, flags);  /* the driver's own answer, errors included */
    if (!pump_capacity_reserve(bytesize))
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult r = real(dptr, bytesize, flags);
    if (r != CUDA_SUCCESS || !track_managed(*dptr, bytesize, flags))
        pump_capacity_release(bytesize);
    return r;
}

/* Device memory from the driver; stream-ordered memory is managed when its
 * pool is (CUDA 13 managed pools), which only the pointer itself can tell. */
static void after_device_alloc(CUresult r, const CUdeviceptr *dptr, size_t bytesize, bool may_be_managed)
{
    if (r != CUDA_SUCCESS || !pump_active())
        return;
    unsigned int managed = 0;
    if (may_be_managed && pump_driver.pointer_get_attribute != NULL &&
        pump_driver.pointer_get_attribute(&managed, CU_POINTER_ATTRIBUTE_IS_MANAGED, *dptr) == CUDA_SUCCESS &&
        managed) {
        if (track_managed(*dptr, bytesize, 0))
            pump_capacity_add(bytesize);
    } else {
        forget_stale(*dptr, bytesize);
    }
}

CUresult pump_mem_alloc(CUdeviceptr *dptr, size_t bytesize)
{
    PUMP_REAL_OR_RETURN(mem_alloc, real);
    CUresult r = real(dptr, bytesize);
    after_device_alloc(r, dptr, bytesize, false);
    return r;
}

#define PUMP_ALLOC_ASYNC_HOOK(id)                                          \
    CUresult pump_##id(CUdeviceptr *dptr, size_t bytesize, CUstream stream) \
    {                                                                      \
        PUMP_REAL_OR_RETURN(id, real);                                     \
        CUresult r = real(dptr, bytesize, stream);                         \
        after_device_alloc(r, dptr, bytesize, true);                       \
        return r;                                                          \
    }
PUMP_ALLOC_ASYNC_HOOK(mem_alloc_async)
PUMP_ALLOC_ASYNC_HOOK(mem_alloc_async_ptsz)

#define PUMP_ALLOC_FROM_POOL_HOOK(id)                                                           \
    CUresult pump_##id(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream stream)  \
    {                                                                                           \
        PUMP_REAL_OR_RETURN(id, real);                                                          \
        CUresult r = real(dptr, bytesize, pool, stream);                                        \
        after_device_alloc(r, dptr, bytesize, true);                                            \
        return r;                                                                               \
    }
PUMP_ALLOC_FROM_POOL_HOOK(mem_alloc_from_pool_async)
PUMP_ALLOC_FROM_POOL_HOOK(mem_alloc_from_pool_async_ptsz)

CUresult pump_mem_free(CUdeviceptr dptr)
{
    PUMP_REAL_OR_RETURN(mem_free, real);
    CUresult r = real(dptr);
    if (r == CUDA_SUCCESS && pump_active())
        untrack(dptr);
    return r;
}

/* Stream-ordered: the memory dies in stream order, but no later launch may
 * name it, so it leaves the table now. */
#define PUMP_FREE_ASYNC_HOOK(id)                        \
    CUresult pump_##id(CUdeviceptr dptr, CUstream stream) \
    {                                                   \
        PUMP_REAL_OR_RETURN(id, real);                  \
        CUresult r = real(dptr, stream);                \
        if (r == CUDA_SUCCESS && pump_active())         \
            untrack(dptr);                              \
        return r;                                       \
    }
PUMP_FREE_ASYNC_HOOK(mem_free_async)
PUMP_FREE_ASYNC_HOOK(mem_free_async_ptsz)
