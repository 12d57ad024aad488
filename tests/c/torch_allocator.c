/* torch_allocator.c: the allocation pattern of a training step, made the ways PyTorch makes
 * it (tests/test_torch_allocator.py): weights allocated once, an activation allocated,
 * written, read and freed every step, all on one stream. The results must not differ.
 * One JSON line.
 * Why an imitation, not the real client (tests/test_real_client*.py): values
 * (real kernels are no-ops on fakecuda), discard marks run out while a host function holds the
 * stream (a timing the real client never forces), and the sanitizer builds.
 *
 *   torch_allocator STEPS [legacy] [held] [moving] [pluggable|caching|segments]
 *
 * legacy: on the legacy NULL stream (PyTorch's default stream).
 * held: first, 300 tensors of 2 MiB (more than libpump has discard marks) allocated, cleared
 *   by a kernel (pump discards only what a launch named) and freed while a host function
 *   holds the stream, so that none of their discards can run.
 * pluggable (the default): through a CUDAPluggableAllocator, libpump's pump_torch_alloc /
 *   pump_torch_free when the process has them (under pump), else cuMemAllocAsync /
 *   cuMemFreeAsync, as PyTorch's cudaMallocAsync backend does.
 * caching: as PyTorch's caching allocator does, out of one 20 MiB segment from cuMemAlloc,
 *   reporting each tensor handed out and taken back to libpump's pump_torch_trace when the
 *   process has it (what pump's bridge forwards, pump/boot/torch_trace.cpp); after the
 *   segment's cuMemFree, a second segment as large must fit the capacity again.
 * segments: the same, reporting nothing (the bridge could not be built).
 * moving (with caching): the activation changes address every step, as PyTorch's do: after
 *   each even step a tensor of its size is allocated where it was and freed only once the next
 *   step's activation is allocated elsewhere; the optimizer's step is marked after each step
 *   (pump_torch_trace_step, as pump's start-up hook marks it).
 * held (after its first launch) and moving wait for libpump to write to pumpd's ring, where it
 * has a socket, so that a trace holds their launches: libpump attaches beside the program.
 */
#include <fcntl.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

#include "pump_stats.h"
#include "torch_program.h"

/* libpump's step mark for the caching allocator's tensors (weak: the bare run has none). */
extern void pump_torch_trace_step(void) __attribute__((weak));

#define WEIGHTS ((size_t)8 << 20)
#define ACTIVATION ((size_t)6 << 20)
#define SEGMENT ((size_t)20 << 20)
#define HELD_TENSORS 300
#define HELD_BYTES ((size_t)2 << 20)

enum mode { PLUGGABLE, CACHING, SEGMENTS };
static enum mode mode;
static CUstream stream;
static CUfunction forward, update, clear;
/* One segment: the weights first, the activation after them (freed every step, so handed
 * out again at the same place). */
static struct torch_caching cache = {.segment_size = SEGMENT};

static CUdeviceptr tensor_alloc(size_t bytes)
{
    return torch_tensor_alloc(&cache, mode == PLUGGABLE, bytes, stream);
}

static void tensor_free(CUdeviceptr p, size_t bytes)
{
    torch_tensor_free(&cache, mode == PLUGGABLE, p, bytes, stream);
}

/* out[i] = w[i % nw] * 0.5 + step: writes every element of out before anything reads it. */
static void forward_kernel(void **params, const fakecuda_dims *dims)
{
    (void)dims;
    const float *w = *(const float **)params[0];
    float *out = *(float **)params[1];
    uint64_t nw = *(uint64_t *)params[2], n = *(uint64_t *)params[3];
    float step = *(float *)params[4];
    api.touch(w, nw * sizeof *w);
    api.touch(out, n * sizeof *out);
    for (uint64_t i = 0; i < n; i++)
        out[i] = w[i % nw] * 0.5f + step;
}

/* w[i] += out[i] * 0.001: reads the whole activation. */
static void update_kernel(void **params, const fakecuda_dims *dims)
{
    (void)dims;
    float *w = *(float **)params[0];
    const float *out = *(const float **)params[1];
    uint64_t nw = *(uint64_t *)params[2], n = *(uint64_t *)params[3];
    api.touch(w, nw * sizeof *w);
    api.touch(out, n * sizeof *out);
    for (uint64_t i = 0; i < n && i < nw; i++)
        w[i] += out[i] * 0.001f;
}

/* out[i] = 0 */
static void clear_kernel(void **params, const fakecuda_dims *dims)
{
    (void)dims;
    float *out = *(float **)params[0];
    uint64_t n = *(uint64_t *)params[1];
    api.touch(out, n * sizeof *out);
    memset(out, 0, n * sizeof *out);
}

/* Under pump with a daemon, until libpump has written its first events to the daemon's ring (its
 * counter record says so; the first come once a launch or an allocation is known), or 10 s:
 * what happens before the shim attached is not in the trace. */
static void wait_for_the_daemon(void)
{
    const char *dir = getenv("PUMP_STATS_DIR"), *socket = getenv("PUMP_SOCKET");
    char path[4096];
    if (dir == NULL || pump_torch_trace == NULL || socket == NULL || *socket == '\0')
        return;
    snprintf(path, sizeof path, "%s/pump-%d.stats", dir, (int)getpid());
    for (int i = 0; i < 1000; i++) {
        uint64_t written = 0;
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd >= 0) {
            if (pread(fd, &written, sizeof written, offsetof(struct pump_stats, events_written)) != sizeof written)
                written = 0;
            close(fd);
        }
        if (written != 0)
            return;
        nanosleep(&(struct timespec){0, 10000000}, NULL);
    }
}

int main(int argc, char **argv)
{
    static const char *const modes[] = {"pluggable", "caching", "segments"};
    bool legacy = false, held = false, moving = false, usage = argc < 2;
    for (int i = 2; i < argc; i++) {
        bool known = false;
        for (int m = 0; m < 3; m++)
            if (strcmp(argv[i], modes[m]) == 0) {
                mode = (enum mode)m;
                known = true;
            }
        if (strcmp(argv[i], "legacy") == 0)
            legacy = known = true;
        if (strcmp(argv[i], "held") == 0)
            held = known = true;
        if (strcmp(argv[i], "moving") == 0)
            moving = known = true;
        usage |= !known;
    }
    if (usage || (held && mode != PLUGGABLE) || (moving && mode != CACHING)) {
        fprintf(stderr, "usage: torch_allocator STEPS [legacy] [held] [moving] [pluggable|caching|segments]\n"
                        "(held goes with pluggable only, moving with caching only)\n");
        return 2;
    }
    int steps = atoi(argv[1]);
    cuda_api_load(&api, 0);
    cuda_api_start(&api);
    const size_t forward_sizes[] = {8, 8, 8, 8, 4}, update_sizes[] = {8, 8, 8, 8}, clear_sizes[] = {8, 8};
    forward = cuda_api_kernel("forward", forward_kernel, 5, forward_sizes, forward_sizes);
    update = cuda_api_kernel("update", update_kernel, 4, update_sizes, update_sizes);
    clear = cuda_api_kernel("clear", clear_kernel, 2, clear_sizes, clear_sizes);
    stream = NULL;
    if (!legacy)
        CHECK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
    cache.report = mode == CACHING;
    if (held) {
        static atomic_int release;
        CHECK(cuLaunchHostFunc(stream, fake_hold, &release));
        uint64_t held_n = HELD_BYTES / sizeof(float);
        for (int i = 0; i < HELD_TENSORS; i++) {
            CUdeviceptr t = tensor_alloc(HELD_BYTES);
            void *clear_params[] = {&t, &held_n};
            CHECK(cuLaunchKernel(clear, 1, 1, 1, 1, 1, 1, 0, stream, clear_params, NULL));
            if (i == 0)
                wait_for_the_daemon();  /* before the first free's drain */
            tensor_free(t, HELD_BYTES);
        }
        atomic_store(&release, 1);
        CHECK(cuStreamSynchronize(stream));  /* every discard has run: the steps find marks free */
    }

    CUdeviceptr w = tensor_alloc(WEIGHTS);
    uint64_t nw = WEIGHTS / sizeof(float), n = ACTIVATION / sizeof(float);
    unsigned int managed = 0;
    CHECK(cuPointerGetAttribute(&managed, CU_POINTER_ATTRIBUTE_IS_MANAGED, w));
    float *host_w = (float *)(uintptr_t)w;
    api.host_touch(host_w, WEIGHTS);
    for (uint64_t i = 0; i < nw; i++)
        host_w[i] = (float)(i % 13);
    CUdeviceptr kept = 0;  /* moving: the tensor that holds the last activation's place */
    if (moving)
        wait_for_the_daemon();
    for (int s = 0; s < steps; s++) {
        CUdeviceptr out = tensor_alloc(ACTIVATION);
        if (kept != 0)
            tensor_free(kept, ACTIVATION);
        kept = 0;
        float step = (float)s;
        void *forward_params[] = {&w, &out, &nw, &n, &step};
        CHECK(cuLaunchKernel(forward, 1, 1, 1, 1, 1, 1, 0, stream, forward_params, NULL));
        void *update_params[] = {&w, &out, &nw, &n};
        CHECK(cuLaunchKernel(update, 1, 1, 1, 1, 1, 1, 0, stream, update_params, NULL));
        tensor_free(out, ACTIVATION);
        if (moving && s % 2 == 0)
            kept = tensor_alloc(ACTIVATION);
        if (moving && pump_torch_trace_step != NULL)
            pump_torch_trace_step();
    }
    if (kept != 0)
        tensor_free(kept, ACTIVATION);
    CHECK(cuStreamSynchronize(stream));
    api.host_touch(host_w, WEIGHTS);
    double checksum = 0;
    for (uint64_t i = 0; i < nw; i++)
        checksum += (double)host_w[i] * (double)(i % 7 + 1);
    tensor_free(w, WEIGHTS);
    CHECK(cuStreamSynchronize(stream));
    if (mode != PLUGGABLE) {
        torch_caching_release(&cache);
        CUdeviceptr segment;
        CHECK(cuMemAlloc(&segment, SEGMENT));  /* the first one's bytes are free again */
        CHECK(cuMemFree(segment));
    }
    struct fakecuda_stats st;
    api.get_stats(&st);
    printf("{\"pump_allocator\": %d, \"managed\": %u, \"checksum\": %.6f, \"bytes_discarded\": %llu, "
           "\"gpu_faults\": %llu, \"device_resident_peak\": %llu, \"allocations_reused\": %llu}\n",
           pump_torch_alloc != NULL, managed, checksum, (unsigned long long)st.bytes_discarded,
           (unsigned long long)st.gpu_faults, (unsigned long long)st.device_resident_peak,
           (unsigned long long)st.allocations_reused);
    return 0;
}
