/* fuzz_job.c: the fuzz targets' program on fakecuda (see fuzz_job.h). */
#include "fuzz_job.h"

#include <cuda.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fakecuda.h"

#define WORDS (FUZZ_BUFFER_BYTES / sizeof(uint32_t))

static CUfunction kernel;
static CUstream stream;
static CUdeviceptr buffer[FUZZ_BUFFERS];
static uint32_t *expected[FUZZ_BUFFERS];

static void must(CUresult r, const char *what)
{
    if (r != CUDA_SUCCESS) {
        fprintf(stderr, "fuzz job: %s returned %d\n", what, (int)r);
        abort();
    }
}

static void step_kernel(void **params, const fakecuda_dims *dims)
{
    (void)dims;
    uint32_t *x = *(uint32_t **)params[0];
    const uint32_t *y = *(const uint32_t **)params[1];
    uint64_t n = *(uint64_t *)params[2];
    fakecuda_touch(x, n * sizeof *x);
    fakecuda_touch(y, n * sizeof *y);
    for (uint64_t i = 0; i < n; i++)
        x[i] = x[i] * 3u + y[i] + 1u;
}

void fuzz_job_start(void)
{
    const char *socket = getenv("PUMP_SOCKET");
    if (socket == NULL || *socket != '\0') {
        fprintf(stderr, "fuzz job: run with PUMP_SOCKET= (empty): the target attaches the shim itself\n");
        exit(2);
    }
    CUdevice device;
    CUcontext context;
    CUmodule module;
    must(cuInit(0), "cuInit");
    must(cuDeviceGet(&device, 0), "cuDeviceGet");
    must(cuDevicePrimaryCtxRetain(&context, device), "cuDevicePrimaryCtxRetain");
    must(cuCtxSetCurrent(context), "cuCtxSetCurrent");
    const size_t sizes[] = {8, 8, 8}, aligns[] = {8, 8, 8};
    if (fakecuda_register_kernel("fuzz_step", step_kernel, 3, sizes, aligns) != 0)
        abort();
    must(cuModuleLoadData(&module, "fakecuda"), "cuModuleLoadData");
    must(cuModuleGetFunction(&kernel, module, "fuzz_step"), "cuModuleGetFunction");
    must(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
    for (unsigned b = 0; b < FUZZ_BUFFERS; b++) {
        must(cuMemAllocManaged(&buffer[b], FUZZ_BUFFER_BYTES, CU_MEM_ATTACH_GLOBAL), "cuMemAllocManaged");
        expected[b] = malloc(FUZZ_BUFFER_BYTES);
        if (expected[b] == NULL)
            abort();
        uint32_t *x = (uint32_t *)buffer[b];
        fakecuda_host_touch(x, FUZZ_BUFFER_BYTES);
        for (uint64_t i = 0; i < WORDS; i++)
            x[i] = expected[b][i] = (uint32_t)(i * 2654435761u + b);
    }
}

uint64_t fuzz_job_base(unsigned b)
{
    return (uint64_t)buffer[b % FUZZ_BUFFERS];
}

uint64_t fuzz_job_key(unsigned x, unsigned y)
{
    /* pump_channel.h's definition, written again from its text. */
    const uint64_t k = 0x9E3779B97F4A7C15ull;
    uint64_t h = (uint64_t)(uintptr_t)kernel * k;
    h = (h ^ fuzz_job_base(x)) * k;
    h = (h ^ fuzz_job_base(y)) * k;
    h ^= h >> 32;
    return h != 0 ? h : 1;
}

void fuzz_job_launch(unsigned x, unsigned y)
{
    x %= FUZZ_BUFFERS;
    y %= FUZZ_BUFFERS;
    if (x == y)
        abort();
    uint64_t words = WORDS;
    void *params[] = {&buffer[x], &buffer[y], &words};
    must(cuLaunchKernel(kernel, 1, 1, 1, 128, 1, 1, 0, stream, params, NULL), "cuLaunchKernel");
    for (uint64_t i = 0; i < WORDS; i++)
        expected[x][i] = expected[x][i] * 3u + expected[y][i] + 1u;
}

void fuzz_job_host_read(unsigned b)
{
    must(cuStreamSynchronize(stream), "cuStreamSynchronize");
    fakecuda_host_touch((const void *)buffer[b % FUZZ_BUFFERS], FUZZ_BUFFER_BYTES);
}

void fuzz_job_check(void)
{
    must(cuCtxSynchronize(), "cuCtxSynchronize");
    for (unsigned b = 0; b < FUZZ_BUFFERS; b++) {
        fakecuda_host_touch((const void *)buffer[b], FUZZ_BUFFER_BYTES);
        if (memcmp((const void *)buffer[b], expected[b], FUZZ_BUFFER_BYTES) != 0) {
            fprintf(stderr, "fuzz job: buffer %u does not hold what the kernels computed\n", b);
            abort();
        }
    }
}

int fuzz_open_descriptors(void)
{
    DIR *d = opendir("/proc/self/fd");
    if (d == NULL)
        abort();
    int n = 0;
    while (readdir(d) != NULL)
        n++;
    closedir(d);
    return n;
}
