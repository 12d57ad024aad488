/* torch_placement.c: a training step's tensors from pump's allocator for PyTorch, with the
 * optimizer's step marks, for tests/test_torch_placement.py (issue 41 item 1: a step's tensors
 * get the addresses they had the step before, shim/policy/placement.c). One JSON line: the checksum
 * of what the steps computed, and each step's allocation addresses in order.
 * Why an imitation, not the real client (tests/test_real_client*.py): exact addresses step by
 * step over a pattern that changes them under a pool handing out the block freed last, values
 * (real kernels are no-ops on fakecuda), and the sanitizer builds.
 *
 *   torch_placement STEPS [eval=K] [side] [shrink=K] [legacy] [sync] [hold]
 *
 * Weights (8 MiB) first; then each step: the last step's gradient freed (zero_grad), two 4 MiB
 * activations and a 2 MiB one (freed last in, first out), two 1 MiB temporaries (freed first in,
 * first out: under FAKECUDA_POOL_REUSE=freed the pool swaps their blocks every step), the 2 MiB
 * gradient (kept past the step's end), the weights updated, and the optimizer's mark
 * (pump_torch_step, when the process has libpump).
 * eval=K: before every K-th step, an evaluation pass (a 4 MiB and a 2 MiB tensor, no mark).
 * side: each step also a 2 MiB tensor on a second stream, allocated, summed and freed there.
 * shrink=K: from step K on, the activations are 3 MiB (a shape that changed: the 4 MiB blocks
 *   are never asked for again).
 * legacy: the step's work on the legacy default stream (PyTorch's), where the driver refuses a
 *   discard, instead of a stream of the program's.
 * sync: each step ends waiting for its work, as a loop reading its loss does (loss.item()).
 * hold: once the activations are written, the GPU goes on with the step only after the host has
 *   made all of its calls (a host function holds the step's stream meanwhile): the activations
 *   are freed before the kernels reading them run; the temporaries are 2 MiB, a whole block.
 */
#include <string.h>

#include "torch_program.h"

#define MIB ((size_t)1 << 20)
#define MAX_STEPS 64
#define PER_STEP 12 /* allocations a step makes at most, its evaluation pass's included */

extern void pump_torch_step(void) __attribute__((weak));

static CUfunction fill, add, sum;
static CUdeviceptr sums; /* a double per sum taken */
static int sums_taken;

static CUdeviceptr steps_at[MAX_STEPS][PER_STEP];
static int steps_made[MAX_STEPS];
static int step_now;

static CUdeviceptr tensor(size_t bytes, CUstream s)
{
    CUdeviceptr p = pluggable_alloc(bytes, s);
    if (p == 0) {
        fprintf(stderr, "error: an allocation of %zu bytes failed\n", bytes);
        exit(3);
    }
    if (step_now >= 0 && steps_made[step_now] < PER_STEP)
        steps_at[step_now][steps_made[step_now]++] = p;
    return p;
}

static void fill_with(CUdeviceptr x, size_t bytes, float base, CUstream s)
{
    uint64_t n = bytes / sizeof(float);
    void *params[] = {&x, &n, &base};
    CHECK(cuLaunchKernel(fill, 1, 1, 1, 1, 1, 1, 0, s, params, NULL));
}

/* c = a + b over the first `bytes` of each. */
static void add_into(CUdeviceptr a, CUdeviceptr b, CUdeviceptr c, size_t bytes, CUstream s)
{
    uint64_t n = bytes / sizeof(float);
    void *params[] = {&a, &b, &c, &n};
    CHECK(cuLaunchKernel(add, 1, 1, 1, 1, 1, 1, 0, s, params, NULL));
}

static void sum_of(CUdeviceptr x, size_t bytes, CUstream s)
{
    uint64_t n = bytes / sizeof(float);
    CUdeviceptr out = sums + (CUdeviceptr)(sums_taken++ * sizeof(double));
    void *params[] = {&x, &n, &out};
    CHECK(cuLaunchKernel(sum, 1, 1, 1, 1, 1, 1, 0, s, params, NULL));
}

static void free_tensor(CUdeviceptr p, size_t bytes, CUstream s)
{
    pluggable_free(p, bytes, s);
}

int main(int argc, char **argv)
{
    int steps = argc >= 2 ? atoi(argv[1]) : 0, eval = 0, shrink = 0;
    bool side = false, legacy = false, sync = false, hold = false, usage = steps < 1 || steps > MAX_STEPS;
    for (int i = 2; i < argc; i++) {
        if (strncmp(argv[i], "eval=", 5) == 0)
            usage |= (eval = atoi(argv[i] + 5)) < 2;
        else if (strncmp(argv[i], "shrink=", 7) == 0)
            usage |= (shrink = atoi(argv[i] + 7)) < 1;
        else if (strcmp(argv[i], "side") == 0)
            side = true;
        else if (strcmp(argv[i], "legacy") == 0)
            legacy = true;
        else if (strcmp(argv[i], "sync") == 0)
            sync = true;
        else if (strcmp(argv[i], "hold") == 0)
            hold = true;
        else
            usage = true;
    }
    if (usage) {
        fprintf(stderr, "usage: torch_placement STEPS (1..%d) [eval=K (K >= 2)] [side] [shrink=K (K >= 1)] [legacy] [sync] [hold]\n", MAX_STEPS);
        return 2;
    }
    cuda_api_load(&api, 0);
    cuda_api_start(&api);
    const size_t fill_sizes[] = {8, 8, 4}, add_sizes[] = {8, 8, 8, 8}, sum_sizes[] = {8, 8, 8};
    fill = cuda_api_kernel("fill", pattern_kernel, 3, fill_sizes, fill_sizes);
    add = cuda_api_kernel("add", add_kernel, 4, add_sizes, add_sizes);
    sum = cuda_api_kernel("sum", sum_kernel, 3, sum_sizes, sum_sizes);
    CUstream main_stream, side_stream;
    CHECK(cuStreamCreate(&main_stream, CU_STREAM_NON_BLOCKING));
    CHECK(cuStreamCreate(&side_stream, CU_STREAM_NON_BLOCKING));
    CHECK(cuMemAlloc(&sums, MAX_STEPS * 8 * sizeof(double)));

    CUstream s = legacy ? CU_STREAM_LEGACY : main_stream;
    step_now = -1;
    CUdeviceptr w = tensor(8 * MIB, s), grad = 0;
    fill_with(w, 8 * MIB, 1.0f, s);
    for (step_now = 0; step_now < steps; step_now++) {
        float base = (float)step_now;
        atomic_int release = 0;
        if (eval && step_now > 0 && step_now % eval == 0) {
            CUdeviceptr e1 = tensor(4 * MIB, s), e2 = tensor(2 * MIB, s);
            add_into(w, w, e1, 4 * MIB, s);
            fill_with(e2, 2 * MIB, base, s);
            add_into(e1, e2, e2, 2 * MIB, s);
            sum_of(e2, 2 * MIB, s);
            free_tensor(e2, 2 * MIB, s);
            free_tensor(e1, 4 * MIB, s);
        }
        if (grad != 0)
            free_tensor(grad, 2 * MIB, s);
        size_t act = shrink && step_now >= shrink ? 3 * MIB : 4 * MIB, tmp = hold ? 2 * MIB : MIB;
        CUdeviceptr a1 = tensor(act, s), a2 = tensor(act, s), a3 = tensor(2 * MIB, s);
        fill_with(a1, act, base, s);
        add_into(a1, w, a2, act, s);
        fill_with(a3, 2 * MIB, base * 0.5f, s);
        if (hold)
            CHECK(cuLaunchHostFunc(s, fake_hold, &release));
        CUdeviceptr t1 = tensor(tmp, s), t2 = tensor(tmp, s);
        add_into(a2, a3, t1, tmp, s);
        add_into(t1, a1, t2, tmp, s);
        free_tensor(t1, tmp, s);
        sum_of(t2, tmp, s);
        free_tensor(t2, tmp, s);
        free_tensor(a3, 2 * MIB, s);
        grad = tensor(2 * MIB, s);
        add_into(a2, a1, grad, 2 * MIB, s);
        free_tensor(a2, act, s);
        free_tensor(a1, act, s);
        if (side) {
            CUdeviceptr x = tensor(2 * MIB, side_stream);
            fill_with(x, 2 * MIB, base + 3.0f, side_stream);
            sum_of(x, 2 * MIB, side_stream);
            free_tensor(x, 2 * MIB, side_stream);
        }
        add_into(w, grad, w, 2 * MIB, s);
        sum_of(w, 8 * MIB, s);
        if (pump_torch_step != NULL)
            pump_torch_step();
        atomic_store(&release, 1);
        if (sync || hold)  /* the flag lives until the host function read it */
            CHECK(cuStreamSynchronize(s));
    }
    free_tensor(grad, 2 * MIB, s);
    free_tensor(w, 8 * MIB, s);
    CHECK(cuCtxSynchronize());
    double taken[MAX_STEPS * 8], checksum = 0;
    CHECK(cuMemcpyDtoH(taken, sums, (size_t)sums_taken * sizeof(double)));
    for (int i = 0; i < sums_taken; i++)
        checksum += taken[i] * (double)(i % 7 + 1);
    printf("{\"checksum\": %.3f, \"steps\": [", checksum);
    for (int i = 0; i < steps; i++) {
        printf("%s[", i ? ", " : "");
        for (int k = 0; k < steps_made[i]; k++)
            printf("%s%llu", k ? ", " : "", (unsigned long long)steps_at[i][k]);
        printf("]");
    }
    printf("]}\n");
    return 0;
}
