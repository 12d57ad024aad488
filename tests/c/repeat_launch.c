/* repeat_launch.c: two launches over the same managed memory on one device, with no
 * synchronisation between them (tests/test_device_ordinals.py). Run with FAKECUDA_DEVICES
 * greater than DEVICE. The second launch finds the memory where the first prefetched it.
 *
 *   repeat_launch DEVICE
 * One JSON line: fakecuda's prefetch calls (batched or not) and GPU faults, and a checksum.
 */
#include "cuda_api.h"

#define FLOATS ((size_t)1 << 20) /* 4 MiB */

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: repeat_launch DEVICE\n");
        return 2;
    }
    cuda_api_load(&api, 0);
    cuda_api_start_on(&api, atoi(argv[1]));
    const size_t sizes[] = {8, 8}, aligns[] = {8, 8};
    CUfunction inc = cuda_api_kernel("inc", inc_kernel, 2, sizes, aligns);
    CUstream stream;
    CHECK(api.stream_create(&stream, CU_STREAM_NON_BLOCKING));
    CUdeviceptr x;
    uint64_t n = FLOATS;
    CHECK(api.mem_alloc_managed(&x, FLOATS * sizeof(float), CU_MEM_ATTACH_GLOBAL));
    host_fill((float *)(uintptr_t)x, FLOATS, 1.0f);
    api.reset_stats();
    void *params[] = {&x, &n};
    for (int i = 0; i < 2; i++)
        CHECK(api.launch_kernel(inc, 1, 1, 1, 128, 1, 1, 0, stream, params, NULL));
    CHECK(api.stream_synchronize(stream));
    struct fakecuda_stats s;
    api.get_stats(&s);
    api.host_touch((void *)(uintptr_t)x, FLOATS * sizeof(float));
    uint64_t h = fnv1a(0xcbf29ce484222325ull, (const void *)(uintptr_t)x, FLOATS * sizeof(float));
    printf("{\"checksum\": \"%016llx\", \"prefetch_calls\": %llu, \"gpu_faults\": %llu}\n", (unsigned long long)h,
           (unsigned long long)(s.prefetch_calls + s.batch_prefetch_calls), (unsigned long long)s.gpu_faults);
    CHECK(api.mem_free(x));
    return 0;
}
