/* selftest_contexts.c: why it exists: fakecuda's self-test of context lifetime, in a child
 * process of its own (selftest.c runs it): a destroyed context, a reset primary context and a
 * primary context released for the last time take their streams and events with them (a later
 * use is CUDA_ERROR_INVALID_HANDLE), while the primary context's handle stays usable and makes
 * a new default stream; a thread whose current context was destroyed elsewhere gets
 * CUDA_ERROR_CONTEXT_IS_DESTROYED. And the default streams: the legacy stream apart from each
 * thread's per-thread stream, with the legacy stream's implicit synchronisation. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <cuda.h>
#include <dlfcn.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>

#include "fakecuda.h"
#include "selftest.h"

static atomic_int runs;
static void k_count(void **params, const fakecuda_dims *d)
{
    (void)params; (void)d;
    runs++;
}

static CUfunction kernel(void)
{
    CUmodule m;
    CUfunction f = NULL;
    if (cuModuleLoadData(&m, "x") || cuModuleGetFunction(&f, m, "count")) return NULL;
    return f;
}

static CUresult launch(CUfunction f, CUstream s)
{
    return cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, s, NULL, NULL);
}

/* A stream and an event of the current context, used once: both valid before it goes. */
static void make_pair(CUfunction f, CUstream *s, CUevent *e)
{
    OK(cuStreamCreate(s, CU_STREAM_NON_BLOCKING));
    OK(cuEventCreate(e, CU_EVENT_DISABLE_TIMING));
    OK(launch(f, *s));
    OK(cuEventRecord(*e, *s));
}

/* Every use of a gone stream or event fails as an invalid handle. */
static void check_gone(CUfunction f, CUstream s, CUevent e, CUstream live, const char *how)
{
    CHECK(cuStreamQuery(s) == CUDA_ERROR_INVALID_HANDLE, "%s: stream query", how);
    CHECK(cuStreamSynchronize(s) == CUDA_ERROR_INVALID_HANDLE, "%s: stream synchronize", how);
    CHECK(launch(f, s) == CUDA_ERROR_INVALID_HANDLE, "%s: launch on its stream", how);
    CHECK(cuEventQuery(e) == CUDA_ERROR_INVALID_HANDLE, "%s: event query", how);
    CHECK(cuEventRecord(e, live) == CUDA_ERROR_INVALID_HANDLE, "%s: event record", how);
    CHECK(cuStreamWaitEvent(live, e, 0) == CUDA_ERROR_INVALID_HANDLE, "%s: wait on its event", how);
    CHECK(cuEventDestroy(e) == CUDA_ERROR_INVALID_HANDLE, "%s: event destroy", how);
    CHECK(cuStreamDestroy(s) == CUDA_ERROR_INVALID_HANDLE, "%s: stream destroy", how);
    CUdeviceptr p = 0;
    CHECK(cuMemPrefetchAsync(p, 0, (CUmemLocation){ .type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0 }, 0, s) != CUDA_SUCCESS,
          "%s: prefetch on its stream", how);
}

static CUcontext destroyed_elsewhere;
static pthread_barrier_t step;
static CUresult elsewhere_result;
/* Makes the context current here, lets the main thread destroy it, then uses it. */
static void *use_destroyed(void *arg)
{
    (void)arg;
    CUstream s;
    cuCtxSetCurrent(destroyed_elsewhere);
    pthread_barrier_wait(&step);
    pthread_barrier_wait(&step);
    elsewhere_result = cuStreamCreate(&s, CU_STREAM_NON_BLOCKING);
    return NULL;
}

int selftest_child_contexts(void)
{
    size_t none[1] = { 0 };
    fakecuda_register_kernel("count", k_count, 0, none, none);
    CUcontext primary, created, again;
    CUfunction f;
    if (cuInit(0) || cuDevicePrimaryCtxRetain(&primary, 0) || cuCtxSetCurrent(primary) || !(f = kernel())) {
        CHECK(0, "child setup");
        return 1;
    }
    CUstream live, s;
    CUevent e;
    OK(cuStreamCreate(&live, CU_STREAM_NON_BLOCKING));

    /* cuCtxDestroy: a created context's stream and event go with it. */
    OK(cuCtxCreate(&created, NULL, 0, 0));
    make_pair(f, &s, &e);
    OK(cuCtxDestroy(created)); /* popped: the primary context is current again */
    CUcontext cur = NULL;
    OK(cuCtxGetCurrent(&cur));
    CHECK(cur == primary, "cuCtxDestroy pops the destroyed context");
    check_gone(f, s, e, live, "cuCtxDestroy");

    /* Current to another thread when destroyed: CONTEXT_IS_DESTROYED there (cuda.h, cuCtxDestroy). */
    OK(cuCtxCreate(&destroyed_elsewhere, NULL, 0, 0));
    OK(cuCtxSetCurrent(primary));
    pthread_t t;
    pthread_barrier_init(&step, NULL, 2);
    CHECK(pthread_create(&t, NULL, use_destroyed, NULL) == 0, "thread");
    pthread_barrier_wait(&step);
    OK(cuCtxDestroy(destroyed_elsewhere));
    pthread_barrier_wait(&step);
    pthread_join(t, NULL);
    pthread_barrier_destroy(&step);
    CHECK(elsewhere_result == CUDA_ERROR_CONTEXT_IS_DESTROYED, "destroyed while current elsewhere: %d",
          (int)elsewhere_result);
    CHECK(cuCtxPushCurrent(destroyed_elsewhere) == CUDA_ERROR_INVALID_CONTEXT, "a destroyed context cannot be pushed");

    /* cuDevicePrimaryCtxReset: the primary context's streams, events and default stream go;
     * the handle stays current and usable (a reset does not release it). */
    make_pair(f, &s, &e);
    OK(launch(f, NULL));
    OK(cuDevicePrimaryCtxReset(0)); /* waits for them first */
    runs = 0;
    OK(cuStreamCreate(&live, CU_STREAM_NON_BLOCKING)); /* the old `live` went too */
    check_gone(f, s, e, live, "cuDevicePrimaryCtxReset");
    OK(cuDevicePrimaryCtxRetain(&again, 0));
    CHECK(again == primary, "the primary context keeps its handle");
    OK(launch(f, NULL));
    OK(launch(f, CU_STREAM_PER_THREAD));
    OK(launch(f, live));
    OK(cuCtxSynchronize());
    CHECK(runs == 3, "new default and created streams run after the reset (%d)", runs);
    OK(cuDevicePrimaryCtxRelease(0)); /* the retain above */

    /* The last cuDevicePrimaryCtxRelease resets it too. */
    make_pair(f, &s, &e);
    OK(cuDevicePrimaryCtxRelease(0));
    OK(cuDevicePrimaryCtxRetain(&again, 0));
    OK(cuCtxSetCurrent(again));
    OK(cuStreamCreate(&live, CU_STREAM_NON_BLOCKING));
    check_gone(f, s, e, live, "last cuDevicePrimaryCtxRelease");
    OK(cuStreamDestroy(live));
    return failed ? 1 : 0;
}

/* ---- the legacy and per-thread default streams ---- */
static atomic_int go, seen_done, done_flag;
static void host_block(void *ud) { (void)ud; while (!atomic_load(&go)) sched_yield(); atomic_store(&done_flag, 1); }
static void host_observe(void *ud) { (void)ud; atomic_store(&seen_done, atomic_load(&done_flag)); }

/* Blocks `blocked` until go is set, then enqueues the observer on `observer` and releases
 * it: whether the observer saw the blocked work done (1) or not (0). The observer's stream
 * is synchronized before go is set when it must not wait (`expect` 0). */
static int observed(CUstream blocked, CUstream observer, int expect)
{
    atomic_store(&go, 0);
    atomic_store(&done_flag, 0);
    atomic_store(&seen_done, -1);
    OK(cuLaunchHostFunc(blocked, host_block, NULL));
    OK(cuLaunchHostFunc(observer, host_observe, NULL));
    if (!expect) OK(cuStreamSynchronize(observer)); /* must not hang: it does not wait */
    atomic_store(&go, 1);
    OK(cuCtxSynchronize());
    return atomic_load(&seen_done);
}

static CUresult other_thread_result;
static void *query_per_thread(void *arg)
{
    (void)arg;
    CUcontext c;
    cuDevicePrimaryCtxRetain(&c, 0);
    cuCtxSetCurrent(c);
    other_thread_result = cuStreamQuery(CU_STREAM_PER_THREAD);
    cuDevicePrimaryCtxRelease(0);
    return NULL;
}

int selftest_child_default_streams(void)
{
    CUcontext primary;
    if (cuInit(0) || cuDevicePrimaryCtxRetain(&primary, 0) || cuCtxSetCurrent(primary)) {
        CHECK(0, "child setup");
        return 1;
    }
    CUstream blocking, nonblocking;
    OK(cuStreamCreate(&blocking, CU_STREAM_DEFAULT));
    OK(cuStreamCreate(&nonblocking, CU_STREAM_NON_BLOCKING));
    /* "Stream synchronization behavior" (CUDA Runtime API docs): the legacy stream waits for
     * earlier work of blocking streams, and blocking streams wait for earlier legacy work. */
    CHECK(observed(blocking, CU_STREAM_LEGACY, 1) == 1, "the legacy stream waits for a blocking stream");
    CHECK(observed(CU_STREAM_LEGACY, blocking, 1) == 1, "a blocking stream waits for the legacy stream");
    CHECK(observed(NULL, blocking, 1) == 1, "0 is the legacy stream outside _ptsz exports");
    /* The per-thread default stream is blocking: it synchronizes with the legacy stream. */
    CHECK(observed(CU_STREAM_PER_THREAD, CU_STREAM_LEGACY, 1) == 1, "the legacy stream waits for the per-thread one");
    CHECK(observed(CU_STREAM_LEGACY, CU_STREAM_PER_THREAD, 1) == 1, "the per-thread stream waits for the legacy one");
    /* CU_STREAM_NON_BLOCKING: "no implicit synchronization with stream 0" (cuda.h). */
    CHECK(observed(nonblocking, CU_STREAM_LEGACY, 0) == 0, "the legacy stream does not wait for a non-blocking one");
    CHECK(observed(CU_STREAM_LEGACY, nonblocking, 0) == 0, "a non-blocking stream does not wait for the legacy one");
    /* Two blocking streams do not wait for each other. */
    CHECK(observed(blocking, CU_STREAM_PER_THREAD, 0) == 0, "blocking streams run apart");

    /* The per-thread stream is a stream of its own, one per thread. */
    atomic_store(&go, 0);
    OK(cuLaunchHostFunc(CU_STREAM_PER_THREAD, host_block, NULL));
    CHECK(cuStreamQuery(CU_STREAM_PER_THREAD) == CUDA_ERROR_NOT_READY, "per-thread stream busy");
    CUresult (*query_ptsz)(CUstream) = (CUresult(*)(CUstream))dlsym(RTLD_DEFAULT, "cuStreamQuery_ptsz");
    CHECK(query_ptsz && query_ptsz(NULL) == CUDA_ERROR_NOT_READY, "0 in a _ptsz export is the per-thread stream");
    CHECK(cuStreamQuery(NULL) == CUDA_SUCCESS, "the legacy stream is another stream");
    pthread_t t;
    CHECK(pthread_create(&t, NULL, query_per_thread, NULL) == 0, "thread");
    pthread_join(t, NULL);
    CHECK(other_thread_result == CUDA_SUCCESS, "another thread's per-thread stream is another stream (%d)",
          (int)other_thread_result);
    CHECK(cuStreamDestroy(CU_STREAM_PER_THREAD) == CUDA_ERROR_INVALID_HANDLE, "the per-thread stream cannot be destroyed");
    atomic_store(&go, 1);
    OK(cuCtxSynchronize());
    OK(cuStreamDestroy(blocking));
    OK(cuStreamDestroy(nonblocking));
    return failed ? 1 : 0;
}
