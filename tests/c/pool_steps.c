/* pool_steps.c: training steps over stream-ordered memory, for tests/test_pool_threshold.py:
 * each step allocates an activation, a kernel writes it, it is freed, and the step ends with
 * a synchronisation (as `.item()` makes one). What fakecuda's pools released and reserved
 * again over the steps after the first shows whether freed memory stays with its pool or is
 * given back and populated again every step; then the device's default pool is trimmed, as
 * torch.cuda.empty_cache() does. One JSON line.
 * Why an imitation, not the real client (tests/test_real_client*.py): the pools'
 * release and re-reserve counts step by step, exact over a fixed pattern (the real client's
 * sizes are PyTorch's to choose), and the sanitizer builds.
 *
 *   pool_steps STEPS [pytorch] [async|pluggable]
 *
 * pytorch: first, the device's default pool's release threshold set to UINT64_MAX, as
 *   PyTorch's cudaMallocAsync backend does (c10/cuda/CUDAMallocAsyncAllocator.cpp,
 *   lazy_init_device, before the device's first allocation).
 * async (the default): cuMemAllocAsync / cuMemFreeAsync, as that backend allocates.
 * pluggable: PyTorch's pluggable allocator: libpump's pump_torch_alloc / pump_torch_free
 *   when the process has them (torch_allocator = "pump"), else cuMemAllocAsync.
 */
#include <stdbool.h>
#include <string.h>

#include "torch_program.h"

#define ACTIVATION ((size_t)16 << 20)

static CUstream stream;
static CUfunction fill;
static unsigned int managed; /* whether the last step's activation was managed memory */

static void fill_kernel(void **params, const fakecuda_dims *dims)
{
    (void)dims;
    float *out = *(float **)params[0];
    uint64_t n = *(uint64_t *)params[1];
    api.touch(out, n * sizeof *out);
    for (uint64_t i = 0; i < n; i++)
        out[i] = (float)(i % 5);
}

static CUdeviceptr step(bool pluggable)
{
    CUdeviceptr out = pluggable ? pluggable_alloc(ACTIVATION, stream) : 0;
    if (!pluggable)
        CHECK(cuMemAllocAsync(&out, ACTIVATION, stream));
    uint64_t n = ACTIVATION / sizeof(float);
    void *params[] = {&out, &n};
    CHECK(cuLaunchKernel(fill, 1, 1, 1, 1, 1, 1, 0, stream, params, NULL));
    CHECK(cuPointerGetAttribute(&managed, CU_POINTER_ATTRIBUTE_IS_MANAGED, out));
    if (pluggable)
        pluggable_free(out, ACTIVATION, stream);
    else
        CHECK(cuMemFreeAsync(out, stream));
    CHECK(cuStreamSynchronize(stream));
    return out;
}

int main(int argc, char **argv)
{
    bool pytorch = false, pluggable = false, usage = argc < 2 || atoi(argv[1]) < 1;
    for (int i = 2; i < argc; i++) {
        pytorch |= strcmp(argv[i], "pytorch") == 0;
        pluggable |= strcmp(argv[i], "pluggable") == 0;
        usage |= strcmp(argv[i], "pytorch") != 0 && strcmp(argv[i], "pluggable") != 0 && strcmp(argv[i], "async") != 0;
    }
    if (usage) {
        fprintf(stderr, "usage: pool_steps STEPS [pytorch] [async|pluggable]\n");
        return 2;
    }
    int steps = atoi(argv[1]);
    cuda_api_load(&api, 0);
    CUdevice device = cuda_api_start(&api);
    const size_t sizes[] = {8, 8};
    fill = cuda_api_kernel("fill", fill_kernel, 2, sizes, sizes);
    CHECK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
    if (pytorch) {
        CUmemoryPool pool;
        cuuint64_t threshold = UINT64_MAX;
        CHECK(cuDeviceGetDefaultMemPool(&pool, device));
        CHECK(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &threshold));
    }
    CUdeviceptr first = step(pluggable);
    api.reset_stats();
    int same_address = 1;
    for (int s = 0; s < steps; s++)
        same_address &= step(pluggable) == first;
    struct fakecuda_stats st, trimmed;
    api.get_stats(&st);
    /* torch.cuda.empty_cache() under the cudaMallocAsync backend: the device's default pool
     * trimmed to nothing (CudaMallocAsyncAllocator.cpp, emptyCache) */
    CUmemoryPool pool;
    CHECK(cuDeviceGetDefaultMemPool(&pool, device));
    CHECK(cuMemPoolTrimTo(pool, 0));
    api.get_stats(&trimmed);
    printf("{\"managed\": %u, \"steps\": %d, \"same_address\": %d, \"pool_bytes_released\": %llu, "
           "\"pool_bytes_reserved\": %llu, \"gpu_faults\": %llu, \"trim_released\": %llu}\n",
           managed, steps, same_address, (unsigned long long)st.pool_bytes_released,
           (unsigned long long)st.pool_bytes_reserved, (unsigned long long)st.gpu_faults,
           (unsigned long long)(trimmed.pool_bytes_released - st.pool_bytes_released));
    return 0;
}
