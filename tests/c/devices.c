/* devices.c: which device a prefetch goes to, and which devices get a
 * context. Run with FAKECUDA_DEVICES=2. A kernel and a graph replay work on
 * two 16 MiB managed buffers the host wrote, on a stream of the context of
 * device LAUNCH; the kernel launch and the replay are made while the context
 * of device CURRENT is the current one (the graph was instantiated in the
 * stream's context). It prints one JSON line: a checksum, the GPU faults
 * fakecuda counted, the faults expected with no prefetching, and the contexts
 * made on each device.
 *
 *   devices LAUNCH CURRENT [hold]
 * LAUNCH == CURRENT: the program uses that device only; no context may
 * appear on the other. hold: after the JSON line, wait until stdin closes
 * (a test looks at the job while it runs).
 */
#include <cuda.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_api.h"

#define BUFFER_FLOATS ((size_t)4 << 20) /* 16 MiB of floats */
#define PAGE (64u << 10)

static void axpy_kernel(void **params, const fakecuda_dims *dims)
{
    (void)dims;
    const float *x = *(float **)params[0];
    float *y = *(float **)params[1];
    uint64_t n = *(uint64_t *)params[2];
    fakecuda_touch(x, n * sizeof *x);
    fakecuda_touch(y, n * sizeof *y);
    for (uint64_t i = 0; i < n; i++)
        y[i] += 2.0f * x[i];
}

/* A whole buffer written by the host. */
static void buffer_fill(CUdeviceptr p, float base)
{
    host_fill((float *)(uintptr_t)p, BUFFER_FLOATS, base);
}

static CUcontext primary(int device)
{
    CUdevice d;
    CUcontext ctx;
    CHECK(cuDeviceGet(&d, device));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, d));
    return ctx;
}

int main(int argc, char **argv)
{
    bool hold = argc == 4 && strcmp(argv[3], "hold") == 0;
    if (argc != 3 && !hold) {
        fprintf(stderr, "usage: devices LAUNCH CURRENT [hold]\n");
        return 2;
    }
    int launch_device = atoi(argv[1]), current_device = atoi(argv[2]);
    cuda_api_load(&api, 0);
    CHECK(cuInit(0));
    const size_t p8 = 8, sizes[] = {p8, p8, p8}, aligns[] = {p8, p8, p8};
    if (fakecuda_register_kernel("axpy", axpy_kernel, 3, sizes, aligns)) {
        fprintf(stderr, "error: kernel registration failed\n");
        return 3;
    }
    CUcontext launch_ctx = primary(launch_device);
    CUcontext current_ctx = launch_device == current_device ? launch_ctx : primary(current_device);
    CHECK(cuCtxSetCurrent(launch_ctx));
    CUmodule module;
    CUfunction axpy;
    CUstream stream;
    CHECK(cuModuleLoadData(&module, "fakecuda"));
    CHECK(cuModuleGetFunction(&axpy, module, "axpy"));
    CHECK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
    CUdeviceptr x, y;
    uint64_t n = BUFFER_FLOATS;
    CHECK(cuMemAllocManaged(&x, BUFFER_FLOATS * sizeof(float), CU_MEM_ATTACH_GLOBAL));
    CHECK(cuMemAllocManaged(&y, BUFFER_FLOATS * sizeof(float), CU_MEM_ATTACH_GLOBAL));
    void *params[] = {&x, &y, &n};
    CUgraph graph;
    CUgraphExec exec;
    CHECK(cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_GLOBAL));
    CHECK(cuLaunchKernel(axpy, 1, 1, 1, 256, 1, 1, 0, stream, params, NULL));
    CHECK(cuStreamEndCapture(stream, &graph));
    CHECK(cuGraphInstantiate(&exec, graph, 0));
    buffer_fill(x, 1.0f);
    buffer_fill(y, 2.0f);
    fakecuda_reset_stats();

    CHECK(cuCtxSetCurrent(current_ctx));
    CHECK(cuLaunchKernel(axpy, 1, 1, 1, 256, 1, 1, 0, stream, params, NULL));
    CHECK(cuStreamSynchronize(stream));
    buffer_fill(x, 3.0f); /* both buffers back to the host for the replay */
    fakecuda_host_touch((void *)y, BUFFER_FLOATS * sizeof(float));
    CHECK(cuGraphLaunch(exec, stream));
    CHECK(cuStreamSynchronize(stream));

    struct fakecuda_stats stats;
    fakecuda_get_stats(&stats);
    uint64_t h = 0xcbf29ce484222325ull;
    fakecuda_host_touch((void *)y, BUFFER_FLOATS * sizeof(float));
    const unsigned char *bytes = (const unsigned char *)y;
    for (size_t i = 0; i < BUFFER_FLOATS * sizeof(float); i++)
        h = (h ^ bytes[i]) * 0x100000001b3ull;
    printf("{\"checksum\": \"%016llx\", \"gpu_faults\": %llu, \"expected_faults\": %llu, "
           "\"contexts\": [%d, %d]}\n",
           (unsigned long long)h, (unsigned long long)stats.gpu_faults,
           (unsigned long long)(4 * BUFFER_FLOATS * sizeof(float) / PAGE), fakecuda_contexts_created(0),
           fakecuda_contexts_created(1));
    fflush(stdout);
    while (hold && getchar() != EOF) {
    }
    CHECK(cuGraphExecDestroy(exec));
    CHECK(cuGraphDestroy(graph));
    CHECK(cuMemFree(x));
    CHECK(cuMemFree(y));
    return 0;
}
