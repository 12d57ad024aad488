/* pool_prefetch.c: memory from a managed pool and the prefetch contract, for
 * tests/test_pool_prefetch.py. cuda.h 13.0 says a prefetched range "must refer to managed
 * memory allocated via cuMemAllocManaged or declared via __managed__"; fakecuda accepts a
 * managed pool's memory as the 580 driver did (FAKECUDA_POOL_PREFETCH=refuse refuses it, and
 * FAKECUDA_POOL_PREFETCH_REFUSE_AFTER=N refuses it after N prefetched ranges, as an H200 did).
 * Why an imitation, not the real client (tests/test_real_client*.py): GPU faults
 * per step (real kernels are no-ops on fakecuda: they touch no page), a managed pool's refused
 * prefetches, CUDA 12 drivers, and the sanitizer builds.
 *
 *   pool_prefetch steps STEPS   training steps as PyTorch's cudaMallocAsync backend makes
 *       them: each step takes two inputs and an output from cuMemAllocAsync, a kernel fills
 *       the inputs, another adds them, the output is copied back and summed, everything is
 *       freed in stream order, and the step ends with a synchronisation. Under managed_all
 *       the allocations become managed memory.
 *   pool_prefetch steps-context STEPS   the same, each step ending with cuCtxSynchronize.
 *   pool_prefetch refused LAUNCHES   the program's own managed pool (cuMemAllocFromPoolAsync
 *       on the device's CU_MEM_ALLOCATION_TYPE_MANAGED pool) and, each launch, a fresh
 *       cuMemAllocManaged buffer: each launch adds the pool's buffer into the fresh one.
 *
 * One JSON line: the checksum, whether the allocations were managed memory, and fakecuda's
 * counters over the steps or launches after the first (launches, faults, single and batch
 * prefetch calls), and the faults of the last one alone.
 */
#include <stdbool.h>
#include <string.h>

#include "cuda_api.h"

#define FLOATS ((size_t)1 << 20) /* 4 MiB a buffer: two 2 MiB blocks */
#define BYTES (FLOATS * sizeof(float))

static CUstream stream;
static CUfunction fill, add;

static void fill_on(CUdeviceptr x, float base)
{
    uint64_t n = FLOATS;
    void *params[] = {&x, &n, &base};
    CHECK(cuLaunchKernel(fill, 1, 1, 1, 1, 1, 1, 0, stream, params, NULL));
}

static void add_on(CUdeviceptr a, CUdeviceptr b, CUdeviceptr c)
{
    uint64_t n = FLOATS;
    void *params[] = {&a, &b, &c, &n};
    CHECK(cuLaunchKernel(add, 1, 1, 1, 1, 1, 1, 0, stream, params, NULL));
}

static double sum_of(CUdeviceptr x, float *host)
{
    CHECK(cuMemcpyDtoHAsync(host, x, BYTES, stream));
    CHECK(cuStreamSynchronize(stream));
    double sum = 0;
    for (size_t i = 0; i < FLOATS; i++)
        sum += host[i];
    return sum;
}

static unsigned int is_managed(CUdeviceptr p)
{
    unsigned int managed = 0;
    CHECK(cuPointerGetAttribute(&managed, CU_POINTER_ATTRIBUTE_IS_MANAGED, p));
    return managed;
}

static bool context_sync;

static double step(float *host, unsigned int *managed)
{
    CUdeviceptr a, b, c;
    CHECK(cuMemAllocAsync(&a, BYTES, stream));
    CHECK(cuMemAllocAsync(&b, BYTES, stream));
    CHECK(cuMemAllocAsync(&c, BYTES, stream));
    *managed = is_managed(a) & is_managed(b) & is_managed(c);
    fill_on(a, 1.0f);
    fill_on(b, 2.0f);
    add_on(a, b, c);
    double sum = sum_of(c, host);
    CHECK(cuMemFreeAsync(c, stream));
    CHECK(cuMemFreeAsync(b, stream));
    CHECK(cuMemFreeAsync(a, stream));
    CHECK(context_sync ? cuCtxSynchronize() : cuStreamSynchronize(stream));
    return sum;
}

static void start(void)
{
    const size_t fill_sizes[] = {8, 8, 4}, fill_aligns[] = {8, 8, 4}, add_sizes[] = {8, 8, 8, 8};
    fill = cuda_api_kernel("fill", pattern_kernel, 3, fill_sizes, fill_aligns);
    add = cuda_api_kernel("add", add_kernel, 4, add_sizes, add_sizes);
    CHECK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
}

static double refused_launch(CUdeviceptr pooled, float *host)
{
    CUdeviceptr fresh;
    CHECK(cuMemAllocManaged(&fresh, BYTES, CU_MEM_ATTACH_GLOBAL));
    fill_on(fresh, 3.0f);
    add_on(pooled, fresh, fresh);
    double sum = sum_of(fresh, host);
    CHECK(cuMemFree(fresh));
    return sum;
}

int main(int argc, char **argv)
{
    int count = argc == 3 ? atoi(argv[2]) : 0;
    const char *mode = argc == 3 ? argv[1] : "";
    context_sync = strcmp(mode, "steps-context") == 0;
    bool steps = context_sync || strcmp(mode, "steps") == 0;
    if (count < 2 || (!steps && strcmp(mode, "refused") != 0)) {
        fprintf(stderr, "usage: pool_prefetch steps|steps-context STEPS | pool_prefetch refused LAUNCHES "
                        "(at least 2)\n");
        return 2;
    }
    cuda_api_load(&api, 0);
    CUdevice device = cuda_api_start(&api);
    start();
    float *host = malloc(BYTES);
    if (host == NULL)
        return 3;
    unsigned int managed = 0;
    double checksum = 0;
    CUdeviceptr pooled = 0;
    CUmemoryPool pool = NULL;
    if (steps) {
        checksum += step(host, &managed);
    } else {
        CUmemLocation location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = device};
        CHECK(cuMemGetDefaultMemPool(&pool, &location, CU_MEM_ALLOCATION_TYPE_MANAGED));
        CHECK(cuMemAllocFromPoolAsync(&pooled, BYTES, pool, stream));
        managed = is_managed(pooled);
        fill_on(pooled, 1.0f);
        checksum += refused_launch(pooled, host);
    }
    api.reset_stats();
    struct fakecuda_stats before_last;
    for (int i = 1; i < count; i++) {
        if (i == count - 1)
            api.get_stats(&before_last);
        checksum += steps ? step(host, &managed) : refused_launch(pooled, host);
    }
    struct fakecuda_stats st;
    api.get_stats(&st);
    if (pooled != 0) {
        CHECK(cuMemFreeAsync(pooled, stream));
        CHECK(cuStreamSynchronize(stream));
    }
    free(host);
    printf("{\"checksum\": %.1f, \"managed\": %u, \"launches\": %llu, \"gpu_faults\": %llu, \"prefetch_calls\": %llu, "
           "\"batch_prefetch_calls\": %llu, \"last_gpu_faults\": %llu}\n",
           checksum, managed, (unsigned long long)st.launches, (unsigned long long)st.gpu_faults,
           (unsigned long long)st.prefetch_calls, (unsigned long long)st.batch_prefetch_calls,
           (unsigned long long)(st.gpu_faults - before_last.gpu_faults));
    return 0;
}
