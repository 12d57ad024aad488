/* launch_stream.c: a fakecuda job that launches kernels on managed memory at a
 * set rate, the event source for scripts/bench-daemon. Each launch names two
 * managed allocations; FUNCTIONS distinct kernels are launched in turn, as a
 * training step's kernels are.
 *
 *   launch_stream LAUNCHES RATE FUNCTIONS
 *     RATE: launches per second (paced every 1024 launches); 0: as fast as it can
 * Prints: LAUNCHES SECONDS LAUNCHES_PER_SECOND
 */
#include <stdint.h>
#include <time.h>

#include "cuda_api.h"

#define ALLOCATIONS 16
#define FUNCTIONS_MAX 64

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: launch_stream LAUNCHES RATE FUNCTIONS\n");
        return 2;
    }
    long launches = atol(argv[1]);
    double rate = atof(argv[2]);
    int functions = atoi(argv[3]);
    if (launches <= 0 || rate < 0 || functions < 1 || functions > FUNCTIONS_MAX) {
        fprintf(stderr, "launch_stream: LAUNCHES > 0, RATE >= 0, 1 <= FUNCTIONS <= %d\n", FUNCTIONS_MAX);
        return 2;
    }
    cuda_api_load(&api, 0);
    cuda_api_start(&api);

    const size_t sizes[] = {8, 8}, aligns[] = {8, 8};
    CUmodule module;
    CUfunction kernel[FUNCTIONS_MAX];
    char name[32];
    for (int f = 0; f < functions; f++) {
        snprintf(name, sizeof name, "step_kernel_%d", f);
        if (fakecuda_register_noop_kernel(name, 2, sizes, aligns))
            return 3;
    }
    CHECK(cuModuleLoadData(&module, "fakecuda"));
    for (int f = 0; f < functions; f++) {
        snprintf(name, sizeof name, "step_kernel_%d", f);
        CHECK(cuModuleGetFunction(&kernel[f], module, name));
    }
    CUstream stream;
    CHECK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
    CUdeviceptr buffer[ALLOCATIONS];
    for (int i = 0; i < ALLOCATIONS; i++)
        CHECK(cuMemAllocManaged(&buffer[i], 2 << 20, CU_MEM_ATTACH_GLOBAL));

    double start = now_s();
    for (long i = 0; i < launches; i++) {
        int f = (int)(i % functions);
        void *params[] = {&buffer[f % ALLOCATIONS], &buffer[(f + 1) % ALLOCATIONS]};
        CHECK(cuLaunchKernel(kernel[f], 1, 1, 1, 1, 1, 1, 0, stream, params, NULL));
        if (rate > 0 && (i & 1023) == 1023) {
            double ahead = (double)(i + 1) / rate - (now_s() - start);
            if (ahead > 0) {
                struct timespec pause = {(time_t)ahead, (long)((ahead - (double)(time_t)ahead) * 1e9)};
                nanosleep(&pause, NULL);
            }
        }
    }
    CHECK(cuStreamSynchronize(stream));
    double elapsed = now_s() - start;
    for (int i = 0; i < ALLOCATIONS; i++)
        CHECK(cuMemFree(buffer[i]));
    printf("%ld %.6f %.0f\n", launches, elapsed, (double)launches / elapsed);
    return 0;
}
