/* selftest_clock.c: why it exists: fakecuda's self-test of its modelled clock, a topic of the
 * main sequence. A thread sleeps off the time it is charged and is credited what it overslept
 * (stats.c); the credit is kept only across work that was waiting. So events are stamped with
 * the stream's modelled time (a prefetch the credit absorbed still took its copy's time
 * between two events: pump's link-rate samples read it), the credit does not outlast a wait
 * for work, and a stream that waited for another's event is stamped no earlier than it. A
 * kernel that computes (fakecuda_compute) is busy that long between its events. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <cuda.h>
#include <stdatomic.h>
#include <stdint.h>
#include <time.h>

#include "fakecuda.h"
#include "fakecuda_model.h"
#include "selftest.h"

#define BLOCK (2u * 1024u * 1024u)
#define COPY_NS ((double)BLOCK * 1000.0 / FAKECUDA_H2D_BYTES_PER_US) /* one block at the link's rate */
#define CREDIT_NS 900000u                                           /* under the 1 ms kept */

#define COMPUTE_NS 2000000u                                         /* what the kernel below computes */

static void k_compute(void **params, const fakecuda_dims *d)
{
    (void)params; (void)d;
    fakecuda_compute(COMPUTE_NS);
}

static atomic_int gate;
static void wait_for_gate(void *ud) { (void)ud; selftest_wait_for(&gate); }
static void overslept(void *ud) { (void)ud; fakecuda_credit_oversleep(CREDIT_NS); }
static void sleep_ns(long ns)
{
    struct timespec ts = { 0, ns };
    nanosleep(&ts, NULL);
}
static double now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}
static double elapsed_ns(CUevent a, CUevent b)
{
    float ms = -1e9f;
    OK(cuEventElapsedTime(&ms, a, b));
    return (double)ms * 1e6;
}

void selftest_clock(struct selftest_main *m)
{
    (void)m;
    CUstream s, other;
    CUevent t0, t1, done;
    OK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    OK(cuStreamCreate(&other, CU_STREAM_NON_BLOCKING));
    OK(cuEventCreate(&t0, 0));
    OK(cuEventCreate(&t1, 0));
    OK(cuEventCreate(&done, 0));
    CUmemLocation gpu = { .type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0 };

    /* A prefetch queued behind a credited oversleep: its events are a copy apart. The
     * stream is held until all is queued, and the queue's not-before times are well past. */
    float *first = selftest_managed_filled(BLOCK, 1.0f);
    atomic_store(&gate, 0);
    OK(cuLaunchHostFunc(s, wait_for_gate, NULL));
    OK(cuLaunchHostFunc(s, overslept, NULL));
    OK(cuEventRecord(t0, s));
    OK(cuMemPrefetchAsync_v2((CUdeviceptr)(uintptr_t)first, BLOCK, gpu, 0, s));
    OK(cuEventRecord(t1, s));
    sleep_ns(3000000);
    atomic_store(&gate, 1);
    OK(cuStreamSynchronize(s));
    double took = elapsed_ns(t0, t1);
    CHECK(took >= 0.99 * COPY_NS && took < 1e9, "a credited prefetch's events %.0f ns apart, its copy %.0f", took,
          COPY_NS);

    /* The credit does not outlast the stream's wait for work. */
    float *second = selftest_managed_filled(BLOCK, 1.0f);
    OK(cuLaunchHostFunc(s, overslept, NULL));
    OK(cuStreamSynchronize(s));
    double t = now_ns();
    OK(cuMemPrefetchAsync_v2((CUdeviceptr)(uintptr_t)second, BLOCK, gpu, 0, s));
    OK(cuStreamSynchronize(s));
    took = now_ns() - t;
    CHECK(took >= COPY_NS, "a prefetch after an idle stream done in %.0f ns, its copy %.0f", took, COPY_NS);

    /* A stream that waited for another's event is stamped no earlier than it, with a
     * credit of its own; also when the event was done before the wait was asked for (no
     * wait is queued then). */
    for (int done_first = 0; done_first < 2; done_first++) {
        OK(cuEventRecord(done, other));
        if (done_first) OK(cuStreamSynchronize(other));
        atomic_store(&gate, 0);
        OK(cuLaunchHostFunc(s, wait_for_gate, NULL));
        OK(cuLaunchHostFunc(s, overslept, NULL));
        OK(cuStreamWaitEvent(s, done, 0));
        OK(cuEventRecord(t1, s));
        atomic_store(&gate, 1);
        OK(cuStreamSynchronize(s));
        took = elapsed_ns(done, t1);
        CHECK(took >= 0, "an event after a wait (on an event done %s) stamped %.0f ns after it",
              done_first ? "before" : "meanwhile", took);
    }

    /* A kernel that computes takes its time between its events; outside a kernel, nothing. */
    CUmodule mod;
    CUfunction compute;
    OK(fakecuda_register_kernel("compute", k_compute, 0, NULL, NULL) == 0 ? CUDA_SUCCESS : CUDA_ERROR_UNKNOWN);
    OK(cuModuleLoadData(&mod, "clock"));
    OK(cuModuleGetFunction(&compute, mod, "compute"));
    OK(cuEventRecord(t0, s));
    OK(cuLaunchKernel(compute, 1, 1, 1, 1, 1, 1, 0, s, NULL, NULL));
    OK(cuEventRecord(t1, s));
    OK(cuStreamSynchronize(s));
    took = elapsed_ns(t0, t1);
    CHECK(took >= COMPUTE_NS && took < 1e9, "a kernel computing %u ns took %.0f between its events", COMPUTE_NS, took);
    uint64_t mine = fakecuda_thread_host_ns();
    t = now_ns();
    fakecuda_compute(COMPUTE_NS);
    CHECK(fakecuda_thread_host_ns() == mine && now_ns() - t < COMPUTE_NS, "fakecuda_compute outside a kernel");
    OK(cuModuleUnload(mod));

    OK(cuMemFree((CUdeviceptr)(uintptr_t)first));
    OK(cuMemFree((CUdeviceptr)(uintptr_t)second));
    OK(cuEventDestroy(t0));
    OK(cuEventDestroy(t1));
    OK(cuEventDestroy(done));
    OK(cuStreamDestroy(s));
    OK(cuStreamDestroy(other));
}
