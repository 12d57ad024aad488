/* steady_steps.c: training steps that each end with a synchronisation, as `.item()` makes
 * them (tests/test_residency.py): weights kept, an activation allocated, written, read and
 * freed every step, the same memory handed out again each time. Per step it prints what the
 * driver saw of pump: prefetch calls (single and batched), bytes prefetched to the device,
 * and the context queries made (cuCtxGetCurrent, cuStreamGetCtx, ...). One JSON line.
 * Why an imitation, not the real client (tests/test_real_client*.py): exact
 * per-step counts over a fixed pattern, faults of discarded memory handed out again (real
 * kernels are no-ops on fakecuda: they fault nothing), two devices, the sanitizer builds.
 *
 *   steady_steps STEPS caching|managed|pluggable|switch|split
 *
 * caching: PyTorch's caching allocator (tests/c/torch_caching.h) on segments from cuMemAlloc
 *   (which managed_all makes managed), each tensor reported to libpump, on the legacy stream.
 * managed: the same on segments the program allocates managed itself (cuMemAllocManaged).
 * pluggable: pump's allocator (pump_torch_alloc/free, else cuMemAllocAsync/cuMemFreeAsync)
 *   on a non-blocking stream: each dead activation is discarded before its memory is handed
 *   out again.
 * switch: as managed, on two devices (FAKECUDA_DEVICES=2): each step makes device step % 2's
 *   primary context current (cuCtxSetCurrent) and launches on the legacy stream, which then
 *   belongs to that context.
 * split: as caching, the activation's memory handed out each step as PyTorch's allocator splits
 *   and merges its blocks: one tensor, then two split 2.5 MiB in, then two split 1 MiB in, and
 *   again (each piece a forward and an update of its own), so that a tensor is carved over freed
 *   tensors of other extents.
 */
#include <stddef.h>
#include <string.h>
#include <sys/types.h>

#include "torch_program.h"

#define WEIGHTS ((size_t)8 << 20)
#define ACTIVATION ((size_t)6 << 20)
#define MAX_STEPS 64

enum mode { CACHING, MANAGED, PLUGGABLE, SWITCH, SPLIT };
#define MODES 5
static enum mode mode;
static CUstream stream;
static struct torch_caching cache = {.segment_size = 20 << 20, .report = true};

static CUdeviceptr tensor_alloc(size_t bytes)
{
    return torch_tensor_alloc(&cache, mode == PLUGGABLE, bytes, stream);
}

static void tensor_free(CUdeviceptr p, size_t bytes)
{
    torch_tensor_free(&cache, mode == PLUGGABLE, p, bytes, stream);
}

/* out[i] = w[i % nw] * 0.5 + step over (w, out, nw, n, step). */
static void forward_kernel(void **params, const fakecuda_dims *dims)
{
    (void)dims;
    const float *w = arg_floats(params, 0);
    float *out = arg_floats(params, 1);
    uint64_t nw = arg_u64(params, 2), n = arg_u64(params, 3);
    api.touch(w, nw * sizeof *w);
    api.touch(out, n * sizeof *out);
    for (uint64_t i = 0; i < n; i += 1024)
        out[i] = w[i % nw] * 0.5f + *(float *)params[4];
}

/* w[i] += out[i] * 0.001 over (w, out, nw, n). */
static void update_kernel(void **params, const fakecuda_dims *dims)
{
    (void)dims;
    float *w = arg_floats(params, 0);
    const float *out = arg_floats(params, 1);
    uint64_t nw = arg_u64(params, 2), n = arg_u64(params, 3);
    api.touch(w, nw * sizeof *w);
    api.touch(out, n * sizeof *out);
    for (uint64_t i = 0; i < n && i < nw; i += 1024)
        w[i] += out[i] * 0.001f;
}

static CUfunction function(CUmodule module, const char *name, fakecuda_kernel_fn kernel, unsigned count)
{
    const size_t sizes[] = {8, 8, 8, 8, 4}, aligns[] = {8, 8, 8, 8, 4};
    if (api.register_kernel(name, kernel, count, sizes, aligns)) {
        fprintf(stderr, "error: kernel registration failed\n");
        exit(3);
    }
    CUfunction f;
    CHECK(cuModuleGetFunction(&f, module, name));
    return f;
}

struct counts {
    uint64_t prefetch_calls, bytes_prefetched, context_queries;
};

static struct counts counts_now(void)
{
    struct fakecuda_stats st;
    struct fakecuda_entry_cost context;
    api.get_stats(&st);
    if (fakecuda_get_entry_cost("context_query", &context) != 0)
        context.calls = 0;
    return (struct counts){st.prefetch_calls + st.batch_prefetch_calls, st.bytes_prefetched_h2d, context.calls};
}

static void print_list(const char *name, const struct counts *c, int steps, size_t offset)
{
    printf("\"%s\": [", name);
    for (int s = 0; s < steps; s++) {
        uint64_t before, after;
        memcpy(&before, (const char *)&c[s] + offset, sizeof before);
        memcpy(&after, (const char *)&c[s + 1] + offset, sizeof after);
        printf("%s%llu", s ? ", " : "", (unsigned long long)(after - before));
    }
    printf("]");
}

int main(int argc, char **argv)
{
    static const char *const modes[MODES] = {"caching", "managed", "pluggable", "switch", "split"};
    int steps = argc == 3 ? atoi(argv[1]) : 0, chosen = -1;
    for (int m = 0; argc == 3 && m < MODES; m++)
        if (strcmp(argv[2], modes[m]) == 0)
            chosen = m;
    if (steps < 1 || steps > MAX_STEPS || chosen < 0) {
        fprintf(stderr, "usage: steady_steps STEPS(1..%d) caching|managed|pluggable|switch|split\n", MAX_STEPS);
        return 2;
    }
    mode = (enum mode)chosen;
    cache.managed = mode == MANAGED || mode == SWITCH;
    cuda_api_load(&api, 0);
    cuda_api_start(&api);
    CUcontext primary[2] = {NULL, NULL};
    for (int d = 0; mode == SWITCH && d < 2; d++) {
        CUdevice device;
        CHECK(api.device_get(&device, d));
        CHECK(api.primary_ctx_retain(&primary[d], device));
    }
    CUmodule module;
    CHECK(cuModuleLoadData(&module, "fakecuda"));
    CUfunction forward = function(module, "forward", forward_kernel, 5);
    CUfunction update = function(module, "update", update_kernel, 4);
    if (mode == PLUGGABLE)
        CHECK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));

    CUdeviceptr w = tensor_alloc(WEIGHTS);
    /* split: the activation's memory, one block of the allocator's that its steps carve anew */
    CUdeviceptr activation = 0;
    if (mode == SPLIT) {
        activation = tensor_alloc(ACTIVATION);
        tensor_free(activation, ACTIVATION);
    }
    uint64_t nw = WEIGHTS / sizeof(float);
    struct counts at[MAX_STEPS + 1];
    at[0] = counts_now();
    for (int s = 0; s < steps; s++) {
        if (mode == SWITCH)
            CHECK(api.ctx_set_current(primary[s % 2]));
        /* The activation's pieces this step: where each ends (split: the layout of step s % 3). */
        static const size_t split_at[3][2] = {{ACTIVATION}, {5 << 19, ACTIVATION}, {1 << 20, ACTIVATION}};
        const size_t *ends = mode == SPLIT ? split_at[s % 3] : split_at[0];
        int pieces = ends[1] != 0 ? 2 : 1;
        CUdeviceptr out = mode == SPLIT ? activation : tensor_alloc(ACTIVATION);
        float step = (float)s;
        for (int k = 0; k < pieces; k++) {
            size_t from = k > 0 ? ends[k - 1] : 0, bytes = ends[k] - from;
            CUdeviceptr piece = out + from;
            uint64_t np = bytes / sizeof(float);
            if (mode == SPLIT)
                torch_caching_report(&cache, PUMP_TORCH_TENSOR_ALLOC, piece, bytes);
            void *forward_params[] = {&w, &piece, &nw, &np, &step};
            CHECK(cuLaunchKernel(forward, 1, 1, 1, 1, 1, 1, 0, stream, forward_params, NULL));
            void *update_params[] = {&w, &piece, &nw, &np};
            CHECK(cuLaunchKernel(update, 1, 1, 1, 1, 1, 1, 0, stream, update_params, NULL));
        }
        for (int k = 0; k < pieces && mode == SPLIT; k++)
            torch_caching_report(&cache, PUMP_TORCH_TENSOR_FREE, out + (k > 0 ? ends[k - 1] : 0), 0);
        if (mode != SPLIT)
            tensor_free(out, ACTIVATION);
        CHECK(cuStreamSynchronize(stream));  /* .item() */
        at[s + 1] = counts_now();
    }
    float *host_w = (float *)(uintptr_t)w;
    api.host_touch(host_w, WEIGHTS);
    double checksum = 0;
    for (uint64_t i = 0; i < nw; i += 1024)
        checksum += (double)host_w[i];
    tensor_free(w, WEIGHTS);
    CHECK(cuStreamSynchronize(stream));
    struct fakecuda_stats st;
    api.get_stats(&st);
    printf("{\"checksum\": %.6f, \"gpu_faults\": %llu, ", checksum, (unsigned long long)st.gpu_faults);
    print_list("prefetch_calls", at, steps, offsetof(struct counts, prefetch_calls));
    printf(", ");
    print_list("bytes_prefetched", at, steps, offsetof(struct counts, bytes_prefetched));
    printf(", ");
    print_list("context_queries", at, steps, offsetof(struct counts, context_queries));
    printf("}\n");
    return 0;
}
