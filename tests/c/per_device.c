/* per_device.c: threads launching at once, thread t on device t % DEVICES (a thread-per-GPU
 * launcher: DataParallel, one process driving its node's GPUs), each over its own managed
 * buffers, more of them than a budget of 2 buffers holds, so that under pump every launch
 * evicts and prefetches (tests/test_per_device.py, scripts/bench-steady's two_devices).
 * Why an imitation, not the real client (tests/test_real_client*.py): timing (each
 * thread's wall time, whether threads on two devices wait for each other), values, several
 * devices at once, and the sanitizer builds.
 *
 *   per_device THREADS DEVICES LAUNCHES
 *
 * Prints one JSON line: each thread's wall time over its launches (from a common start, the
 * driver's modelled host time included: fakecuda sleeps it off on the paying thread) and the
 * number of buffers whose values were wrong. Run with FAKECUDA_DEVICES >= DEVICES.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <time.h>

#include "cuda_api.h"

#define BUFFERS 4
#define FLOATS ((size_t)1 << 20) /* 4 MiB per buffer: two 2 MiB blocks */
#define THREADS_MAX 64

static CUfunction inc;
static int devices = 2, launches = 64;
static pthread_barrier_t start, launched; /* every thread's launches begin, and end, together */
/* Each thread's set-up (its allocations, and a first launch, at which pump sets up its device's
 * residency) one thread at a time: both take pump's residency shape lock for writing, and the
 * waits counted should be those of the launches that race. */
static pthread_mutex_t setting_up = PTHREAD_MUTEX_INITIALIZER;
static atomic_int failures;
static uint64_t thread_ns[THREADS_MAX];

/* x[0] += 1 over (x, n), touching all n floats (the model's access) but computing on one: the
 * CPU of fakecuda's kernels leaves the launching threads' times. */
static void inc_first_kernel(void **params, const fakecuda_dims *dims)
{
    (void)dims;
    float *x = *(float **)params[0];
    api.touch(x, *(uint64_t *)params[1] * sizeof *x);
    x[0] += 1.0f;
}

static uint64_t now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

static void *worker(void *arg)
{
    int t = (int)(intptr_t)arg;
    CUdevice dev;
    CUcontext ctx;
    CHECK(api.device_get(&dev, t % devices));
    CHECK(api.primary_ctx_retain(&ctx, dev));
    CHECK(api.ctx_set_current(ctx));
    CUstream stream;
    CHECK(api.stream_create(&stream, CU_STREAM_NON_BLOCKING));
    CUdeviceptr buffer[BUFFERS];
    uint64_t n = FLOATS;
    pthread_mutex_lock(&setting_up);
    for (int b = 0; b < BUFFERS; b++) {
        CHECK(api.mem_alloc_managed(&buffer[b], FLOATS * sizeof(float), CU_MEM_ATTACH_GLOBAL));
        api.host_touch((void *)buffer[b], sizeof(float));
        *(float *)buffer[b] = -1.0f;  /* the first launch makes it 0 */
    }
    void *first[] = {&buffer[0], &n};
    CHECK(api.launch_kernel(inc, 1, 1, 1, 128, 1, 1, 0, stream, first, NULL));
    CHECK(api.stream_synchronize(stream));
    pthread_mutex_unlock(&setting_up);
    for (int b = 1; b < BUFFERS; b++) {
        api.host_touch((void *)buffer[b], sizeof(float));
        *(float *)buffer[b] = 0.0f;
    }
    pthread_barrier_wait(&start);
    uint64_t began = now_ns();
    for (int i = 0; i < launches; i++) {
        void *params[] = {&buffer[i % BUFFERS], &n};
        CHECK(api.launch_kernel(inc, 1, 1, 1, 128, 1, 1, 0, stream, params, NULL));
    }
    thread_ns[t] = now_ns() - began;
    CHECK(api.stream_synchronize(stream));
    /* A free takes pump's residency shape lock for writing (residency_blocks.h): none while
     * another thread still launches, so that the waits counted are the launches' own. */
    pthread_barrier_wait(&launched);
    for (int b = 0; b < BUFFERS; b++) {
        api.host_touch((void *)buffer[b], sizeof(float));
        int expected = launches / BUFFERS + (b < launches % BUFFERS);
        if (*(float *)buffer[b] != (float)expected)
            atomic_fetch_add(&failures, 1);
        CHECK(api.mem_free(buffer[b]));
    }
    return NULL;
}

int main(int argc, char **argv)
{
    int threads = argc == 4 ? atoi(argv[1]) : 0;
    if (argc == 4) {
        devices = atoi(argv[2]);
        launches = atoi(argv[3]);
    }
    if (threads < 1 || threads > THREADS_MAX || devices < 1 || devices > threads || launches < 1) {
        fprintf(stderr, "usage: per_device THREADS(1..%d) DEVICES(1..THREADS) LAUNCHES(>= 1)\n", THREADS_MAX);
        return 2;
    }
    cuda_api_load(&api, 0);
    cuda_api_start(&api);
    const size_t sizes[] = {8, 8}, aligns[] = {8, 8};
    inc = cuda_api_kernel("inc_first", inc_first_kernel, 2, sizes, aligns);

    pthread_t workers[THREADS_MAX];
    pthread_barrier_init(&start, NULL, (unsigned)threads);
    pthread_barrier_init(&launched, NULL, (unsigned)threads);
    for (int t = 0; t < threads; t++)
        pthread_create(&workers[t], NULL, worker, (void *)(intptr_t)t);
    for (int t = 0; t < threads; t++)
        pthread_join(workers[t], NULL);
    pthread_barrier_destroy(&start);
    pthread_barrier_destroy(&launched);
    printf("{\"threads\": %d, \"devices\": %d, \"launches\": %d, \"failures\": %d, \"thread_ns\": [", threads,
           devices, launches, atomic_load(&failures));
    for (int t = 0; t < threads; t++)
        printf("%s%llu", t ? ", " : "", (unsigned long long)thread_ns[t]);
    printf("]}\n");
    return atomic_load(&failures) ? 1 : 0;
}
