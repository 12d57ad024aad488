/* torch_streams.c: a tensor freed on its stream while another stream still reads it, as
 * PyTorch does with record_stream (tests/test_torch_allocator.py). One JSON line.
 * Why an imitation, not the real client (tests/test_real_client*.py): a specific
 * race (a slow reader on another stream while the tensor's memory is handed out again), and
 * its values: the reader's sum (real kernels are no-ops on fakecuda).
 *
 *   torch_streams [unlaunched|destroyed]
 *
 * Stream A writes tensor X; stream B, after that write, runs a slow reader of X (a kernel
 * that sleeps 300 ms, then sums X). Meanwhile, on A: X is freed (B's reader still runs) and
 * a tensor Y of X's size is allocated and written. A host function holds A until all of it
 * is enqueued, so the pool hands X's memory to Y, as a busy stream makes the driver's pool
 * do. Through libpump's pump_torch_alloc / pump_torch_free when the process has them (as
 * PyTorch's CUDAPluggableAllocator calls them: record_stream never reaches them); bare,
 * through cuMemAllocAsync / cuMemFreeAsync with record_stream honoured as PyTorch's
 * cudaMallocAsync backend honours it: A waits for an event recorded on B before the free.
 * The reader's sum must be X's.
 *
 * unlaunched: instead, one tensor allocated and freed on A with no kernel naming it (as a
 * tensor only copies, memsets or collectives use looks to pump).
 * destroyed: B's reader is waited for and B destroyed before X's free: only A is left.
 */
#include <stdatomic.h>
#include <stdbool.h>
#include <string.h>
#include <sys/types.h>
#include <time.h>

#include "torch_program.h"

#define TENSOR ((size_t)4 << 20)  /* two whole 2 MiB blocks: a discard takes both */
#define ELEMENTS (TENSOR / sizeof(float))

static CUstream stream_a, stream_b;

static void tensor_free(CUdeviceptr p, CUevent read_on_b)
{
    if (pump_torch_free != NULL) {
        pump_torch_free((void *)(uintptr_t)p, TENSOR, 0, stream_a);
        return;
    }
    if (stream_b != NULL) {
        CHECK(cuEventRecord(read_on_b, stream_b));  /* record_stream(B), honoured at the free */
        CHECK(cuStreamWaitEvent(stream_a, read_on_b, 0));
    }
    CHECK(cuMemFreeAsync(p, stream_a));
}

/* out[i] = base + i % 7 */
static void fill_kernel(void **params, const fakecuda_dims *dims)
{
    (void)dims;
    float *out = *(float **)params[0];
    float base = *(float *)params[1];
    api.touch(out, TENSOR);
    for (size_t i = 0; i < ELEMENTS; i++)
        out[i] = base + (float)(i % 7);
}

/* *sum = sum of in, after 300 ms: still running when the host frees `in`. */
static void slow_sum_kernel(void **params, const fakecuda_dims *dims)
{
    (void)dims;
    const float *in = *(const float **)params[0];
    double *sum = *(double **)params[1];
    nanosleep(&(struct timespec){0, 300000000}, NULL);
    api.touch(in, TENSOR);
    double s = 0;
    for (size_t i = 0; i < ELEMENTS; i++)
        s += (double)in[i];
    *sum = s;
}

int main(int argc, char **argv)
{
    bool unlaunched = argc == 2 && strcmp(argv[1], "unlaunched") == 0;
    bool destroyed = argc == 2 && strcmp(argv[1], "destroyed") == 0;
    if (argc > 2 || (argc == 2 && !unlaunched && !destroyed)) {
        fprintf(stderr, "usage: torch_streams [unlaunched|destroyed]\n");
        return 2;
    }
    cuda_api_load(&api, 0);
    cuda_api_start(&api);
    const size_t fill_sizes[] = {8, sizeof(float)}, sum_sizes[] = {8, sizeof(double *)};
    CUfunction fill = cuda_api_kernel("fill", fill_kernel, 2, fill_sizes, fill_sizes);
    CUfunction slow_sum = cuda_api_kernel("slow_sum", slow_sum_kernel, 2, sum_sizes, sum_sizes);
    CHECK(cuStreamCreate(&stream_a, CU_STREAM_NON_BLOCKING));
    CHECK(cuStreamCreate(&stream_b, CU_STREAM_NON_BLOCKING));
    CUevent written, read_on_b;
    CHECK(cuEventCreate(&written, CU_EVENT_DISABLE_TIMING));
    CHECK(cuEventCreate(&read_on_b, CU_EVENT_DISABLE_TIMING));

    CUdeviceptr x = pluggable_alloc(TENSOR, stream_a);
    if (unlaunched) {
        tensor_free(x, read_on_b);
        CHECK(cuStreamSynchronize(stream_a));
        printf("{\"pump_allocator\": %d}\n", pump_torch_alloc != NULL);
        return 0;
    }
    float x_base = 1.0f;
    void *fill_x[] = {&x, &x_base};
    CHECK(cuLaunchKernel(fill, 1, 1, 1, 1, 1, 1, 0, stream_a, fill_x, NULL));
    CHECK(cuEventRecord(written, stream_a));
    CHECK(cuStreamWaitEvent(stream_b, written, 0));
    static double sum = -1;
    double *sum_ptr = &sum;
    void *read_x[] = {&x, &sum_ptr};
    CHECK(cuLaunchKernel(slow_sum, 1, 1, 1, 1, 1, 1, 0, stream_b, read_x, NULL));
    if (destroyed) {
        CHECK(cuStreamSynchronize(stream_b));
        CHECK(cuStreamDestroy(stream_b));
        stream_b = NULL;
        tensor_free(x, read_on_b);
        CHECK(cuStreamSynchronize(stream_a));
        struct fakecuda_stats st;
        api.get_stats(&st);
        printf("{\"pump_allocator\": %d, \"bytes_discarded\": %llu}\n", pump_torch_alloc != NULL,
               (unsigned long long)st.bytes_discarded);
        return 0;
    }

    static atomic_int release;
    CHECK(cuLaunchHostFunc(stream_a, fake_hold, &release));
    tensor_free(x, read_on_b);
    CUdeviceptr y = pluggable_alloc(TENSOR, stream_a);
    float y_base = 1000.0f;
    void *fill_y[] = {&y, &y_base};
    CHECK(cuLaunchKernel(fill, 1, 1, 1, 1, 1, 1, 0, stream_a, fill_y, NULL));
    atomic_store(&release, 1);
    CHECK(cuStreamSynchronize(stream_a));
    CHECK(cuStreamSynchronize(stream_b));

    double expected = 0;
    for (size_t i = 0; i < ELEMENTS; i++)
        expected += (double)(x_base + (float)(i % 7));
    tensor_free(y, read_on_b);
    CHECK(cuStreamSynchronize(stream_a));
    struct fakecuda_stats st;
    api.get_stats(&st);
    printf("{\"pump_allocator\": %d, \"reused\": %d, \"checksum\": %.1f, \"expected\": %.1f, "
           "\"bytes_discarded\": %llu}\n",
           pump_torch_alloc != NULL, y == x, sum, expected, (unsigned long long)st.bytes_discarded);
    return 0;
}
