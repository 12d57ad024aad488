/* capture_threads.c: a CUDA graph captured in global mode on one thread while another
 * thread works with tensors the way PyTorch's pluggable allocator drives pump
 * (tests/test_capture_threads.py): pump's own driver calls for the second thread must not
 * invalidate the first thread's capture (cuStreamBeginCapture's global mode prohibits
 * potentially unsafe calls from every thread not in relaxed mode).
 * Why an imitation, not the real client (tests/test_real_client*.py): a specific race, forced
 * here (B's allocation, discard and reuse inside A's capture), which PyTorch's own threads meet
 * only by chance; and the sanitizer builds.
 *
 *   capture_threads
 * Thread A begins a global-mode capture and launches into it; thread B, meanwhile,
 * allocates a tensor, launches on it, frees it (pump discards it) and allocates again the
 * same size on the same stream (the pool hands the memory out again, so pump's move of the
 * new tensor must first ask whether the discard has run), then launches on it. A ends its
 * capture when B is done. One JSON line: what cuStreamEndCapture returned, and a checksum.
 */
#include <pthread.h>

#include "cuda_api.h"
#include "pluggable.h"

#define TENSOR_BYTES ((size_t)4 << 20)

static CUcontext context;
static CUfunction set, inc;
static pthread_barrier_t capturing, worked;
static uint64_t checksum;

/* x[i] = 1 over (float *x, uint64_t n): a new tensor's first writer. */
static void set_kernel(void **params, const fakecuda_dims *dims)
{
    (void)dims;
    float *x = arg_floats(params, 0);
    uint64_t n = arg_u64(params, 1);
    api.touch(x, n * sizeof *x);
    for (uint64_t i = 0; i < n; i++)
        x[i] = 1.0f;
}

static void launch(CUfunction f, CUstream stream, CUdeviceptr x)
{
    uint64_t n = TENSOR_BYTES / sizeof(float);
    void *params[] = {&x, &n};
    CHECK(cuLaunchKernel(f, 1, 1, 1, 128, 1, 1, 0, stream, params, NULL));
}

static void *tensors(void *arg)
{
    (void)arg;
    CHECK(cuCtxSetCurrent(context));
    CUstream stream;
    CHECK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
    pthread_barrier_wait(&capturing);
    CUdeviceptr first = pluggable_alloc(TENSOR_BYTES, stream);
    launch(set, stream, first);
    launch(inc, stream, first);
    pluggable_free(first, TENSOR_BYTES, stream);
    CUdeviceptr second = pluggable_alloc(TENSOR_BYTES, stream);
    launch(set, stream, second);
    launch(inc, stream, second);
    pthread_barrier_wait(&worked);
    CHECK(cuStreamSynchronize(stream));
    api.host_touch((const void *)(uintptr_t)second, TENSOR_BYTES);
    checksum = fnv1a(0xcbf29ce484222325ull, (const void *)(uintptr_t)second, TENSOR_BYTES);
    pluggable_free(second, TENSOR_BYTES, stream);
    CHECK(cuStreamSynchronize(stream));
    CHECK(cuStreamDestroy(stream));
    return NULL;
}

int main(void)
{
    cuda_api_load(&api, 0);
    CHECK(cuInit(0));
    CUdevice device;
    CHECK(cuDeviceGet(&device, 0));
    CHECK(cuDevicePrimaryCtxRetain(&context, device));
    CHECK(cuCtxSetCurrent(context));
    const size_t sizes[] = {8, 8}, aligns[] = {8, 8};
    set = cuda_api_kernel("set", set_kernel, 2, sizes, aligns);
    inc = cuda_api_kernel("inc", inc_kernel, 2, sizes, aligns);
    CUstream stream;
    CHECK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
    CUdeviceptr captured;
    CHECK(cuMemAllocManaged(&captured, TENSOR_BYTES, CU_MEM_ATTACH_GLOBAL));
    pthread_barrier_init(&capturing, NULL, 2);
    pthread_barrier_init(&worked, NULL, 2);
    pthread_t worker;
    if (pthread_create(&worker, NULL, tensors, NULL) != 0)
        return 3;

    CHECK(cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_GLOBAL));
    launch(inc, stream, captured);
    pthread_barrier_wait(&capturing);
    pthread_barrier_wait(&worked);
    CUgraph graph = NULL;
    CUresult ended = cuStreamEndCapture(stream, &graph);
    pthread_join(worker, NULL);
    if (graph != NULL)
        CHECK(cuGraphDestroy(graph));
    CHECK(cuMemFree(captured));
    printf("{\"end_capture\": %d, \"checksum\": \"%016llx\"}\n", (int)ended, (unsigned long long)checksum);
    return 0;
}
