/* budget.c: a working set larger than a budget, for the budget's tests.
 * BUFFERS managed buffers of MIB MiB each, written by the host; then ROUNDS
 * rounds in which launch i (of BUFFERS per round) runs "mix" over buffers i
 * and i+1: x = x / 2 + y, every float. Each launch needs two buffers, the
 * whole set needs all of them, so under a smaller budget pump must evict.
 *
 *   budget BUFFERS MIB ROUNDS [--kernel-us=U] [--neighbour=FROM:TO:MIB]
 * --kernel-us=U: each kernel waits U microseconds before it touches its
 * buffers, so an eviction not ordered after it would move them away first
 * (and the kernel would fault them back).
 * --neighbour=FROM:TO:MIB: each round ends with a synchronisation; after
 * round FROM's, a plain device allocation of MIB MiB (a neighbour taking
 * device memory), freed after round TO's.
 * --on-device: each buffer's pages are put on the device after the host wrote them, before the
 * first launch, as a copy into managed memory puts them there (a model's parameters copied in),
 * without any launch pump could see.
 * --fork: after the first round's launches (their moves still in flight), the
 * process forks; the child does ordinary work and exits (pump stands aside
 * there), the parent goes on and fails if the child did not exit 0.
 * Last line: the checksum of every buffer, fakecuda's counters, and the driver
 * time charged to the launching thread over the rounds.
 */
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cuda_api.h"

#define MAX_BUFFERS 64

static long kernel_us;
static int neighbour_from = -1, neighbour_to = -1;
static size_t neighbour_mib;
static int fork_after_first, on_device;

static void mix_kernel(void **params, const fakecuda_dims *dims)
{
    (void)dims;
    float *x = *(float **)params[0];
    const float *y = *(const float **)params[1];
    uint64_t n = *(uint64_t *)params[2];
    if (kernel_us > 0) {
        struct timespec pause = {kernel_us / 1000000, (kernel_us % 1000000) * 1000};
        nanosleep(&pause, NULL);
    }
    api.touch(x, n * sizeof *x);
    api.touch(y, n * sizeof *y);
    for (uint64_t i = 0; i < n; i++)
        x[i] = x[i] * 0.5f + y[i];
}

int main(int argc, char **argv)
{
    if (argc < 4) {
        fprintf(stderr, "usage: budget BUFFERS MIB ROUNDS [--kernel-us=U]\n");
        return 2;
    }
    int buffers = atoi(argv[1]);
    uint64_t floats = (uint64_t)atol(argv[2]) << 18; /* MiB of floats */
    int rounds = atoi(argv[3]);
    for (int i = 4; i < argc; i++) {
        if (strncmp(argv[i], "--kernel-us=", 12) == 0)
            kernel_us = atol(argv[i] + 12);
        else if (strcmp(argv[i], "--fork") == 0)
            fork_after_first = 1;
        else if (strcmp(argv[i], "--on-device") == 0)
            on_device = 1;
        else if (sscanf(argv[i], "--neighbour=%d:%d:%zu", &neighbour_from, &neighbour_to, &neighbour_mib) != 3 ||
                 neighbour_from < 1 || neighbour_to <= neighbour_from || neighbour_mib == 0) {
            fprintf(stderr, "budget: bad option %s (allowed: --kernel-us=U, --fork, --on-device, --neighbour=FROM:TO:MIB with "
                            "1 <= FROM < TO, MIB >= 1)\n", argv[i]);
            return 2;
        }
    }
    if (buffers < 2 || buffers > MAX_BUFFERS || floats == 0 || rounds < 1) {
        fprintf(stderr, "budget: 2 <= BUFFERS <= %d, MIB >= 1, ROUNDS >= 1\n", MAX_BUFFERS);
        return 2;
    }
    cuda_api_load(&api, 0);
    cuda_api_start(&api);
    const size_t sizes[] = {8, 8, 8}, aligns[] = {8, 8, 8};
    if (api.register_kernel("mix", mix_kernel, 3, sizes, aligns)) {
        fprintf(stderr, "error: kernel registration failed\n");
        return 3;
    }
    CUmodule module;
    CUfunction mix;
    CHECK(api.module_load_data(&module, "fakecuda"));
    CHECK(api.module_get_function(&mix, module, "mix"));
    CUstream stream;
    CHECK(api.stream_create(&stream, CU_STREAM_NON_BLOCKING));

    CUdeviceptr buffer[MAX_BUFFERS];
    for (int b = 0; b < buffers; b++) {
        CHECK(api.mem_alloc_managed(&buffer[b], floats * sizeof(float), CU_MEM_ATTACH_GLOBAL));
        float *x = (float *)buffer[b];
        api.host_touch(x, floats * sizeof(float));
        for (uint64_t i = 0; i < floats; i++)
            x[i] = (float)((i + (uint64_t)b) % 13);
        if (on_device)
            api.touch(x, floats * sizeof(float));
    }
    api.reset_stats();
    uint64_t charged = api.thread_host_ns != NULL ? api.thread_host_ns() : 0;
    CUdeviceptr neighbour = 0;
    for (int r = 1; r <= rounds; r++) {
        for (int b = 0; b < buffers; b++) {
            void *params[] = {&buffer[b], &buffer[(b + 1) % buffers], &floats};
            CHECK(api.launch_kernel(mix, 1, 1, 1, 128, 1, 1, 0, stream, params, NULL));
        }
        if (r == 1 && fork_after_first) {
            fflush(stdout);
            pid_t child = fork();
            if (child == 0) {
                long total = 0;
                for (int i = 0; i < 1000; i++)
                    total += i;
                /* _exit: the driver's operations in flight belong to stream threads the child
                 * lacks (LeakSanitizer would report them), as a real child's would. */
                _exit(total == 499500 ? 0 : 1);
            }
            int status = 0;
            if (child < 0 || waitpid(child, &status, 0) != child || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
                fprintf(stderr, "budget: the forked child failed (status %d)\n", status);
                return 1;
            }
        }
        if (neighbour_from > 0)
            CHECK(api.stream_synchronize(stream));
        if (r == neighbour_from)
            CHECK(api.mem_alloc(&neighbour, neighbour_mib << 20));
        if (r == neighbour_to)
            CHECK(api.mem_free(neighbour));
    }
    CHECK(api.ctx_synchronize());
    charged = api.thread_host_ns != NULL ? api.thread_host_ns() - charged : 0;
    struct fakecuda_stats s;
    api.get_stats(&s);
    double sum = 0;
    for (int b = 0; b < buffers; b++) {
        float *x = (float *)buffer[b];
        api.host_touch(x, floats * sizeof(float));
        for (uint64_t i = 0; i < floats; i++)
            sum += (double)x[i] * (double)(b + 1);
        CHECK(api.mem_free(buffer[b]));
    }
    printf("{\"checksum\": %.6f, \"gpu_faults\": %llu, \"bytes_faulted_h2d\": %llu, \"bytes_prefetched_h2d\": %llu, "
           "\"bytes_d2h\": %llu, \"device_resident_peak\": %llu, \"kernels_run\": %llu, \"thread_host_ns\": %llu}\n",
           sum, (unsigned long long)s.gpu_faults, (unsigned long long)s.bytes_faulted_h2d,
           (unsigned long long)s.bytes_prefetched_h2d, (unsigned long long)s.bytes_d2h,
           (unsigned long long)s.device_resident_peak, (unsigned long long)s.kernels_run, (unsigned long long)charged);
    return 0;
}
