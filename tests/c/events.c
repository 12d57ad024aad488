/* events.c: a small, predictable stream of events for the daemon channel's
 * tests. Two managed buffers, A (2 MiB, or --a-mib=M) and B (4 MiB); LAUNCHES launches of
 * one kernel, "bump", that adds 1 to every float of A and never touches B.
 *
 *   events LAUNCHES [--sync-every=K] [--wait] [--wait-end] [--long-name] [--a-mib=M] [--dead-b]
 *
 * First line: {"function": F, "a": A, "b": B} (handle and bases, so a test
 * can write a plan naming them). --wait: then wait for a line on stdin
 * before launching. --sync-every=K: synchronize the stream after every K
 * launches (and the context once at the end). --wait-end: after the launches, print
 * {"launched": N} and wait for another line before that last synchronize.
 * --long-name: one extra launch first, of a kernel whose name is 1500
 * characters long. --dead-b: B is told to libpump's bridge as a tensor and freed again before
 * the first line, as a caching allocator's freed block: a freed tensor kept in place (ranges.h).
 * Last line: the result (checksum, fakecuda's counters, syncs made).
 */
#include <string.h>

#include "cuda_api.h"
#include "pump_torch_trace.h"

/* libpump's bridge for a framework's allocator (weak: the bare run has none). */
extern void pump_torch_trace(int event, uint64_t addr, uint64_t size, int flags, CUstream stream)
    __attribute__((weak));

#define B_FLOATS ((size_t)1 << 20)   /* 4 MiB */
#define LONG_NAME_LENGTH 1500

static void wait_for_line(void)
{
    char line[64];
    if (fgets(line, sizeof line, stdin) == NULL) {
        fprintf(stderr, "error: stdin closed\n");
        exit(5);
    }
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: events LAUNCHES [--sync-every=K] [--wait] [--wait-end] [--long-name] [--a-mib=M] "
                        "[--dead-b]\n");
        return 2;
    }
    long launches = atol(argv[1]), sync_every = 0;
    size_t a_floats = (size_t)512 << 10; /* 2 MiB */
    int wait = 0, wait_end = 0, long_name = 0, dead_b = 0;
    for (int i = 2; i < argc; i++) {
        if (strncmp(argv[i], "--sync-every=", 13) == 0)
            sync_every = atol(argv[i] + 13);
        else if (strcmp(argv[i], "--wait") == 0)
            wait = 1;
        else if (strcmp(argv[i], "--wait-end") == 0)
            wait_end = 1;
        else if (strncmp(argv[i], "--a-mib=", 8) == 0 && atol(argv[i] + 8) > 0)
            a_floats = (size_t)atol(argv[i] + 8) << 18;
        else if (strcmp(argv[i], "--long-name") == 0)
            long_name = 1;
        else if (strcmp(argv[i], "--dead-b") == 0)
            dead_b = 1;
        else {
            fprintf(stderr, "events: unknown option %s\n", argv[i]);
            return 2;
        }
    }
    if (cuda_api_load(&api, 0)) {
        fprintf(stderr, "no CUDA driver\n");
        return 4;
    }
    cuda_api_start(&api);
    const size_t sizes[] = {8, 8}, aligns[] = {8, 8};
    static char long_kernel[LONG_NAME_LENGTH + 1];
    for (int i = 0; i < LONG_NAME_LENGTH; i++)
        long_kernel[i] = (char)('a' + i % 26);
    if (api.register_kernel("bump", inc_kernel, 2, sizes, aligns) ||
        api.register_kernel(long_kernel, inc_kernel, 2, sizes, aligns)) {
        fprintf(stderr, "error: kernel registration failed\n");
        return 3;
    }
    CUmodule module;
    CUfunction bump, long_function;
    CHECK(api.module_load_data(&module, "fakecuda"));
    CHECK(api.module_get_function(&bump, module, "bump"));
    CHECK(api.module_get_function(&long_function, module, long_kernel));
    CUstream stream;
    CHECK(api.stream_create(&stream, CU_STREAM_NON_BLOCKING));

    CUdeviceptr a, b;
    CHECK(api.mem_alloc_managed(&a, a_floats * sizeof(float), CU_MEM_ATTACH_GLOBAL));
    CHECK(api.mem_alloc_managed(&b, B_FLOATS * sizeof(float), CU_MEM_ATTACH_GLOBAL));
    float *fa = (float *)a, *fb = (float *)b;
    api.host_touch(fa, a_floats * sizeof(float));
    api.host_touch(fb, B_FLOATS * sizeof(float));
    for (size_t i = 0; i < a_floats; i++)
        fa[i] = (float)(i % 7);
    for (size_t i = 0; i < B_FLOATS; i++)
        fb[i] = 1.0f;
    if (dead_b && pump_torch_trace != NULL) {
        pump_torch_trace(PUMP_TORCH_TENSOR_ALLOC, b, B_FLOATS * sizeof(float), 0, stream);
        pump_torch_trace(PUMP_TORCH_TENSOR_FREE, b, 0, 0, stream);
    }
    api.reset_stats();
    printf("{\"function\": %llu, \"long_function\": %llu, \"a\": %llu, \"b\": %llu}\n",
           (unsigned long long)(uintptr_t)bump, (unsigned long long)(uintptr_t)long_function,
           (unsigned long long)a, (unsigned long long)b);
    fflush(stdout);
    if (wait)
        wait_for_line();

    uint64_t n = a_floats;
    void *params[] = {&a, &n};
    long syncs = 0;
    if (long_name)
        CHECK(api.launch_kernel(long_function, 1, 1, 1, 128, 1, 1, 0, stream, params, NULL));
    for (long i = 0; i < launches; i++) {
        CHECK(api.launch_kernel(bump, 1, 1, 1, 128, 1, 1, 0, stream, params, NULL));
        if (sync_every > 0 && (i + 1) % sync_every == 0 && i + 1 < launches) {
            CHECK(api.stream_synchronize(stream));
            syncs++;
        }
    }
    if (wait_end) {
        printf("{\"launched\": %ld}\n", launches);
        fflush(stdout);
        wait_for_line();
    }
    CHECK(api.ctx_synchronize()); /* the whole context: pump's own streams too */
    syncs++;

    struct fakecuda_stats stats;
    api.get_stats(&stats);
    api.host_touch(fa, a_floats * sizeof(float));
    double sum = 0;
    for (size_t i = 0; i < a_floats; i++)
        sum += fa[i];
    CHECK(api.mem_free(a));
    CHECK(api.mem_free(b));
    printf("{\"checksum\": %.1f, \"gpu_faults\": %llu, \"bytes_prefetched_h2d\": %llu, "
           "\"bytes_prefetched_unused\": %llu, \"bytes_d2h\": %llu, \"device_resident_peak\": %llu, "
           "\"kernels_run\": %llu, \"syncs\": %ld}\n",
           sum, (unsigned long long)stats.gpu_faults, (unsigned long long)stats.bytes_prefetched_h2d,
           (unsigned long long)stats.bytes_prefetched_unused, (unsigned long long)stats.bytes_d2h,
           (unsigned long long)stats.device_resident_peak, (unsigned long long)stats.kernels_run, syncs);
    return 0;
}
