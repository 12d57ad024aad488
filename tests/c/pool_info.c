/* pool_info.c: what memory pools keep, and what cuMemGetInfo says is free, for
 * tests/test_memory_info.py. PyTorch's cudaMallocAsync backend sets the device's default pool's
 * release threshold to UINT64_MAX (c10/cuda/CUDAMallocAsyncAllocator.cpp, lazy_init_device), so
 * the memory of its freed tensors stays reserved by the pool, device memory no one else can
 * have, across synchronisations.
 * Why an imitation, not the real client (tests/test_real_client*.py): exact figures
 * (bytes kept, pool queries per memory query) on a CUDA 12.8 driver, which torch's cu130 build
 * cannot use, and under pump's lock check (tests/test_driver_locks.py).
 *
 * Here: a 16 MiB plain allocation stays live (made managed under managed_all); 64 MiB is
 * allocated from the device's current pool (its default, threshold UINT64_MAX) and freed, and
 * 32 MiB from a pool the program made (threshold UINT64_MAX) and freed; a synchronisation; a
 * memory query ("kept"); the made pool destroyed (its memory goes back); a memory query again
 * ("destroyed"). One JSON line: total, free at each query, and what the pools kept (reserved,
 * as their RESERVED_MEM_CURRENT says), in bytes; and the pool queries (fakecuda's "pool_query"
 * calls: pool lookups and attributes) each memory query made.
 *
 *   pool_info [current]   current: the 32 MiB come from the made pool as the device's current
 *                         pool (cuDeviceSetMemPool, then cuMemAllocAsync), the default pool made
 *                         current again before the queries, as a framework switching pools does
 */
#include <string.h>

#include "cuda_api.h"

#define MiB ((size_t)1 << 20)
#define LIVE (16 * MiB)
#define DEFAULT_KEPT (64 * MiB)
#define MADE_KEPT (32 * MiB)

static uint64_t pool_queries(void)
{
    struct fakecuda_entry_cost cost;
    return fakecuda_get_entry_cost("pool_query", &cost) == 0 ? cost.calls : 0;
}

/* cuMemGetInfo's free, and in *queries the pool queries it made. */
static size_t free_memory(size_t *total, uint64_t *queries)
{
    size_t free_bytes;
    uint64_t before = pool_queries();
    CHECK(cuMemGetInfo(&free_bytes, total));
    *queries = pool_queries() - before;
    return free_bytes;
}

static cuuint64_t reserved(CUmemoryPool pool)
{
    cuuint64_t bytes;
    CHECK(cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &bytes));
    return bytes;
}

int main(int argc, char **argv)
{
    int made_current = argc == 2 && strcmp(argv[1], "current") == 0;
    if (argc > 2 || (argc == 2 && !made_current)) {
        fprintf(stderr, "usage: pool_info [current]\n");
        return 2;
    }
    cuda_api_load(&api, 0);
    CUdevice device = cuda_api_start(&api);
    CUstream stream;
    CHECK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
    CUdeviceptr live;
    CHECK(cuMemAlloc(&live, LIVE));

    cuuint64_t keep_all = UINT64_MAX;
    CUmemoryPool device_pool, made_pool;
    CHECK(cuDeviceGetDefaultMemPool(&device_pool, device));
    CHECK(cuMemPoolSetAttribute(device_pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep_all));
    CUmemPoolProps props = {.allocType = CU_MEM_ALLOCATION_TYPE_PINNED,
                            .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = device}};
    CHECK(cuMemPoolCreate(&made_pool, &props));
    CHECK(cuMemPoolSetAttribute(made_pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep_all));

    CUdeviceptr a, b;
    CHECK(cuMemAllocAsync(&a, DEFAULT_KEPT, stream));
    if (made_current) {
        CHECK(cuDeviceSetMemPool(device, made_pool));
        CHECK(cuMemAllocAsync(&b, MADE_KEPT, stream));
        CHECK(cuDeviceSetMemPool(device, device_pool));
    } else {
        CHECK(cuMemAllocFromPoolAsync(&b, MADE_KEPT, made_pool, stream));
    }
    CHECK(cuMemFreeAsync(a, stream));
    CHECK(cuMemFreeAsync(b, stream));
    CHECK(cuStreamSynchronize(stream));

    size_t total;
    uint64_t queries_kept, queries_destroyed;
    size_t free_kept = free_memory(&total, &queries_kept);
    cuuint64_t device_pool_kept = reserved(device_pool), made_pool_kept = reserved(made_pool);
    CHECK(cuMemPoolDestroy(made_pool));
    size_t free_destroyed = free_memory(&total, &queries_destroyed);

    CHECK(cuMemFree(live));
    CHECK(cuStreamDestroy(stream));
    printf("{\"total\": %zu, \"live\": %zu, \"free_kept\": %zu, \"free_destroyed\": %zu, "
           "\"device_pool_kept\": %llu, \"made_pool_kept\": %llu, \"pool_queries_kept\": %llu, "
           "\"pool_queries_destroyed\": %llu}\n",
           total, LIVE, free_kept, free_destroyed, (unsigned long long)device_pool_kept,
           (unsigned long long)made_pool_kept, (unsigned long long)queries_kept,
           (unsigned long long)queries_destroyed);
    return 0;
}
