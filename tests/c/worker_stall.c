/* worker_stall.c: one long driver call of pump's worker holds up only the decisions that must
 * follow it (issue 42, risk 4). One thread cycles over more buffers than the budget holds, so
 * pump's worker evicts ahead of its launches; fakecuda holds the worker's prefetch calls
 * (FAKECUDA_HOLD_PREFETCH=PATH, FAKECUDA_HOLD_PREFETCH_THREAD=pump-worker) until PATH exists,
 * and the cycling thread's next launch, whose prefetch must follow those evictions, waits for
 * them. Then a second thread launches over a buffer of its own that fits beside them: its
 * prefetch follows no eviction, and it must not wait. Before, the first thread held its device's
 * turn while it waited, and the second waited for that turn: for the held call. A watchdog lets
 * the call go after 20 s, so that a stalled run still ends.
 *   worker_stall PATH
 * Prints {"held": ..., "first_waits": ..., "second_waited": ..., "ok": ...}: whether the worker
 * was held, whether the first thread was waiting for it, whether the second thread's launch
 * returned only once the call could go on, and whether every buffer holds what its launches
 * added.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <string.h>

#include "cuda_api.h"
#include "held_call.h"

#define BUFFERS 64
#define FLOATS ((size_t)1 << 19) /* 2 MiB each: 128 MiB against a 64 MiB budget */
#define MOST_LAUNCHES 100000

static struct held_call hold;
static CUcontext context;
static CUfunction inc;
static CUdeviceptr buffers[BUFFERS], own;
static int launched[BUFFERS];
static atomic_int in_launch = -1; /* the first thread's launch in progress (-1: none) */
static atomic_int launches;
static atomic_bool second_done;

static void launch(CUdeviceptr *buffer, CUstream stream)
{
    uint64_t n = FLOATS;
    void *params[] = {buffer, &n};
    CHECK(api.launch_kernel(inc, 1, 1, 1, 128, 1, 1, 0, stream, params, NULL));
}

static void *cycling(void *arg)
{
    (void)arg;
    CHECK(api.ctx_set_current(context));
    for (int i = 0; i < MOST_LAUNCHES && !atomic_load(&hold.released); i++) {
        atomic_store(&in_launch, i);
        launch(&buffers[i % BUFFERS], NULL);
        launched[i % BUFFERS]++;
        atomic_store(&in_launch, -1);
        atomic_fetch_add(&launches, 1);
    }
    CHECK(api.ctx_synchronize());
    return NULL;
}

static void *second(void *arg)
{
    (void)arg;
    CHECK(api.ctx_set_current(context));
    CUstream stream;
    CHECK(api.stream_create(&stream, CU_STREAM_NON_BLOCKING));
    launch(&own, stream);
    atomic_store(&second_done, true);
    CHECK(api.stream_synchronize(stream));
    return NULL;
}

/* Whether the first thread stays inside one launch for `ms`. */
static bool first_waits(long ms)
{
    for (int tries = 0; tries < 20; tries++) {
        int at = atomic_load(&launches), in = atomic_load(&in_launch);
        nap_ms(ms);
        if (in >= 0 && atomic_load(&in_launch) == in && atomic_load(&launches) == at)
            return true;
    }
    return false;
}

static bool holds(CUdeviceptr buffer, float value)
{
    float *x = (float *)buffer;
    api.host_touch(x, FLOATS * sizeof *x);
    return x[0] == value && x[FLOATS - 1] == value;
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: worker_stall PATH\n");
        return 2;
    }
    held_call_init(&hold, argv[1], 20000);
    cuda_api_load(&api, 0);
    cuda_api_start(&api);
    CHECK(api.primary_ctx_retain(&context, 0));
    CHECK(api.ctx_set_current(context));
    const size_t sizes[] = {8, 8}, aligns[] = {8, 8};
    inc = cuda_api_kernel("inc", inc_kernel, 2, sizes, aligns);
    for (int b = 0; b <= BUFFERS; b++) {
        CUdeviceptr *p = b < BUFFERS ? &buffers[b] : &own;
        CHECK(api.mem_alloc_managed(p, FLOATS * sizeof(float), CU_MEM_ATTACH_GLOBAL));
        api.host_touch((void *)*p, FLOATS * sizeof(float));
        memset((void *)*p, 0, FLOATS * sizeof(float));
    }

    pthread_t first, other, dog;
    pthread_create(&dog, NULL, held_call_watchdog, &hold);
    pthread_create(&first, NULL, cycling, NULL);
    bool held = held_call_entered(&hold); /* the worker's eviction is in the driver */
    bool waits = held && first_waits(300);
    pthread_create(&other, NULL, second, NULL);
    for (int i = 0; i < 300 && !second_done && !atomic_load(&hold.released); i++)
        nap_ms(10);
    bool waited = !second_done;
    held_call_let_go(&hold);
    pthread_join(other, NULL);
    pthread_join(first, NULL);
    pthread_join(dog, NULL);
    bool ok = holds(own, 1.0f);
    for (int b = 0; b < BUFFERS; b++)
        ok = ok && holds(buffers[b], (float)launched[b]);
    printf("{\"held\": %s, \"first_waits\": %s, \"second_waited\": %s, \"launches\": %d, \"ok\": %s}\n",
           held ? "true" : "false", waits ? "true" : "false", waited ? "true" : "false", atomic_load(&launches),
           ok ? "true" : "false");
    for (int b = 0; b <= BUFFERS; b++)
        CHECK(api.mem_free(b < BUFFERS ? buffers[b] : own));
    return ok ? 0 : 1;
}
