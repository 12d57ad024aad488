/* use_recycle.c: a wait on a use token whose event slot was recorded again since (issue 42,
 * risk 1), for tests/test_use_recycle.py. One JSON line.
 * Why an imitation, not the real client (tests/test_real_client*.py): a specific race, a reader
 * held on one stream while another overwrites what it is about to read, and its value (real
 * kernels are no-ops on fakecuda).
 *
 *   use_recycle USES
 *
 * Under managed_all with a driver that refuses to prefetch a managed pool's memory
 * (FAKECUDA_POOL_PREFETCH=refuse), stream-ordered allocations come from pump's cache of
 * cuMemAllocManaged blocks (shim/policy/managed_all_cache.c): a free keeps its block with a use token
 * recorded on the freeing stream, and an allocation of that size on another stream takes the
 * block once that stream waits, on the GPU, for the token. A context records its use tokens
 * in a ring of 1,024 events.
 *
 * Stream A: X is filled, a host function holds A, a reader sums X, X is freed. Stream C: USES
 * launches over a buffer of its own (under a budget each records a use event, so past 1,024 the
 * free's slot is recorded again). Stream B: Y of X's size is allocated (pump hands it X's
 * block) and overwritten. Then A is let go. The reader's sum must be X's: B's overwrite must
 * wait for A's reader, however many uses came between. */
#include <stdatomic.h>
#include <stdbool.h>
#include <time.h>

#include "torch_program.h"

#define FLOATS ((size_t)1 << 20) /* 4 MiB: two whole blocks */
#define BYTES (FLOATS * sizeof(float))
#define MAX_USES 100000

static CUfunction fill, sum, touch;

/* x[0] += 1 over (float *x). */
static void touch_kernel(void **params, const fakecuda_dims *dims)
{
    (void)dims;
    float *x = arg_floats(params, 0);
    api.touch(x, sizeof *x);
    x[0] += 1.0f;
}

static void fill_on(CUstream s, CUdeviceptr x, float base)
{
    uint64_t n = FLOATS;
    void *params[] = {&x, &n, &base};
    CHECK(cuLaunchKernel(fill, 1, 1, 1, 1, 1, 1, 0, s, params, NULL));
}

int main(int argc, char **argv)
{
    int uses = argc == 2 ? atoi(argv[1]) : 0;
    if (uses < 1 || uses > MAX_USES) {
        fprintf(stderr, "usage: use_recycle USES (1..%d)\n", MAX_USES);
        return 2;
    }
    cuda_api_load(&api, 0);
    cuda_api_start(&api);
    const size_t fill_sizes[] = {8, 8, 4}, sum_sizes[] = {8, 8, 8}, touch_sizes[] = {8};
    fill = cuda_api_kernel("fill", pattern_kernel, 3, fill_sizes, fill_sizes);
    sum = cuda_api_kernel("sum", sum_kernel, 3, sum_sizes, sum_sizes);
    touch = cuda_api_kernel("touch", touch_kernel, 1, touch_sizes, touch_sizes);
    CUstream a, b, c;
    CHECK(cuStreamCreate(&a, CU_STREAM_NON_BLOCKING));
    CHECK(cuStreamCreate(&b, CU_STREAM_NON_BLOCKING));
    CHECK(cuStreamCreate(&c, CU_STREAM_NON_BLOCKING));
    CUdeviceptr out, busy, x, y;
    CHECK(cuMemAlloc(&out, sizeof(double)));
    CHECK(cuMemAlloc(&busy, 2 << 20));

    atomic_int release = 0;
    CHECK(cuMemAllocAsync(&x, BYTES, a));
    fill_on(a, x, 1.0f);
    CHECK(cuLaunchHostFunc(a, fake_hold, &release));
    uint64_t n = FLOATS;
    void *sum_params[] = {&x, &n, &out};
    CHECK(cuLaunchKernel(sum, 1, 1, 1, 1, 1, 1, 0, a, sum_params, NULL));
    CHECK(cuMemFreeAsync(x, a));

    void *touch_params[] = {&busy};
    for (int i = 0; i < uses; i++)
        CHECK(cuLaunchKernel(touch, 1, 1, 1, 1, 1, 1, 0, c, touch_params, NULL));
    CHECK(cuStreamSynchronize(c));

    CHECK(cuMemAllocAsync(&y, BYTES, b));
    fill_on(b, y, 99.0f);
    nanosleep(&(struct timespec){0, 100000000}, NULL); /* B's overwrite runs now, unless it waits */
    atomic_store(&release, 1);
    CHECK(cuCtxSynchronize());
    double result;
    CHECK(cuMemcpyDtoH(&result, out, sizeof result));
    printf("{\"sum\": %.1f, \"reused\": %s}\n", result, x == y ? "true" : "false");
    CHECK(cuMemFreeAsync(y, b));
    CHECK(cuCtxSynchronize());
    return 0;
}
