/* hooks_memory.c: allocations and frees. Managed allocations enter the range
 * table (and count against the capacity cap); frees leave it (a segment a
 * framework carved into tensors, torch_trace.c, with whatever is left in it).
 *
 * Under managed_all (managed_all.h) the program's device allocations become
 * managed memory within the same cap: cuMemAlloc becomes cuMemAllocManaged,
 * cuMemAllocAsync takes from the stream device's managed pool in the same
 * stream order (or, where the driver will not prefetch that pool's memory, or
 * stops prefetching it, from cuMemAllocManaged, freed in stream order:
 * managed_all_cache.h), and
 * cuMemGetInfo reports the device's capacity, less what the process holds
 * there (device_memory.h counts the device memory pump lets through). What
 * cannot be made managed is left alone with one notice: cuMemCreate's memory, and IPC handles
 * (managed memory has none); what communication libraries allocate to share
 * by IPC handle stays device memory (managed_all.h). cuMemAllocPitch stays device memory (rare outside
 * textures; the driver's pitch rule is not something pump can ask for).
 *
 * Device allocations otherwise pass untouched, except that memory the driver
 * hands out can never still be a managed allocation: any stale entry there (a
 * free pump did not see) is dropped.
 */
#include "capacity.h"
#include "capture_mode.h"
#include "channel.h"
#include "context_cache.h"
#include "device_memory.h"
#include "devices.h"
#include "hooks_common.h"
#include "hooks_memory.h"
#include "managed_all.h"
#include "managed_all_cache.h"
#include "pool_memory.h"
#include "residency.h"

/* Memory the driver just handed out: whatever pump listed there is stale. */
static void forget_stale(CUdeviceptr base, size_t size)
{
    pump_ranges_drop(base, size, pump_capacity_release);
    pump_device_memory_remove(base);
}

/* Device memory pump let through, from `pool` (NULL: none, or the device's current pool): under
 * managed_all, memory queries count it (device_memory.h) and what the pool keeps (pool_memory.h). */
static void count_device_memory(CUdeviceptr base, size_t size, CUmemoryPool pool)
{
    forget_stale(base, size);
    if (!pump_managed_all())
        return;
    int device = pump_memory_device(base);
    pump_device_memory_add(base, size, device);
    pump_pool_memory_add(device, pool);
}

/* False when the table is full: the allocation then stays invisible to pump
 * (no prefetch, and outside the capacity count, since no free would see it).
 * host_touchable: the program made it managed itself (ranges.h). */
static bool track_managed(CUdeviceptr base, size_t size, unsigned int flags, bool host_touchable, int device)
{
    forget_stale(base, size);
    struct pump_range *range = pump_ranges_insert(base, size, flags, host_touchable, device);
    if (range == NULL)
        return false;
    pump_residency_attach(range);
    PUMP_COUNT(managed_allocs, 1);
    pump_channel_alloc(range, base, size, flags);
    return true;
}

/* A live tensor at base, of a segment carved there (a block pump's allocator for PyTorch kept and
 * handed out again: revive, below), ends as its retire would have ended it, its free said: the
 * segment's removal says none of the tensors left in it. */
static void end_tensor_at(CUdeviceptr base)
{
    const struct pump_range *range = pump_ranges_find(base);
    uint64_t tracked;
    if (range != NULL && __atomic_load_n(&range->base, __ATOMIC_RELAXED) == base &&
        !__atomic_load_n(&range->counted, __ATOMIC_RELAXED) && pump_ranges_remove_tensor(base, &tracked))
        pump_channel_free(base, tracked);
}

/* A free: the managed allocation at base leaves the table, or the device
 * memory its count. Called before the driver frees it: once the driver has,
 * another thread may be handed the same address, and the record forgotten
 * here must be this allocation's, not that one's. True when it was managed. */
static bool untrack(CUdeviceptr base)
{
    uint64_t size;
    int device;
    end_tensor_at(base);
    enum pump_removed removed = pump_ranges_remove(base, &size, &device);
    if (removed == PUMP_REMOVED_NOTHING) {
        pump_device_memory_remove(base);
        return false;
    }
    pump_capacity_release(device, size);
    PUMP_COUNT(managed_frees, 1);
    if (removed == PUMP_REMOVED_ALLOCATION)
        pump_channel_free(base, size);
    return true;
}

/* The driver refused a free of managed memory pump had already forgotten: it
 * lives on outside pump's view (faults instead of prefetches, never a wrong value). */
static CUresult after_free(CUresult r, bool forgotten)
{
    if (r != CUDA_SUCCESS && forgotten)
        pump_log_once("a free failed (CUresult %d) after pump forgot its memory: pump no longer follows it", (int)r);
    return r;
}

/* Ends a managed allocation that reserved its bytes against device's cap: tracked,
 * or the reservation given back. by_pump: managed_all made it managed. */
static void settle_managed(CUresult r, const CUdeviceptr *dptr, size_t bytesize, unsigned int flags, bool by_pump,
                           int device)
{
    if (r != CUDA_SUCCESS || !track_managed(*dptr, bytesize, flags, !by_pump, device))
        pump_capacity_release(device, bytesize);
}

/* Whether pump may turn this device allocation into managed memory; caller:
 * the hook's return address (managed_all.h). */
static bool convertible(const CUdeviceptr *dptr, size_t bytesize, const void *caller)
{
    return pump_active() && dptr != NULL && bytesize != 0 && pump_managed_all_for(caller);
}

static void count_converted(CUresult r, size_t bytesize)
{
    if (r == CUDA_SUCCESS) {
        PUMP_COUNT(managed_all_allocs, 1);
        PUMP_COUNT(managed_all_bytes, bytesize);
    }
}

CUresult pump_mem_alloc_managed(CUdeviceptr *dptr, size_t bytesize, unsigned int flags)
{
    PUMP_REAL_OR_RETURN(mem_alloc_managed, real);
    if (!pump_active() || dptr == NULL || bytesize == 0)
        return real(dptr, bytesize, flags);  /* the driver's own answer, errors included */
    int device = pump_current_device();
    if (!pump_capacity_reserve(device, NULL, bytesize))
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult r = real(dptr, bytesize, flags);
    settle_managed(r, dptr, bytesize, flags, false, device);
    return r;
}

CUresult pump_mem_alloc(CUdeviceptr *dptr, size_t bytesize)
{
    PUMP_REAL_OR_RETURN(mem_alloc, real);
    pump_pfn_mem_alloc_managed managed = PUMP_REAL(mem_alloc_managed);
    if (managed != NULL && convertible(dptr, bytesize, __builtin_return_address(0))) {
        int device = pump_current_device();
        if (!pump_capacity_reserve(device, NULL, bytesize))
            return CUDA_ERROR_OUT_OF_MEMORY;
        CUresult r = managed(dptr, bytesize, CU_MEM_ATTACH_GLOBAL);
        settle_managed(r, dptr, bytesize, CU_MEM_ATTACH_GLOBAL, true, device);
        count_converted(r, bytesize);
        return r;
    }
    CUresult r = real(dptr, bytesize);
    if (r == CUDA_SUCCESS && pump_active())
        count_device_memory(*dptr, bytesize, NULL);
    return r;
}

/* Memory from a pool pump did not pick (`pool`; NULL: the device's current one): managed when
 * the pool is (CUDA 13 managed pools), which only the pointer tells. Managed memory counts
 * against the cap like any other: past it, it is freed again in the stream's order and the
 * program gets CUDA_ERROR_OUT_OF_MEMORY. */
static CUresult after_pool_alloc(CUresult r, const CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                 CUstream stream, pump_pfn_mem_free_async free_async)
{
    if (r != CUDA_SUCCESS || !pump_active())
        return r;
    unsigned int managed = 0;
    if (free_async == NULL || pump_driver.pointer_get_attribute == NULL ||
        pump_driver.pointer_get_attribute(&managed, CU_POINTER_ATTRIBUTE_IS_MANAGED, *dptr) != CUDA_SUCCESS ||
        !managed) {
        count_device_memory(*dptr, bytesize, pool);
        return r;
    }
    int device = pump_memory_device(*dptr);
    if (!pump_capacity_reserve(device, pump_stream_context(stream), bytesize)) {
        free_async(*dptr, stream);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    settle_managed(r, dptr, bytesize, 0, false, device);
    return r;
}

/* Whether the driver prefetches memory of `pool`, device's managed pool: cuda.h 13.0 says a
 * prefetched range "must refer to managed memory allocated via cuMemAllocManaged or declared
 * via __managed__", which a pool's is not. Asked once per device, at its first conversion: a
 * PROBE_BYTES block from the pool prefetched to the host (no device memory taken) on the
 * allocation's stream. Taken: the block stays allocated for the process's life (freed, the
 * pool would keep it and the program's trims would give it back, a figure that is not the
 * program's). Refused: it is freed in stream order, and the device's stream-ordered
 * allocations come from cuMemAllocManaged instead (managed_all_cache.h), as they do from the
 * first refusal of the pool's memory after a probe that was taken (pump_pool_prefetch_of). */
#define PROBE_BYTES 1

static enum pump_pool_prefetch pool_prefetch(CUmemoryPool pool, int device, CUstream own, CUstream stream,
                                             pump_pfn_mem_alloc_from_pool_async from_pool,
                                             pump_pfn_mem_free_async free_async)
{
    enum pump_pool_prefetch known = pump_pool_prefetch_of(device);
    if (PUMP_LIKELY(known != PUMP_POOL_UNASKED))
        return known;
    CUdeviceptr probe = 0;
    if (free_async == NULL || from_pool(&probe, PROBE_BYTES, pool, stream) != CUDA_SUCCESS)
        return PUMP_POOL_PREFETCHED;  /* as before; asked again at the next allocation */
    struct pump_capture_mode mode = pump_capture_relax();
    CUmemLocation host = {.type = CU_MEM_LOCATION_TYPE_HOST, .id = 0};
    CUresult r = pump_driver.prefetch_v2 != NULL ? pump_driver.prefetch_v2(probe, PROBE_BYTES, host, 0, own)
                                                 : pump_driver.prefetch_v1(probe, PROBE_BYTES, CU_DEVICE_CPU, own);
    pump_capture_restore(&mode);
    if (r != CUDA_SUCCESS)
        free_async(probe, stream);
    pump_pool_prefetch_decided(device, r == CUDA_SUCCESS ? PUMP_POOL_PREFETCHED : PUMP_POOL_REFUSED);
    return pump_pool_prefetch_of(device);
}

/* A converted allocation where the pool's memory is refused: cuMemAllocManaged in the stream's
 * context (in relaxed capture mode: another thread's capture does not forbid what a pool
 * allocation would not have). */
static CUresult unpooled_alloc(CUdeviceptr *dptr, size_t bytesize, CUstream own)
{
    pump_pfn_mem_alloc_managed managed = PUMP_REAL(mem_alloc_managed);
    if (managed == NULL)
        return CUDA_ERROR_NOT_SUPPORTED;
    struct pump_capture_mode mode = pump_capture_relax();
    bool pushed;
    CUresult r = CUDA_ERROR_INVALID_CONTEXT;
    if (pump_context_push(pump_stream_context(own), &pushed)) {
        r = managed(dptr, bytesize, CU_MEM_ATTACH_GLOBAL);
        pump_context_pop(pushed);
    }
    pump_capture_restore(&mode);
    if (r == CUDA_SUCCESS)
        PUMP_COUNT(unpooled_allocs, 1);
    return r;
}

/* pump's allocator for PyTorch, placing (placement.h): a block it keeps stays in the range table
 * as the freed tensor of a segment of its own (ranges.h: carved, its bytes counted against the
 * capacity as a caching allocator's segment is), so that the allocation placed on it next takes
 * back what pump knows of its memory: a step's tensors are not prefetched again each step for
 * having been freed and allocated again. Returns the freed record (NULL: none could be kept). */
static struct pump_range *retire(CUdeviceptr base, size_t size)
{
    const struct pump_range *range = pump_ranges_find(base);
    if (range != NULL && __atomic_load_n(&range->counted, __ATOMIC_RELAXED)) {
        uint64_t carved_base, carved_size;
        if (pump_ranges_insert_tensor(base, size, &carved_base, &carved_size) == NULL)
            return NULL;
    }
    struct pump_range *tensor = pump_ranges_find(base);
    uint64_t tracked;
    if (tensor == NULL || !pump_ranges_remove_tensor(base, &tracked))
        return NULL;
    pump_channel_free(base, tracked);
    return tensor;
}

/* A kept block taken again: its freed tensor (retire) comes back, what pump knew of it
 * included. False where the block has none (kept by managed_all's own frees: tracked anew). */
static bool revive(CUdeviceptr base, size_t size)
{
    uint64_t carved_base, carved_size;
    struct pump_range *range = pump_ranges_insert_tensor(base, size, &carved_base, &carved_size);
    if (range == NULL)
        return false;
    PUMP_COUNT(managed_allocs, 1);
    pump_channel_alloc(range, base, size, CU_MEM_ATTACH_GLOBAL);
    return true;
}

/* cuMemAllocAsync: under managed_all, from the stream device's managed pool (same stream,
 * same order), or where the driver will not prefetch that pool's memory, cuMemAllocManaged
 * memory freed in stream order by pump (a block pump keeps first); else from the device's
 * current pool as asked. `place`: pump's allocator for PyTorch placing a tensor
 * (torch_allocator.c; else NULL): a block pump keeps, the one placed there where it can, goes
 * before new memory. Blocks of cuMemAllocManaged carry its flag in the range table (pool
 * memory: 0). */
static CUresult alloc_async(pump_pfn_mem_alloc_async real, pump_pfn_mem_alloc_from_pool_async from_pool,
                            pump_pfn_mem_free_async free_async, CUdeviceptr *dptr, size_t bytesize, CUstream stream,
                            CUstream own, const void *caller, const struct pump_place *place)
{
    int device = -1;
    CUmemoryPool pool =
        from_pool != NULL && convertible(dptr, bytesize, caller) ? pump_managed_pool_for(own, &device) : NULL;
    if (pool == NULL)
        return after_pool_alloc(real(dptr, bytesize, stream), dptr, bytesize, NULL, own, free_async);
    if (!pump_capacity_reserve(device, pump_stream_context(own), bytesize))
        return CUDA_ERROR_OUT_OF_MEMORY;
    bool unpooled = pool_prefetch(pool, device, own, stream, from_pool, free_async) == PUMP_POOL_REFUSED;
    bool pooled = !unpooled;
    CUresult r = CUDA_SUCCESS;
    *dptr = place != NULL || unpooled ? pump_kept_take(bytesize, device, own, place, &pooled) : 0;
    if (*dptr != 0 && revive(*dptr, bytesize)) {
        pump_capacity_release(device, bytesize);  /* its segment counts already */
        count_converted(r, bytesize);
        return r;
    }
    if (*dptr == 0)
        r = unpooled ? unpooled_alloc(dptr, bytesize, own) : from_pool(dptr, bytesize, pool, stream);
    settle_managed(r, dptr, bytesize, pooled ? 0 : CU_MEM_ATTACH_GLOBAL, true, device);
    count_converted(r, bytesize);
    return r;
}

#define PUMP_ALLOC_ASYNC_HOOK(id, from_pool_id, free_id, per_thread)                                         \
    CUresult pump_##id(CUdeviceptr *dptr, size_t bytesize, CUstream stream)                                  \
    {                                                                                                        \
        PUMP_REAL_OR_RETURN(id, real);                                                                       \
        return alloc_async(real, PUMP_REAL(from_pool_id), PUMP_REAL(free_id), dptr, bytesize, stream,        \
                           pump_stream_of(stream, per_thread), __builtin_return_address(0), NULL);           \
    }
PUMP_ALLOC_ASYNC_HOOK(mem_alloc_async, mem_alloc_from_pool_async, mem_free_async, false)
PUMP_ALLOC_ASYNC_HOOK(mem_alloc_async_ptsz, mem_alloc_from_pool_async_ptsz, mem_free_async_ptsz, true)

PUMP_HIDDEN CUresult pump_torch_alloc_async(CUdeviceptr *dptr, size_t bytesize, CUstream stream,
                                            const struct pump_place *place)
{
    PUMP_REAL_OR_RETURN(mem_alloc_async, real);
    return alloc_async(real, PUMP_REAL(mem_alloc_from_pool_async), PUMP_REAL(mem_free_async), dptr, bytesize,
                       stream, stream, __builtin_return_address(0), place);
}

/* The program's own pool: its properties are the program's choice. */
#define PUMP_ALLOC_FROM_POOL_HOOK(id, free_id)                                                    \
    CUresult pump_##id(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream stream)    \
    {                                                                                             \
        PUMP_REAL_OR_RETURN(id, real);                                                            \
        return after_pool_alloc(real(dptr, bytesize, pool, stream), dptr, bytesize, pool, stream, \
                                PUMP_REAL(free_id));                                              \
    }
PUMP_ALLOC_FROM_POOL_HOOK(mem_alloc_from_pool_async, mem_free_async)
PUMP_ALLOC_FROM_POOL_HOOK(mem_alloc_from_pool_async_ptsz, mem_free_async_ptsz)

/* A block the unpooled cache keeps is freed already: a second free is the program's error,
 * which the driver's pool answers so. */
static bool freed_twice(CUdeviceptr dptr)
{
    return pump_ranges_find(dptr) == NULL && pump_unpooled_holds(dptr);
}

CUresult pump_mem_free(CUdeviceptr dptr)
{
    PUMP_REAL_OR_RETURN(mem_free, real);
    if (pump_active() && freed_twice(dptr))
        return CUDA_ERROR_INVALID_VALUE;
    bool forgotten = pump_active() && untrack(dptr);
    return after_free(real(dptr), forgotten);
}

/* A converted stream-ordered allocation (by_pump, neither the program's own managed memory nor
 * a communication library's) whose stream-ordered free is pump's to keep (its size, device and
 * kind in *size, *device, *pooled): cuMemAllocManaged's where the device's pool memory is
 * refused, and, where placing (pump's allocator for PyTorch), a managed pool's too while the
 * driver prefetches it. Which kind a block is its flags say (a pool's: 0), a block placement
 * kept before (retire) included: the driver may refuse a pool it took before
 * (managed_all_cache.h), and the pool's blocks then go back to it. */
static bool kept_on_free(CUdeviceptr dptr, bool placing, size_t *size, int *device, bool *pooled)
{
    const struct pump_range *range = pump_ranges_find(dptr);
    if (range == NULL || __atomic_load_n(&range->base, __ATOMIC_RELAXED) != dptr ||
        __atomic_load_n(&range->host_touchable, __ATOMIC_RELAXED))
        return false;
    unsigned int flags = __atomic_load_n(&range->flags, __ATOMIC_RELAXED);
    *size = __atomic_load_n(&range->size, __ATOMIC_RELAXED);
    *device = __atomic_load_n(&range->device, __ATOMIC_RELAXED);
    enum pump_pool_prefetch pool = pump_pool_prefetch_of(*device);
    *pooled = flags == 0;
    if (*pooled)
        return placing && pool == PUMP_POOL_PREFETCHED;
    if (!__atomic_load_n(&range->counted, __ATOMIC_RELAXED))  /* a block placement kept before (retire) */
        return placing;
    return flags == CU_MEM_ATTACH_GLOBAL && pool == PUMP_POOL_REFUSED;
}

/* Stream-ordered: the memory dies in stream order, but no later launch may name it, so it
 * leaves the table now. A block pump keeps (managed_all_cache.h) is not freed. */
static CUresult free_async(pump_pfn_mem_free_async real, CUdeviceptr dptr, CUstream stream, CUstream own,
                           bool placing)
{
    if (!pump_active())
        return real(dptr, stream);
    if (freed_twice(dptr))
        return CUDA_ERROR_INVALID_VALUE;
    size_t size = 0;
    int device = -1;
    bool pooled = false, kept = kept_on_free(dptr, placing, &size, &device, &pooled);
    if (kept && placing) {
        struct pump_range *freed = retire(dptr, size);
        if (freed == NULL)
            untrack(dptr);  /* no record kept: the block is tracked anew when taken */
        if (pump_kept_keep(dptr, size, device, own, pooled))
            return CUDA_SUCCESS;
        return after_free(real(dptr, stream), untrack(dptr) || freed != NULL);
    }
    bool forgotten = untrack(dptr);
    if (kept && pump_kept_keep(dptr, size, device, own, pooled))
        return CUDA_SUCCESS;
    return after_free(real(dptr, stream), forgotten);
}

#define PUMP_FREE_ASYNC_HOOK(id, per_thread)                                          \
    CUresult pump_##id(CUdeviceptr dptr, CUstream stream)                             \
    {                                                                                 \
        PUMP_REAL_OR_RETURN(id, real);                                                \
        return free_async(real, dptr, stream, pump_stream_of(stream, per_thread), false); \
    }
PUMP_FREE_ASYNC_HOOK(mem_free_async, false)
PUMP_FREE_ASYNC_HOOK(mem_free_async_ptsz, true)

PUMP_HIDDEN CUresult pump_torch_free_async(CUdeviceptr dptr, CUstream stream, bool placing)
{
    PUMP_REAL_OR_RETURN(mem_free_async, real);
    return free_async(real, dptr, stream, stream, placing);
}

/* Under managed_all the job's memory is its capacity: a framework sizing its
 * cache from free memory neither refuses to allocate nor takes it all. */
CUresult pump_mem_get_info(size_t *free_bytes, size_t *total_bytes)
{
    PUMP_REAL_OR_RETURN(mem_get_info, real);
    CUresult r = real(free_bytes, total_bytes);
    if (r == CUDA_SUCCESS && pump_active() && pump_managed_all())
        pump_capacity_info(pump_current_device(), free_bytes, total_bytes);
    return r;
}

/* Advice the driver took: read-mostly memory is one pump's evictions leave alone
 * (residency.h). */
CUresult pump_mem_advise(CUdeviceptr ptr, size_t count, CUmem_advise advice, CUdevice device)
{
    PUMP_REAL_OR_RETURN(mem_advise, real);
    CUresult r = real(ptr, count, advice, device);
    if (r == CUDA_SUCCESS && pump_active())
        pump_residency_advised(ptr, count, advice);
    return r;
}

CUresult pump_mem_advise_v2(CUdeviceptr ptr, size_t count, CUmem_advise advice, CUmemLocation location)
{
    PUMP_REAL_OR_RETURN(mem_advise_v2, real);
    CUresult r = real(ptr, count, advice, location);
    if (r == CUDA_SUCCESS && pump_active())
        pump_residency_advised(ptr, count, advice);
    return r;
}

/* Physical memory for virtual memory management (PyTorch's expandable
 * segments, NCCL's buffers): mapped by the program itself, it cannot be made
 * managed. */
CUresult pump_mem_create(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
                         unsigned long long flags)
{
    PUMP_REAL_OR_RETURN(mem_create, real);
    CUresult r = real(handle, size, prop, flags);
    if (r == CUDA_SUCCESS && pump_active()) {
        PUMP_COUNT(vmm_allocs, 1);
        if (pump_managed_all())
            pump_notice_once("managed_all: memory from cuMemCreate (virtual memory management: PyTorch's expandable "
                             "segments, NCCL's buffers) stays device memory: pump cannot prefetch it and it is "
                             "outside the capacity");
    }
    return r;
}

/* Managed memory has no IPC handle: the driver refuses, and where managed_all
 * made the memory managed that refusal is pump's doing, so say how to avoid
 * it (memory the program allocated managed itself is refused without pump too). */
static bool made_managed_by_pump(CUdeviceptr dptr)
{
    const struct pump_range *range = pump_ranges_find(dptr);
    return range != NULL && !__atomic_load_n(&range->host_touchable, __ATOMIC_RELAXED);
}

CUresult pump_ipc_get_mem_handle(CUipcMemHandle *handle, CUdeviceptr dptr)
{
    PUMP_REAL_OR_RETURN(ipc_get_mem_handle, real);
    CUresult r = real(handle, dptr);
    if (r != CUDA_SUCCESS && pump_active() && pump_managed_all() && made_managed_by_pump(dptr)) {
        PUMP_COUNT(ipc_refusals, 1);
        pump_notice_once("cuIpcGetMemHandle failed (CUresult %d) on managed memory: under managed_all the program's "
                         "device allocations are managed memory, which cannot be shared between processes; to "
                         "share CUDA memory between processes (e.g. torch.multiprocessing), run with pump-run "
                         "--no-managed-all (PUMP_MANAGED_ALL=0)",
                         (int)r);
    }
    return r;
}
