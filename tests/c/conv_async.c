/* conv_async.c: a convolution as PyTorch runs it with its cudaMallocAsync backend
 * (PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync), for tests/test_memory_info.py.
 * Why an imitation, not the real client (tests/test_real_client*.py): it runs on a
 * CUDA 12.8 driver (torch's cu130 build needs 13.0), under capacities below what it holds, in
 * the sanitizer builds, and checks the convolution's output (real kernels are no-ops on
 * fakecuda: no values).
 *
 * It mirrors c10/cuda/CUDAMallocAsyncAllocator.cpp (pytorch/pytorch): mallocAsync takes each
 * tensor from the device's current pool with cudaMallocAsync on the current stream and adds
 * its size to pytorch_used_bytes[device]; before cuDNN's convolution picks an algorithm
 * (cudnnFind, aten/src/ATen/native/cudnn/Conv_v7.cpp), CudaMallocAsync::cacheInfo sizes the
 * largest workspace: cudaMemGetInfo, then
 *     TORCH_INTERNAL_ASSERT(free_upper_bound + pytorch_used_bytes[device] <= device_total);
 * then a guess of min(free_upper_bound, limit - used), halved until cudaMallocAsync of it
 * succeeds (and is freed again). The fastest algorithm whose workspace fits the guess runs,
 * its workspace allocated the same way. Here: the input and the 3x3 weights copied in, the
 * output allocated, cacheInfo's check and probe, the im2col algorithm (a workspace of 9
 * floats an output pixel) or, where that does not fit, the implicit one (none), the output
 * copied back and checked against the host's.
 *
 *   conv_async    one JSON line: free, total, used (MiB) at cacheInfo, whether its assert held,
 *                 the workspace guess (MiB), the algorithm, and whether the output is right.
 *                 Exit 1 when the assert fails (PyTorch raises there).
 */
#include <string.h>

#include "cuda_api.h"

#define SIDE 1024u /* a 1024x1024 single-channel image */
#define OUT_SIDE (SIDE - 2u)
#define MiB ((size_t)1 << 20)

static CUstream stream;
static size_t pytorch_used_bytes;

/* mallocAsync: from the device's current pool, on the current stream, counted. */
static CUdeviceptr malloc_async(size_t size)
{
    CUdeviceptr p;
    CHECK(cuMemAllocAsync(&p, size, stream));
    pytorch_used_bytes += size;
    return p;
}

static void free_async(CUdeviceptr p, size_t size)
{
    CHECK(cuMemFreeAsync(p, stream));
    pytorch_used_bytes -= size;
}

/* out[y][x] = sum of w[i][j] * in[y+i][x+j] over (in, w, out, workspace or 0). With a
 * workspace (im2col), the 9 inputs of each output pixel are gathered there first. */
static void conv_kernel(void **params, const fakecuda_dims *dims)
{
    (void)dims;
    const float *in = arg_floats(params, 0), *w = arg_floats(params, 1);
    float *out = arg_floats(params, 2), *columns = arg_floats(params, 3);
    api.touch(in, (size_t)SIDE * SIDE * sizeof *in);
    api.touch(w, 9 * sizeof *w);
    api.touch(out, (size_t)OUT_SIDE * OUT_SIDE * sizeof *out);
    if (columns != NULL)
        api.touch(columns, (size_t)OUT_SIDE * OUT_SIDE * 9 * sizeof *columns);
    for (size_t y = 0; y < OUT_SIDE; y++)
        for (size_t x = 0; x < OUT_SIDE; x++) {
            float gathered[9], *column = columns != NULL ? &columns[(y * OUT_SIDE + x) * 9] : gathered;
            for (size_t k = 0; k < 9; k++)
                column[k] = in[(y + k / 3) * SIDE + x + k % 3];
            float sum = 0.0f;
            for (size_t k = 0; k < 9; k++)
                sum += w[k] * column[k];
            out[y * OUT_SIDE + x] = sum;
        }
}

int main(void)
{
    cuda_api_load(&api, 0);
    cuda_api_start(&api);
    const size_t sizes[] = {8, 8, 8, 8}, aligns[] = {8, 8, 8, 8};
    CUfunction conv = cuda_api_kernel("conv", conv_kernel, 4, sizes, aligns);
    CHECK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));

    const size_t in_bytes = (size_t)SIDE * SIDE * sizeof(float), w_bytes = 9 * sizeof(float);
    const size_t out_bytes = (size_t)OUT_SIDE * OUT_SIDE * sizeof(float);
    float *host_in = malloc(in_bytes), *host_out = malloc(out_bytes), w[9];
    if (host_in == NULL || host_out == NULL)
        return 3;
    for (size_t i = 0; i < (size_t)SIDE * SIDE; i++)
        host_in[i] = (float)(i % 13) - 6.0f;
    for (int k = 0; k < 9; k++)
        w[k] = (float)(k - 4) * 0.5f;
    CUdeviceptr in = malloc_async(in_bytes), weights = malloc_async(w_bytes), out = malloc_async(out_bytes);
    CHECK(cuMemcpyHtoDAsync(in, host_in, in_bytes, stream));
    CHECK(cuMemcpyHtoDAsync(weights, w, w_bytes, stream));

    /* CudaMallocAsync::cacheInfo */
    size_t free_upper_bound, device_total;
    CHECK(cuMemGetInfo(&free_upper_bound, &device_total));
    int assert_ok = free_upper_bound + pytorch_used_bytes <= device_total;
    size_t guess = free_upper_bound, used_at_query = pytorch_used_bytes;
    while (assert_ok && guess > 0) {
        CUdeviceptr dummy;
        CUresult r = cuMemAllocAsync(&dummy, guess, stream);
        if (r == CUDA_SUCCESS) {
            CHECK(cuMemFreeAsync(dummy, stream));
            /* The driver's pool suballocates the workspace from the probe's memory in stream
             * order; fakecuda's pools hand freed memory out again only at the same size (the
             * stricter side), so here the free runs first and the memory goes back. */
            CHECK(cuStreamSynchronize(stream));
            break;
        }
        if (r != CUDA_ERROR_OUT_OF_MEMORY)
            CHECK(r);
        guess >>= 1;
    }

    /* The fastest algorithm whose workspace fits. */
    const size_t im2col_bytes = (size_t)OUT_SIDE * OUT_SIDE * 9 * sizeof(float);
    int im2col = assert_ok && im2col_bytes <= guess;
    int correct = 0;
    if (assert_ok) {
        CUdeviceptr workspace = im2col ? malloc_async(im2col_bytes) : 0;
        void *params[] = {&in, &weights, &out, &workspace};
        CHECK(cuLaunchKernel(conv, 1, 1, 1, 128, 1, 1, 0, stream, params, NULL));
        if (im2col)
            free_async(workspace, im2col_bytes);
        CHECK(cuMemcpyDtoHAsync(host_out, out, out_bytes, stream));
        CHECK(cuStreamSynchronize(stream));
        correct = 1;
        for (size_t y = 0; y < OUT_SIDE && correct; y++)
            for (size_t x = 0; x < OUT_SIDE; x++) {
                float sum = 0.0f;
                for (size_t k = 0; k < 9; k++)
                    sum += w[k] * host_in[(y + k / 3) * SIDE + x + k % 3];
                if (sum != host_out[y * OUT_SIDE + x]) {
                    correct = 0;
                    break;
                }
            }
    }
    free_async(out, out_bytes);
    free_async(weights, w_bytes);
    free_async(in, in_bytes);
    CHECK(cuStreamSynchronize(stream));
    free(host_in);
    free(host_out);
    printf("{\"free_mib\": %zu, \"total_mib\": %zu, \"used_mib\": %zu, \"assert_ok\": %d, \"guess_mib\": %zu, "
           "\"algorithm\": \"%s\", \"correct\": %d}\n",
           free_upper_bound / MiB, device_total / MiB, used_at_query / MiB, assert_ok, guess / MiB,
           assert_ok ? (im2col ? "im2col" : "implicit") : "none", correct);
    return assert_ok ? 0 : 1;
}
