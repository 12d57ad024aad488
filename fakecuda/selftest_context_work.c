/* selftest_context_work.c: why it exists: fakecuda's self-test of the context calls the CUDA 13.2
 * runtime looks up at start, in a child process of its own per persona (selftest.c runs it with
 * fakecuda's own device and with FAKECUDA_PERSONA=a100-pcie-40gb): a context's id and SM resource;
 * cuCtxRecordEvent capturing the work of every stream of the context, and cuCtxWaitEvent making
 * the later work of its streams, those made afterwards included, wait; both refused, invalidating
 * the capture, where a capture is concerned; no green context (their calls refused, a stream's is
 * NULL). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <cuda.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "fakecuda.h"
#include "selftest.h"

static atomic_int go, done_flag, seen_done;
static void host_block(void *ud) { (void)ud; selftest_wait_for(&go); atomic_store(&done_flag, 1); }
static void host_observe(void *ud) { (void)ud; atomic_store(&seen_done, atomic_load(&done_flag)); }

static void arm(void)
{
    atomic_store(&go, 0);
    atomic_store(&done_flag, 0);
    atomic_store(&seen_done, -1);
}

/* cuda.h, cuCtxGetId and cuCtxGetDevResource; the SM figures of the persona's compute capability
 * (cuda.h's green-context section: 9.0, 8 and 8; 8.x, 4 and 2). */
static void ids_and_resources(CUcontext primary)
{
    unsigned long long id = 0, again = 0, other = 0;
    OK(cuCtxGetId(primary, &id));
    OK(cuCtxGetId(NULL, &again));
    CHECK(id != 0 && id == again, "the current context's id is the primary's (%llu, %llu)", id, again);
    CUcontext created;
    OK(cuCtxCreate(&created, NULL, 0, 0));
    OK(cuCtxGetId(created, &other));
    CHECK(other != id, "another context, another id");
    OK(cuCtxDestroy(created));
    CHECK(cuCtxGetId(created, &other) == CUDA_ERROR_CONTEXT_IS_DESTROYED, "a destroyed context has none");
    CHECK(cuCtxGetId(primary, NULL) == CUDA_ERROR_INVALID_VALUE, "nowhere to write it");

    const char *persona = getenv("FAKECUDA_PERSONA");
    int a100 = persona && strcmp(persona, "a100-pcie-40gb") == 0;
    CUdevResource r;
    memset(&r, 0xff, sizeof r);
    OK(cuCtxGetDevResource(primary, &r, CU_DEV_RESOURCE_TYPE_SM));
    CHECK(r.type == CU_DEV_RESOURCE_TYPE_SM && r.sm.smCount == (a100 ? 108u : 132u) &&
              r.sm.minSmPartitionSize == (a100 ? 4u : 8u) && r.sm.smCoscheduledAlignment == (a100 ? 2u : 8u),
          "the device's SMs (%u, min %u, alignment %u)", r.sm.smCount, r.sm.minSmPartitionSize,
          r.sm.smCoscheduledAlignment);
    OK(cuCtxGetDevResource(NULL, &r, CU_DEV_RESOURCE_TYPE_SM));
    CHECK(cuCtxGetDevResource(primary, &r, CU_DEV_RESOURCE_TYPE_INVALID) == CUDA_ERROR_INVALID_RESOURCE_TYPE,
          "no other resource type");
    CHECK(cuCtxGetDevResource(primary, NULL, CU_DEV_RESOURCE_TYPE_SM) == CUDA_ERROR_INVALID_VALUE, "no resource");
}

/* "Captures in hEvent all the activities of the context": work on two streams, one blocked. */
static void record(CUcontext primary, CUstream a, CUstream b)
{
    CUevent e, never;
    OK(cuEventCreate(&e, CU_EVENT_DISABLE_TIMING));
    OK(cuEventCreate(&never, CU_EVENT_DISABLE_TIMING));
    OK(cuCtxRecordEvent(primary, e));
    OK(cuEventQuery(e)); /* nothing pending: complete at once */
    arm();
    OK(cuLaunchHostFunc(a, host_block, NULL));
    OK(cuLaunchHostFunc(b, host_observe, NULL));
    OK(cuCtxRecordEvent(primary, e));
    OK(cuStreamSynchronize(b)); /* b's work is done, a's is not: neither is the event */
    CHECK(cuEventQuery(e) == CUDA_ERROR_NOT_READY, "the record waits for every stream of the context");
    atomic_store(&go, 1);
    OK(cuEventSynchronize(e));
    CHECK(atomic_load(&done_flag) == 1, "and is done once they are");
    arm();
    OK(cuLaunchHostFunc(a, host_block, NULL)); /* after the record: not in it */
    CHECK(cuEventQuery(e) == CUDA_SUCCESS, "later work does not change it");
    atomic_store(&go, 1);
    OK(cuCtxSynchronize());

    CUcontext created;
    CUevent elsewhere;
    OK(cuCtxCreate(&created, NULL, 0, 0));
    OK(cuEventCreate(&elsewhere, CU_EVENT_DISABLE_TIMING));
    OK(cuCtxPopCurrent(&created));
    CHECK(cuCtxRecordEvent(primary, elsewhere) == CUDA_ERROR_INVALID_HANDLE, "an event of another context");
    OK(cuEventDestroy(elsewhere));
    OK(cuCtxDestroy(created));
    CHECK(cuCtxRecordEvent(NULL, e) == CUDA_ERROR_INVALID_CONTEXT, "no context");

    /* a capturing stream in the context: refused, and the capture invalidated */
    CUgraph g;
    OK(cuStreamBeginCapture(b, CU_STREAM_CAPTURE_MODE_RELAXED));
    CHECK(cuCtxRecordEvent(primary, e) == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "record during a capture");
    CHECK(cuStreamEndCapture(b, &g) == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED && g == NULL, "invalidated by it");
    OK(cuEventDestroy(e));
    OK(cuEventDestroy(never));
}

/* "Makes all future work submitted to context hCtx wait": a stream of it now, one made after. */
static void wait(CUcontext primary, CUstream a, CUstream b)
{
    CUevent e, never;
    OK(cuEventCreate(&e, CU_EVENT_DISABLE_TIMING));
    OK(cuEventCreate(&never, CU_EVENT_DISABLE_TIMING));
    OK(cuCtxWaitEvent(primary, never)); /* never recorded: nothing to wait for */
    OK(cuStreamSynchronize(b));
    arm();
    OK(cuLaunchHostFunc(a, host_block, NULL));
    OK(cuEventRecord(e, a));
    OK(cuCtxWaitEvent(primary, e));
    CUstream later;
    OK(cuStreamCreate(&later, CU_STREAM_NON_BLOCKING));
    OK(cuLaunchHostFunc(b, host_observe, NULL));
    CHECK(cuStreamQuery(b) == CUDA_ERROR_NOT_READY && cuStreamQuery(later) == CUDA_ERROR_NOT_READY,
          "both wait on the device, the host does not");
    atomic_store(&go, 1);
    OK(cuStreamSynchronize(b));
    CHECK(atomic_load(&seen_done) == 1, "a stream of the context ran its later work after the event");
    arm();
    OK(cuLaunchHostFunc(later, host_observe, NULL));
    OK(cuStreamSynchronize(later));
    CHECK(atomic_load(&seen_done) == 0, "the stream made after the wait runs once the event is done");
    OK(cuStreamDestroy(later));
    atomic_store(&go, 1);

    /* refused, invalidating the capture: an event recorded in an ongoing capture, and a context
     * with a capturing stream */
    CUgraph g;
    OK(cuStreamBeginCapture(b, CU_STREAM_CAPTURE_MODE_RELAXED));
    OK(cuEventRecord(e, b));
    CHECK(cuCtxWaitEvent(primary, e) == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "wait during a capture");
    CHECK(cuStreamEndCapture(b, &g) == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED && g == NULL, "invalidated by it");
    OK(cuEventRecord(e, a));
    OK(cuStreamBeginCapture(b, CU_STREAM_CAPTURE_MODE_RELAXED));
    CHECK(cuCtxWaitEvent(primary, e) == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "a capturing stream in the context");
    CHECK(cuStreamEndCapture(b, &g) == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED && g == NULL, "invalidated by it");
    OK(cuCtxSynchronize());
    OK(cuEventDestroy(e));
    OK(cuEventDestroy(never));
}

/* No green context exists: a stream's is NULL, the calls on one are refused. */
static void green(CUstream a)
{
    CUgreenCtx gc = (CUgreenCtx)(uintptr_t)1;
    OK(cuStreamGetGreenCtx(a, &gc));
    CHECK(gc == NULL, "a stream of a regular context has no green context");
    gc = (CUgreenCtx)(uintptr_t)1;
    OK(cuStreamGetGreenCtx(CU_STREAM_LEGACY, &gc));
    CHECK(gc == NULL, "nor the legacy stream");
    CHECK(cuStreamGetGreenCtx(a, NULL) == CUDA_ERROR_INVALID_VALUE, "nowhere to write it");
    unsigned long long id;
    CUdevResource r;
    CUevent e;
    OK(cuEventCreate(&e, CU_EVENT_DISABLE_TIMING));
    CHECK(cuGreenCtxGetId(NULL, &id) == CUDA_ERROR_INVALID_CONTEXT, "the current context is not green");
    CHECK(cuGreenCtxGetDevResource(NULL, &r, CU_DEV_RESOURCE_TYPE_SM) == CUDA_ERROR_INVALID_CONTEXT, "no resource");
    CHECK(cuGreenCtxRecordEvent(NULL, e) == CUDA_ERROR_INVALID_CONTEXT, "no record");
    CHECK(cuGreenCtxWaitEvent(NULL, e) == CUDA_ERROR_INVALID_CONTEXT, "no wait");
    OK(cuEventDestroy(e));
}

int selftest_child_context_work(void)
{
    CUcontext primary;
    CUstream a, b;
    if (cuInit(0) || cuDevicePrimaryCtxRetain(&primary, 0) || cuCtxSetCurrent(primary) ||
        cuStreamCreate(&a, CU_STREAM_NON_BLOCKING) || cuStreamCreate(&b, CU_STREAM_NON_BLOCKING)) {
        CHECK(0, "child setup");
        return 1;
    }
    ids_and_resources(primary);
    record(primary, a, b);
    wait(primary, a, b);
    green(a);
    OK(cuStreamDestroy(a));
    OK(cuStreamDestroy(b));
    return failed ? 1 : 0;
}
