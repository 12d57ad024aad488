/* touch.c: the acceptance program. Its kernels touch 256 MiB of managed
 * memory (four 64 MiB buffers) that the host wrote first, through every
 * launch form: kernelParams, a pointer inside a struct argument, the `extra`
 * buffer, cuLaunchKernelEx, a cooperative launch, a CUkernel handle, and a
 * graph replay. It prints one JSON line: a checksum of every result, the GPU
 * faults fakecuda counted, and the faults expected with no prefetching.
 *
 *   touch [ITERATIONS [--capture] [--decoy] [--device=N]]
 * Between iterations the host rewrites buffer A (its pages go back to the
 * host), so later iterations test that residency beliefs expire.
 * --capture: the last kernel is captured into a graph and replayed.
 * --decoy: one more kernel takes an integer that happens to equal an address
 * inside a fifth allocation it never touches: the extent rule's cost.
 * --device=N: run on device N (prefetches must go to the kernel's device).
 * Built twice: linked against libcuda, and (PUMP_TEST_PROCADDR) through
 * dlopen + cuGetProcAddress with per-thread-default-stream variants.
 */
#include <stdint.h>
#include <string.h>

#include "cuda_api.h"

#define BUFFER_FLOATS ((size_t)16 << 20) /* 64 MiB of floats */
#define PAGE (64u << 10)                 /* fakecuda's fault granularity */

struct axpy_args {
    float *x;
    float *y;
    uint64_t n;
    float a;
};

static void axpy_kernel(void **params, const fakecuda_dims *dims)
{
    (void)dims;
    const struct axpy_args *args = params[0];
    api.touch(args->x, args->n * sizeof(float));
    api.touch(args->y, args->n * sizeof(float));
    for (uint64_t i = 0; i < args->n; i++)
        args->y[i] += args->a * args->x[i];
}

static void negate_kernel(void **params, const fakecuda_dims *dims)
{
    (void)dims;
    float *x = arg_floats(params, 0);
    uint64_t n = arg_u64(params, 1);
    api.touch(x, n * sizeof *x);
    for (uint64_t i = 0; i < n; i++)
        x[i] = -x[i];
}

/* Tags x with an integer it never dereferences (the decoy). */
static void tag_kernel(void **params, const fakecuda_dims *dims)
{
    (void)dims;
    float *x = arg_floats(params, 0);
    api.touch(x, sizeof *x);
    x[0] += 0.0f * (float)arg_u64(params, 1);
}

static void register_kernels(void)
{
    const size_t p8 = 8, f4 = 4;
    const size_t scale_sizes[] = {p8, p8, f4}, scale_aligns[] = {p8, p8, f4};
    const size_t axpy_sizes[] = {sizeof(struct axpy_args)}, axpy_aligns[] = {8};
    const size_t sum_sizes[] = {p8, p8, p8}, sum_aligns[] = {p8, p8, p8};
    const size_t add_sizes[] = {p8, p8, p8, p8}, add_aligns[] = {p8, p8, p8, p8};
    const size_t neg_sizes[] = {p8, p8}, neg_aligns[] = {p8, p8};
    const size_t tag_sizes[] = {p8, p8}, tag_aligns[] = {p8, p8};
    if (api.register_kernel("scale", scale_kernel, 3, scale_sizes, scale_aligns) ||
        api.register_kernel("axpy", axpy_kernel, 1, axpy_sizes, axpy_aligns) ||
        api.register_kernel("sum", sum_kernel, 3, sum_sizes, sum_aligns) ||
        api.register_kernel("add", add_kernel, 4, add_sizes, add_aligns) ||
        api.register_kernel("negate", negate_kernel, 2, neg_sizes, neg_aligns) ||
        api.register_kernel("tag", tag_kernel, 2, tag_sizes, tag_aligns)) {
        fprintf(stderr, "error: kernel registration failed\n");
        exit(3);
    }
}

int main(int argc, char **argv)
{
    int iterations = argc > 1 ? atoi(argv[1]) : 1;
    int capture = 0, decoy = 0, device = 0;
    for (int i = 2; i < argc; i++) {
        if (strcmp(argv[i], "--capture") == 0)
            capture = 1;
        else if (strcmp(argv[i], "--decoy") == 0)
            decoy = 1;
        else if (strncmp(argv[i], "--device=", 9) == 0)
            device = atoi(argv[i] + 9);
        else {
            fprintf(stderr, "usage: touch [ITERATIONS [--capture] [--decoy] [--device=N]]\n");
            return 2;
        }
    }
#ifdef PUMP_TEST_PROCADDR
    int per_thread = 1;
#else
    int per_thread = 0;
#endif
    int missing = cuda_api_load(&api, per_thread);
    if (missing) {
        fprintf(stderr, "no CUDA driver\n");
        return missing;
    }
    cuda_api_start_on(&api, device);
    register_kernels();

    CUmodule module;
    CUfunction scale, axpy, sum, add, tag;
    CUlibrary library;
    CUkernel negate;
    CHECK(api.module_load_data(&module, "fakecuda"));
    CHECK(api.module_get_function(&scale, module, "scale"));
    CHECK(api.module_get_function(&axpy, module, "axpy"));
    CHECK(api.module_get_function(&sum, module, "sum"));
    CHECK(api.module_get_function(&add, module, "add"));
    CHECK(api.module_get_function(&tag, module, "tag"));
    CHECK(api.library_load_data(&library, "fakecuda", NULL, NULL, 0, NULL, NULL, 0));
    CHECK(api.library_get_kernel(&negate, library, "negate"));

    /* The per-thread build launches on its (implicit) per-thread stream. */
    CUstream stream = NULL;
    if (!per_thread)
        CHECK(api.stream_create(&stream, CU_STREAM_NON_BLOCKING));

    CUdeviceptr a, b, c, d, e = 0, out;
    CHECK(api.mem_alloc_managed(&a, BUFFER_FLOATS * 4, CU_MEM_ATTACH_GLOBAL));
    CHECK(api.mem_alloc_managed(&b, BUFFER_FLOATS * 4, CU_MEM_ATTACH_GLOBAL));
    CHECK(api.mem_alloc_managed(&c, BUFFER_FLOATS * 4, CU_MEM_ATTACH_GLOBAL));
    CHECK(api.mem_alloc_managed(&d, BUFFER_FLOATS * 4, CU_MEM_ATTACH_GLOBAL));
    CHECK(api.mem_alloc(&out, sizeof(double)));
    if (decoy) {
        CHECK(api.mem_alloc_managed(&e, 16 << 20, CU_MEM_ATTACH_GLOBAL));
        api.host_touch((void *)e, 16 << 20);
        memset((void *)e, 0, 16 << 20);
    }
    float *fa = (float *)a, *fb = (float *)b, *fc = (float *)c, *fd = (float *)d;
    host_fill(fa, BUFFER_FLOATS, 1.0f);
    host_fill(fb, BUFFER_FLOATS, 2.0f);
    host_fill(fc, BUFFER_FLOATS, 3.0f);
    host_fill(fd, BUFFER_FLOATS, 4.0f);
    api.reset_stats();

    uint64_t n = BUFFER_FLOATS;
    float two = 2.0f, half = 0.5f;
    struct axpy_args axpy_args = {fa, fb, n, 2.0f};
    double checksum_sum = 0;
    uint64_t expected_faults = 0;
    uint64_t pages = BUFFER_FLOATS * 4 / PAGE;

    for (int it = 0; it < iterations; it++) {
        if (it > 0) {
            host_fill(fa, BUFFER_FLOATS, (float)it); /* A goes back to the host */
            expected_faults += pages;
        } else {
            expected_faults += 4 * pages;
        }
        void *negate_params[] = {&d, &n};
        CUgraphExec replay = NULL;
        if (capture) {
            /* Captured before D is prefetched this iteration: pump must add
             * nothing to the capturing stream; the replay at the end runs it. */
            CUstream side, joiner;
            CUevent forked, joined;
            CUgraph graph;
            CHECK(api.stream_create(&side, CU_STREAM_NON_BLOCKING));
            CHECK(api.stream_create(&joiner, CU_STREAM_NON_BLOCKING));
            CHECK(api.event_create(&forked, CU_EVENT_DISABLE_TIMING));
            CHECK(api.event_create(&joined, CU_EVENT_DISABLE_TIMING));
            CHECK(api.stream_begin_capture(side, CU_STREAM_CAPTURE_MODE_GLOBAL));
            CHECK(api.launch_kernel((CUfunction)negate, 1, 1, 1, 256, 1, 1, 0, side, negate_params, NULL));
            /* A second stream joins the capture through an event wait; its
             * launch (a scale by one) is captured too. */
            CHECK(api.event_record(forked, side));
            CHECK(api.stream_wait_event(joiner, forked, 0));
            float one = 1.0f;
            void *identity_params[] = {&d, &n, &one};
            CHECK(api.launch_kernel(scale, 1, 1, 1, 256, 1, 1, 0, joiner, identity_params, NULL));
            CHECK(api.event_record(joined, joiner));
            CHECK(api.stream_wait_event(side, joined, 0));
            CHECK(api.stream_end_capture(side, &graph));
            CHECK(api.graph_instantiate(&replay, graph, 0));
        }
        void *scale_params[] = {&a, &n, &two};
        CHECK(api.launch_kernel(scale, 1, 1, 1, 256, 1, 1, 0, stream, scale_params, NULL));

        void *axpy_params[] = {&axpy_args};
        CHECK(api.launch_kernel(axpy, 1, 1, 1, 256, 1, 1, 0, stream, axpy_params, NULL));

        /* `extra` form: the arguments packed in one buffer, device layout. */
        struct {
            CUdeviceptr x;
            uint64_t n;
            CUdeviceptr out;
        } packed = {b, n, out};
        size_t packed_size = sizeof packed;
        void *extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, &packed, CU_LAUNCH_PARAM_BUFFER_SIZE, &packed_size,
                         CU_LAUNCH_PARAM_END};
        CHECK(api.launch_kernel(sum, 1, 1, 1, 256, 1, 1, 0, stream, NULL, extra));

        CUlaunchConfig config = {.gridDimX = 1, .gridDimY = 1, .gridDimZ = 1, .blockDimX = 256,
                                 .blockDimY = 1, .blockDimZ = 1, .hStream = stream};
        void *add_params[] = {&a, &b, &c, &n};
        CHECK(api.launch_kernel_ex(&config, add, add_params, NULL));

        void *coop_params[] = {&d, &n, &half};
        CHECK(api.launch_cooperative_kernel(scale, 1, 1, 1, 256, 1, 1, 0, stream, coop_params));

        if (decoy) {
            uint64_t looks_like_a_pointer = e + 4096;
            void *tag_params[] = {&c, &looks_like_a_pointer};
            CHECK(api.launch_kernel(tag, 1, 1, 1, 1, 1, 1, 0, stream, tag_params, NULL));
        }
        if (replay != NULL)
            CHECK(api.graph_launch(replay, stream));
        else
            CHECK(api.launch_kernel((CUfunction)negate, 1, 1, 1, 256, 1, 1, 0, stream, negate_params, NULL));
        CHECK(api.stream_synchronize(stream));
        double s;
        memcpy(&s, (void *)out, sizeof s);
        checksum_sum += s;
    }

    struct fakecuda_stats stats;
    api.get_stats(&stats);
    uint64_t h = 0xcbf29ce484222325ull;
    api.host_touch(fa, n * 4);
    api.host_touch(fb, n * 4);
    api.host_touch(fc, n * 4);
    api.host_touch(fd, n * 4);
    h = fnv1a(h, fa, n * 4);
    h = fnv1a(h, fb, n * 4);
    h = fnv1a(h, fc, n * 4);
    h = fnv1a(h, fd, n * 4);
    h = fnv1a(h, &checksum_sum, sizeof checksum_sum);
    printf("{\"checksum\": \"%016llx\", \"gpu_faults\": %llu, \"expected_faults\": %llu, "
           "\"pages_touched\": %llu, \"bytes_prefetched_h2d\": %llu, \"bytes_prefetched_unused\": %llu, "
           "\"kernels_run\": %llu, \"batch_prefetch_calls\": %llu}\n",
           (unsigned long long)h, (unsigned long long)stats.gpu_faults, (unsigned long long)expected_faults,
           (unsigned long long)stats.pages_touched_by_kernels, (unsigned long long)stats.bytes_prefetched_h2d,
           (unsigned long long)stats.bytes_prefetched_unused, (unsigned long long)stats.kernels_run,
           (unsigned long long)stats.batch_prefetch_calls);
    CHECK(api.mem_free(a));
    CHECK(api.mem_free(b));
    CHECK(api.mem_free(c));
    CHECK(api.mem_free(d));
    CHECK(api.mem_free(out));
    if (decoy)
        CHECK(api.mem_free(e));
    return 0;
}
