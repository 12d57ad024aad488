/* context_reset.c: a context that goes and comes back. Two rounds, each on a
 * stream of its own over a 16 MiB managed buffer the host wrote: one kernel
 * launch, then a synchronize. Between them the context goes:
 *   reset    cuDevicePrimaryCtxReset (what cudaDeviceReset does), then the
 *            same primary context is used again (its handle does not change);
 *   release  the last cuDevicePrimaryCtxRelease (which resets it), then
 *            cuDevicePrimaryCtxRetain again;
 *   destroy  cuCtxDestroy of a created context, then cuCtxCreate.
 * The program frees its buffer and destroys its stream before the context
 * goes, as a correct program must. It prints one JSON line: the GPU faults of
 * each round, the faults with no prefetching, a checksum of round 2's buffer.
 *
 *   context_reset reset|release|destroy [busy]
 *
 * busy: each round ends with launches over BUSY_BUFFERS more buffers of 16 MiB, so
 * that under a budget pump's worker still makes evictions when the context goes
 * (issue 42, risk 2).
 */
#include <cuda.h>
#include <stdbool.h>
#include <string.h>

#include "cuda_api.h"

#define BUFFER_FLOATS ((size_t)4 << 20) /* 16 MiB of floats */
#define PAGE (64u << 10)
#define BUSY_BUFFERS 8

static bool busy;

/* Launches over BUSY_BUFFERS buffers of its own on `stream`, and leaves them to the context's
 * end: a program may reset its device without synchronising or freeing first (cudaDeviceReset
 * "will reset the device immediately", destroying its allocations; no other host thread of the
 * program's may use it then, and pump's worker is pump's to stop). */
static void busy_launches(CUfunction inc, CUstream stream)
{
    CUdeviceptr x[BUSY_BUFFERS];
    uint64_t n = BUFFER_FLOATS;
    for (int i = 0; i < BUSY_BUFFERS; i++) {
        CHECK(cuMemAllocManaged(&x[i], BUFFER_FLOATS * sizeof(float), CU_MEM_ATTACH_GLOBAL));
        void *params[] = {&x[i], &n};
        CHECK(cuLaunchKernel(inc, 1, 1, 1, 256, 1, 1, 0, stream, params, NULL));
    }
}

static unsigned long long round_on_current_context(CUfunction inc, uint64_t *checksum)
{
    CUstream stream;
    CUdeviceptr x;
    uint64_t n = BUFFER_FLOATS;
    CHECK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
    CHECK(cuMemAllocManaged(&x, BUFFER_FLOATS * sizeof(float), CU_MEM_ATTACH_GLOBAL));
    host_fill((float *)(uintptr_t)x, BUFFER_FLOATS, 1.0f);
    fakecuda_reset_stats();
    void *params[] = {&x, &n};
    CHECK(cuLaunchKernel(inc, 1, 1, 1, 256, 1, 1, 0, stream, params, NULL));
    CHECK(cuStreamSynchronize(stream));
    struct fakecuda_stats stats;
    fakecuda_get_stats(&stats);
    fakecuda_host_touch((void *)(uintptr_t)x, BUFFER_FLOATS * sizeof(float));
    *checksum = fnv1a(0xcbf29ce484222325ull, (const void *)(uintptr_t)x, BUFFER_FLOATS * sizeof(float));
    CHECK(cuMemFree(x));
    if (busy)
        busy_launches(inc, stream);
    CHECK(cuStreamDestroy(stream));
    return (unsigned long long)stats.gpu_faults;
}

static CUfunction load_kernel(void)
{
    CUmodule module;
    CUfunction inc;
    CHECK(cuModuleLoadData(&module, "fakecuda"));
    CHECK(cuModuleGetFunction(&inc, module, "inc"));
    return inc;
}

int main(int argc, char **argv)
{
    const char *mode = argc >= 2 ? argv[1] : "";
    busy = argc == 3 && strcmp(argv[2], "busy") == 0;
    if ((strcmp(mode, "reset") != 0 && strcmp(mode, "release") != 0 && strcmp(mode, "destroy") != 0) ||
        argc > 3 || (argc == 3 && !busy)) {
        fprintf(stderr, "usage: context_reset reset|release|destroy [busy]\n");
        return 2;
    }
    cuda_api_load(&api, 0);
    CHECK(cuInit(0));
    const size_t sizes[] = {8, 8}, aligns[] = {8, 8};
    if (fakecuda_register_kernel("inc", inc_kernel, 2, sizes, aligns)) {
        fprintf(stderr, "error: kernel registration failed\n");
        return 3;
    }
    CUdevice dev;
    CUcontext ctx;
    CHECK(cuDeviceGet(&dev, 0));
    if (strcmp(mode, "destroy") == 0)
        CHECK(cuCtxCreate(&ctx, NULL, 0, dev));
    else
        CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));
    uint64_t checksum[2];
    unsigned long long faults[2];
    faults[0] = round_on_current_context(load_kernel(), &checksum[0]);

    if (strcmp(mode, "reset") == 0) {
        CHECK(cuDevicePrimaryCtxReset(dev));
    } else if (strcmp(mode, "release") == 0) {
        CHECK(cuDevicePrimaryCtxRelease(dev));
        CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
        CHECK(cuCtxSetCurrent(ctx));
    } else {
        CHECK(cuCtxDestroy(ctx));
        CHECK(cuCtxCreate(&ctx, NULL, 0, dev));
    }
    faults[1] = round_on_current_context(load_kernel(), &checksum[1]);
    printf("{\"faults\": [%llu, %llu], \"expected_faults\": %llu, \"checksum\": \"%016llx\"}\n", faults[0],
           faults[1], (unsigned long long)(BUFFER_FLOATS * sizeof(float) / PAGE), (unsigned long long)checksum[1]);
    if (strcmp(mode, "destroy") == 0)
        CHECK(cuCtxDestroy(ctx));
    else
        CHECK(cuDevicePrimaryCtxRelease(dev));
    return 0;
}
