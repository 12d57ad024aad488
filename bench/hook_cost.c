/* hook_cost.c: times launches of a fakecuda kernel that does nothing (its
 * launch returns at once), so what a shim adds per launch stands out.
 * scripts/bench-hook runs it with and without libpump and subtracts.
 *
 *   hook_cost SCENARIO LAUNCHES
 *     plain    4 pointer arguments into plain device memory (managed
 *              allocations exist elsewhere)
 *     managed  4 pointer arguments into managed allocations believed resident
 *     wide     one 4 KiB struct argument of plain-memory pointers (the scan's
 *              cost per KiB of arguments)
 * Prints: SCENARIO LAUNCHES NANOSECONDS_PER_LAUNCH
 */
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "cuda_api.h"

#define WIDE_WORDS 512 /* 4 KiB */

static double now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: hook_cost plain|managed|wide LAUNCHES\n");
        return 2;
    }
    const char *scenario = argv[1];
    long launches = atol(argv[2]);
    cuda_api_load(&api, 0);
    cuda_api_start(&api);

    const size_t four[] = {8, 8, 8, 8}, wide[] = {WIDE_WORDS * 8}, align[] = {8, 8, 8, 8};
    int is_wide = strcmp(scenario, "wide") == 0;
    if (is_wide ? fakecuda_register_noop_kernel("noop", 1, wide, align)
                : fakecuda_register_noop_kernel("noop", 4, four, align))
        return 3;
    CUmodule module;
    CUfunction noop;
    CHECK(cuModuleLoadData(&module, "fakecuda"));
    CHECK(cuModuleGetFunction(&noop, module, "noop"));
    CUstream stream;
    CHECK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));

    /* Managed allocations exist in every scenario, as in a real job. */
    CUdeviceptr managed[4], plain[4];
    for (int i = 0; i < 4; i++) {
        CHECK(cuMemAllocManaged(&managed[i], 2 << 20, CU_MEM_ATTACH_GLOBAL));
        CHECK(cuMemAlloc(&plain[i], 2 << 20));
    }
    CUdeviceptr *args = strcmp(scenario, "managed") == 0 ? managed : plain;
    uint64_t wide_arg[WIDE_WORDS];
    for (int i = 0; i < WIDE_WORDS; i++)
        wide_arg[i] = plain[i % 4] + (uint64_t)i * 8;
    void *params4[] = {&args[0], &args[1], &args[2], &args[3]};
    void *params_wide[] = {wide_arg};
    void **params = is_wide ? params_wide : params4;

    /* Warm up: caches filled, managed allocations prefetched once. */
    for (int i = 0; i < 1000; i++)
        CHECK(cuLaunchKernel(noop, 1, 1, 1, 1, 1, 1, 0, stream, params, NULL));
    CHECK(cuStreamSynchronize(stream));
    double start = now_ns();
    for (long i = 0; i < launches; i++)
        cuLaunchKernel(noop, 1, 1, 1, 1, 1, 1, 0, stream, params, NULL);
    double elapsed = now_ns() - start;
    CHECK(cuStreamSynchronize(stream));
    printf("%s %ld %.2f\n", scenario, launches, elapsed / (double)launches);
    return 0;
}
