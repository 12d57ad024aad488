/* wide_launch.c: launches that name hundreds of managed allocations, as PyTorch's foreach
 * kernels and fused optimizers do (a struct argument holding a list of tensor pointers,
 * MultiTensorApply.cuh), for tests/test_wide_launch.py.
 * Why an imitation, not the real client (tests/test_real_client*.py): faults under a
 * budget (which blocks a wide launch evicts); the real client checks that every pointer word
 * of multi_tensor_apply is prefetched, not what eviction leaves behind.
 *
 *   wide_launch N
 * A: N managed allocations of 64 KiB, C: N/2 more, all written by the host. Launch 1
 * ("foreach" over A[N/2..N) then C) names N allocations; launch 2 names the N of A. Under
 * a budget of N allocations, launch 2 must make room by evicting C alone: A[N/2..N), the
 * oldest blocks, are its own. One JSON line: the GPU faults of each launch and fakecuda's
 * per-device peak, and a checksum.
 */
#include <string.h>

#include "cuda_api.h"

#define LIST_MAX 512               /* pointers in the argument: 4,104 bytes (CUDA 12.1's large arguments) */
#define BYTES ((size_t)64 << 10)   /* each allocation: one fakecuda page */

struct tensor_list {
    uint64_t n;
    float *ptr[LIST_MAX];
};

/* Adds 1 to every float of each listed allocation. */
static void foreach_kernel(void **params, const fakecuda_dims *dims)
{
    (void)dims;
    const struct tensor_list *list = params[0];
    for (uint64_t t = 0; t < list->n; t++) {
        api.touch(list->ptr[t], BYTES);
        for (size_t i = 0; i < BYTES / sizeof(float); i++)
            list->ptr[t][i] += 1.0f;
    }
}

static uint64_t launch_faults(CUfunction f, CUstream stream, struct tensor_list *list)
{
    struct fakecuda_stats s;
    api.reset_stats();
    void *params[] = {list};
    CHECK(api.launch_kernel(f, 1, 1, 1, 128, 1, 1, 0, stream, params, NULL));
    CHECK(api.stream_synchronize(stream));
    api.get_stats(&s);
    return s.gpu_faults;
}

int main(int argc, char **argv)
{
    int n = argc == 2 ? atoi(argv[1]) : 0;
    if (n < 2 || n > LIST_MAX) {
        fprintf(stderr, "usage: wide_launch N (2 <= N <= %d)\n", LIST_MAX);
        return 2;
    }
    cuda_api_load(&api, 0);
    cuda_api_start(&api);
    const size_t sizes[] = {sizeof(struct tensor_list)}, aligns[] = {8};
    CUfunction foreach = cuda_api_kernel("foreach", foreach_kernel, 1, sizes, aligns);
    CUstream stream;
    CHECK(api.stream_create(&stream, CU_STREAM_NON_BLOCKING));

    int count = n + n / 2;
    CUdeviceptr *buffer = calloc((size_t)count, sizeof *buffer);
    struct tensor_list *list = calloc(1, sizeof *list);
    if (buffer == NULL || list == NULL)
        return 3;
    for (int b = 0; b < count; b++) {
        CHECK(api.mem_alloc_managed(&buffer[b], BYTES, CU_MEM_ATTACH_GLOBAL));
        host_fill((float *)(uintptr_t)buffer[b], BYTES / sizeof(float), (float)b);
    }
    CUdeviceptr *a = buffer, *c = buffer + n;
    list->n = (uint64_t)n;
    for (int i = 0; i < n; i++)
        list->ptr[i] = (float *)(uintptr_t)(i < n - n / 2 ? a[n / 2 + i] : c[i - (n - n / 2)]);
    uint64_t first = launch_faults(foreach, stream, list);
    for (int i = 0; i < n; i++)
        list->ptr[i] = (float *)(uintptr_t)a[i];
    uint64_t second = launch_faults(foreach, stream, list);
    struct fakecuda_stats s;
    api.get_stats(&s);

    uint64_t h = 0xcbf29ce484222325ull;
    for (int b = 0; b < count; b++) {
        api.host_touch((void *)(uintptr_t)buffer[b], BYTES);
        h = fnv1a(h, (const void *)(uintptr_t)buffer[b], BYTES);
        CHECK(api.mem_free(buffer[b]));
    }
    printf("{\"checksum\": \"%016llx\", \"first_faults\": %llu, \"second_faults\": %llu, "
           "\"device_resident_peak\": %llu}\n",
           (unsigned long long)h, (unsigned long long)first, (unsigned long long)second,
           (unsigned long long)s.device_resident_peak);
    free(list);
    free(buffer);
    return 0;
}
