/* threads.c: many threads launching at once, each on its own stream and
 * buffers, while another thread allocates and frees managed memory (range
 * table writes racing launch-path reads) and synchronises (epoch moves).
 * Every thread checks its own results; run under ThreadSanitizer in CI.
 * Every thread makes its first launch before any makes its second, so all
 * buffers are live and launched at once whatever the scheduling (a budget
 * below their sum must evict).
 *
 *   threads [THREADS [LAUNCHES]]
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "cuda_api.h"

#define FLOATS ((size_t)1 << 18) /* 1 MiB per buffer */

static CUcontext context;
static CUfunction inc;
static int launches = 200;
static pthread_barrier_t launched; /* every thread's first launch is made */
static atomic_int failures;
static atomic_bool stop_churn;


static void *worker(void *arg)
{
    (void)arg;
    CHECK(api.ctx_set_current(context));
    CUstream stream;
    CUdeviceptr buffer;
    CHECK(api.stream_create(&stream, CU_STREAM_NON_BLOCKING));
    CHECK(api.mem_alloc_managed(&buffer, FLOATS * sizeof(float), CU_MEM_ATTACH_GLOBAL));
    float *x = (float *)buffer;
    api.host_touch(x, FLOATS * sizeof *x);
    for (size_t i = 0; i < FLOATS; i++)
        x[i] = 0.0f;
    uint64_t n = FLOATS;
    for (int i = 0; i < launches; i++) {
        void *params[] = {&buffer, &n};
        CHECK(api.launch_kernel(inc, 1, 1, 1, 128, 1, 1, 0, stream, params, NULL));
        if (i == 0)
            pthread_barrier_wait(&launched);
    }
    CHECK(api.stream_synchronize(stream));
    api.host_touch(x, FLOATS * sizeof *x);
    for (size_t i = 0; i < FLOATS; i++)
        if (x[i] != (float)launches) {
            atomic_fetch_add(&failures, 1);
            break;
        }
    CHECK(api.mem_free(buffer));
    return NULL;
}

static void *churn(void *arg)
{
    (void)arg;
    CHECK(api.ctx_set_current(context));
    while (!atomic_load(&stop_churn)) {
        CUdeviceptr p;
        CHECK(api.mem_alloc_managed(&p, 3 << 20, CU_MEM_ATTACH_GLOBAL));
        CHECK(api.mem_free(p));
        CHECK(api.ctx_synchronize());
    }
    return NULL;
}

int main(int argc, char **argv)
{
    int threads = argc > 1 ? atoi(argv[1]) : 8;
    if (argc > 2)
        launches = atoi(argv[2]);
    if (threads < 1 || threads > 256 || launches < 1) {
        fprintf(stderr, "usage: threads [THREADS 1..256 [LAUNCHES >= 1]]\n");
        return 2;
    }
    cuda_api_load(&api, 0);
    CUdevice dev = cuda_api_start(&api);
    CHECK(api.primary_ctx_retain(&context, dev));
    const size_t sizes[] = {8, 8}, aligns[] = {8, 8};
    inc = cuda_api_kernel("inc", inc_kernel, 2, sizes, aligns);

    pthread_t churner, workers[256];
    pthread_barrier_init(&launched, NULL, (unsigned)threads);
    pthread_create(&churner, NULL, churn, NULL);
    for (int i = 0; i < threads; i++)
        pthread_create(&workers[i], NULL, worker, NULL);
    for (int i = 0; i < threads; i++)
        pthread_join(workers[i], NULL);
    atomic_store(&stop_churn, true);
    pthread_join(churner, NULL);
    pthread_barrier_destroy(&launched);
    printf("{\"threads\": %d, \"launches\": %d, \"failures\": %d}\n", threads, launches, atomic_load(&failures));
    return atomic_load(&failures) ? 1 : 0;
}
