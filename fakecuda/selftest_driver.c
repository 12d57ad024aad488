/* selftest_driver.c: why it exists: fakecuda's self-test of the driver's own behaviour, each
 * in a child process with its knobs (selftest.c runs them): the host cost of each entry point
 * (launch, prefetch per block and pass, a migration to the host waiting for its copies,
 * discard, events, queries, synchronisation), which thread pays for ioctls, the va_space lock
 * an allocation waits for, and device memory as the UVM driver manages it (root chunks kept
 * after their pages leave, eviction in allocation order: unused, then discarded, then used;
 * plain allocations evicting managed memory; out of memory only when nothing is left). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <cuda.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "fakecuda.h"
#include "fakecuda_model.h"
#include "selftest.h"


#define MiB (1024ull * 1024ull)
#define PAGE (64ull * 1024ull)
#define BLOCK_PASS ((unsigned long long)FAKECUDA_BLOCK_PASS_NS)
#define IOCTL ((unsigned long long)FAKECUDA_IOCTL_NS)
/* The CPU time of moving `bytes` of pages (FAKECUDA_MIGRATE_BLOCK_NS per 2 MiB, pro rata). */
#define MOVED(bytes) ((unsigned long long)(bytes) * FAKECUDA_MIGRATE_BLOCK_NS / (2 * MiB))

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static _Atomic uint64_t kernel_started_ns;
static void k_touch(void **params, const fakecuda_dims *d)
{
    (void)d;
    atomic_store(&kernel_started_ns, now_ns());
    fakecuda_touch(*(void **)params[0], *(size_t *)params[1]);
}

static CUfunction ftouch;
static CUstream st;

static int setup(void)
{
    size_t sz[2] = { sizeof(void *), sizeof(size_t) }, al[2] = { _Alignof(void *), _Alignof(size_t) };
    fakecuda_register_kernel("touch", k_touch, 2, sz, al);
    CUcontext c;
    CUmodule m;
    if (cuInit(0) || cuDevicePrimaryCtxRetain(&c, 0) || cuCtxSetCurrent(c) || cuModuleLoadData(&m, "x") ||
        cuModuleGetFunction(&ftouch, m, "touch") || cuStreamCreate(&st, CU_STREAM_NON_BLOCKING))
        return -1;
    return 0;
}

static void touch(CUdeviceptr p, size_t n)
{
    void *args[] = { &p, &n };
    OK(cuLaunchKernel(ftouch, 1, 1, 1, 1, 1, 1, 0, st, args, NULL));
    OK(cuStreamSynchronize(st));
}

static CUdeviceptr managed(size_t n)
{
    CUdeviceptr p = 0;
    OK(cuMemAllocManaged(&p, n, CU_MEM_ATTACH_GLOBAL));
    fakecuda_host_touch((void *)(uintptr_t)p, n);
    return p;
}

static struct fakecuda_entry_cost cost(const char *entry)
{
    struct fakecuda_entry_cost c = { 0, 0, 0 };
    CHECK(fakecuda_get_entry_cost(entry, &c) == 0, "entry %s", entry);
    return c;
}

static CUresult prefetch(CUdeviceptr p, size_t n, int device)
{
    CUmemLocation l;
    memset(&l, 0, sizeof l);
    l.type = device < 0 ? CU_MEM_LOCATION_TYPE_HOST : CU_MEM_LOCATION_TYPE_DEVICE;
    l.id = device < 0 ? 0 : device;
    return cuMemPrefetchAsync(p, n, l, 0, st);
}

/* A thread that migrates 256 MiB to the host: its call holds the va_space lock for about
 * 11 ms of copies. */
#define EVICTED (256 * MiB)
static atomic_int evictor_ready, evictor_result;
static void *evictor(void *arg)
{
    CUdeviceptr p = *(CUdeviceptr *)arg;
    atomic_store(&evictor_ready, 1);
    atomic_store(&evictor_result, prefetch(p, EVICTED, -1));
    return NULL;
}

/* On a thread of its own (no check counters touched there). */
struct pl_args { CUdeviceptr p; uint64_t *t0; CUresult result; uint64_t charged; };
static void *prefetch_then_launch(void *arg)
{
    struct pl_args *a = arg;
    CUcontext c;
    size_t n = PAGE;
    void *args[] = { &a->p, &n };
    if ((a->result = cuDevicePrimaryCtxRetain(&c, 0)) != CUDA_SUCCESS || (a->result = cuCtxSetCurrent(c)))
        return NULL;
    *a->t0 = now_ns();
    uint64_t before = fakecuda_thread_host_ns();
    if ((a->result = prefetch(a->p, 6 * MiB, 0)) == CUDA_SUCCESS)
        a->result = cuLaunchKernel(ftouch, 1, 1, 1, 1, 1, 1, 0, st, args, NULL);
    a->charged = fakecuda_thread_host_ns() - before;
    return NULL;
}

/* FAKECUDA_IOCTL_THREAD unset (caller): what each entry point charges the calling thread. */
static int child_cost(void)
{
    if (setup() != 0) return 1;
    CUdeviceptr a = managed(8 * MiB);
    fakecuda_reset_stats();

    touch(a, PAGE);
    struct fakecuda_entry_cost c = cost("launch");
    CHECK(c.calls == 1 && c.caller_ns == FAKECUDA_LAUNCH_HOST_NS && c.worker_ns == 0, "launch %llu calls %llu ns",
          (unsigned long long)c.calls, (unsigned long long)c.caller_ns);
    CHECK(cost("synchronize").caller_ns == FAKECUDA_SYNC_HOST_NS, "stream synchronize");

    /* One block: one pass; three blocks: two passes each, resident or not; and the pages that
       move (the first call's: the host-touched 6 MiB less the page the kernel faulted in). */
    fakecuda_reset_stats();
    OK(prefetch(a, PAGE, 0));
    CHECK(cost("prefetch").caller_ns == IOCTL + BLOCK_PASS, "one resident page: %llu ns",
          (unsigned long long)cost("prefetch").caller_ns);
    fakecuda_reset_stats();
    OK(prefetch(a, 6 * MiB, 0));
    OK(cuStreamSynchronize(st));
    unsigned long long moved = selftest_stats().bytes_prefetched_h2d;
    OK(prefetch(a, 6 * MiB, 0)); /* all resident now */
    c = cost("prefetch");
    CHECK(moved == 6 * MiB - PAGE && c.calls == 2 && c.caller_ns == 2 * (IOCTL + 3 * 2 * BLOCK_PASS) + MOVED(moved),
          "three blocks twice: %llu ns, %llu bytes moved", (unsigned long long)c.caller_ns, moved);

    /* The launch after a prefetch starts no earlier than the prefetch's and its own host time
       (on a fresh thread: no credit for oversleeping earlier). */
    OK(cuStreamSynchronize(st));
    pthread_t t;
    uint64_t t0 = 0;
    struct pl_args pl = { a, &t0, CUDA_SUCCESS, 0 };
    uint64_t mine = fakecuda_thread_host_ns();
    pthread_create(&t, NULL, prefetch_then_launch, &pl);
    pthread_join(t, NULL);
    CHECK(pl.result == CUDA_SUCCESS, "prefetch and launch on a thread: %d", (int)pl.result);
    /* Each thread is charged what it called: the other thread's calls are not this one's. */
    CHECK(pl.charged == IOCTL + 6 * BLOCK_PASS + FAKECUDA_LAUNCH_HOST_NS && fakecuda_thread_host_ns() == mine,
          "charged to the calling thread: %llu ns there, %llu here", (unsigned long long)pl.charged,
          (unsigned long long)(fakecuda_thread_host_ns() - mine));
    OK(cuStreamSynchronize(st));
    uint64_t floor = IOCTL + 6 * BLOCK_PASS + FAKECUDA_LAUNCH_HOST_NS + FAKECUDA_LAUNCH_LATENCY_US * 1000ull;
    CHECK(atomic_load(&kernel_started_ns) - t0 >= floor, "kernel started %llu ns after, before %llu",
          (unsigned long long)(atomic_load(&kernel_started_ns) - t0), (unsigned long long)floor);

    /* To the host: the call waits for its copies of the 4 MiB on the device, the CPU time of
     * moving their pages inside that wait (the measured rate is the whole call's). */
    fakecuda_reset_stats();
    OK(prefetch(a, 4 * MiB, -1));
    unsigned long long copy = 4 * MiB * 1000 / FAKECUDA_PREFETCH_D2H_BYTES_PER_US;
    CHECK(copy > MOVED(4 * MiB) && cost("prefetch").caller_ns == IOCTL + 2 * 2 * BLOCK_PASS + copy,
          "to host: %llu ns", (unsigned long long)cost("prefetch").caller_ns);
    OK(cuStreamSynchronize(st));

    /* Discard: one ioctl, a wait per block; the first write afterwards faults. */
    fakecuda_reset_stats();
    CUdeviceptr dp[1] = { a + 6 * MiB };
    size_t ds[1] = { 2 * MiB };
    OK(cuMemDiscardBatchAsync(dp, ds, 1, 0, st));
    CHECK(cost("discard").caller_ns == IOCTL + BLOCK_PASS, "discard: %llu ns", (unsigned long long)cost("discard").caller_ns);
    touch(a + 6 * MiB, PAGE);
    CHECK(selftest_stats().gpu_faults == 1, "write after discard faults (%llu)", (unsigned long long)selftest_stats().gpu_faults);

    /* Events, queries. */
    fakecuda_reset_stats();
    CUevent ev;
    OK(cuEventCreate(&ev, 0));
    OK(cuEventRecord(ev, st));
    OK(cuStreamWaitEvent(st, ev, 0));
    (void)cuEventQuery(ev);
    (void)cuStreamQuery(st);
    OK(cuEventSynchronize(ev));
    size_t fr, tot;
    OK(cuMemGetInfo(&fr, &tot));
    CUdeviceptr base;
    OK(cuPointerGetAttribute(&base, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, a));
    CHECK(cost("event_record").caller_ns == FAKECUDA_EVENT_RECORD_HOST_NS, "event record");
    CHECK(cost("stream_wait_event").caller_ns == FAKECUDA_STREAM_WAIT_EVENT_HOST_NS, "stream wait");
    CHECK(cost("event_query").caller_ns == FAKECUDA_QUERY_HOST_NS, "event query");
    CHECK(cost("stream_query").caller_ns == FAKECUDA_QUERY_HOST_NS, "stream query");
    CHECK(cost("synchronize").caller_ns == FAKECUDA_SYNC_HOST_NS, "event synchronize");
    CHECK(cost("mem_get_info").caller_ns == FAKECUDA_RM_CALL_NS, "cuMemGetInfo");
    CHECK(cost("pointer_query").caller_ns == FAKECUDA_POINTER_QUERY_HOST_NS, "pointer query");
    CUstreamCaptureStatus capturing;
    OK(cuStreamIsCapturing(st, &capturing));
    CHECK(cost("capture_query").caller_ns == FAKECUDA_CAPTURE_QUERY_HOST_NS, "capture query");
    CUcontext cur;
    OK(cuCtxGetCurrent(&cur));
    OK(cuStreamGetCtx(st, &cur));
    CHECK(cost("context_query").calls == 2 && cost("context_query").caller_ns == 2 * FAKECUDA_CONTEXT_QUERY_HOST_NS,
          "context queries");
    uint64_t sum = 0;
    for (unsigned i = 0; fakecuda_entry_name(i); i++) sum += cost(fakecuda_entry_name(i)).caller_ns;
    CHECK(sum == selftest_stats().driver_host_ns, "driver_host_ns is the sum over entry points");
    CHECK(fakecuda_get_entry_cost("nope", &c) == -1, "unknown entry point");

    /* An allocation waits for the va_space lock a migration to the host holds. */
    CUdeviceptr big = managed(EVICTED);
    uint64_t waited = 0;
    for (int attempt = 0; attempt < 5 && !waited; attempt++) {
        OK(prefetch(big, EVICTED, 0));
        OK(cuStreamSynchronize(st));
        fakecuda_reset_stats();
        atomic_store(&evictor_ready, 0);
        pthread_t t;
        pthread_create(&t, NULL, evictor, &big);
        while (!atomic_load(&evictor_ready)) {}
        struct timespec pause = { 0, 2000000 };
        nanosleep(&pause, NULL);
        CUdeviceptr x;
        OK(cuMemAllocManaged(&x, PAGE, CU_MEM_ATTACH_GLOBAL));
        pthread_join(t, NULL);
        CHECK(atomic_load(&evictor_result) == CUDA_SUCCESS, "host prefetch on a thread");
        OK(cuMemFree(x));
        waited = selftest_stats().va_lock_wait_ns;
    }
    CHECK(waited > 0, "cuMemAllocManaged waited for the va_space lock");
    return failed ? 1 : 0;
}

/* FAKECUDA_IOCTL_THREAD=worker: the caller pays a stream push, the stream's worker the ioctl. */
static int child_cost_worker(void)
{
    if (setup() != 0) return 1;
    CUdeviceptr a = managed(6 * MiB);
    fakecuda_reset_stats();
    uint64_t mine = fakecuda_thread_host_ns();
    OK(prefetch(a, 6 * MiB, 0));
    uint64_t charged = fakecuda_thread_host_ns() - mine;
    OK(cuStreamSynchronize(st));
    struct fakecuda_entry_cost c = cost("prefetch");
    CHECK(c.caller_ns == FAKECUDA_LAUNCH_HOST_NS && c.worker_ns == IOCTL + 3 * 2 * BLOCK_PASS + MOVED(6 * MiB),
          "worker pays: caller %llu worker %llu", (unsigned long long)c.caller_ns, (unsigned long long)c.worker_ns);
    CHECK(charged == FAKECUDA_LAUNCH_HOST_NS, "the calling thread is charged the push alone: %llu ns",
          (unsigned long long)charged);
    CHECK(selftest_stats().bytes_prefetched_h2d == 6 * MiB, "pages moved");
    /* To the host: the worker's ioctl holds the lock while the pages are copied out. */
    fakecuda_reset_stats();
    OK(prefetch(a, 2 * MiB, -1));
    OK(cuStreamSynchronize(st));
    c = cost("prefetch");
    CHECK(c.caller_ns == FAKECUDA_LAUNCH_HOST_NS && c.worker_ns == IOCTL + BLOCK_PASS + MOVED(2 * MiB) &&
              selftest_stats().bytes_d2h == 2 * MiB,
          "to host on the worker: caller %llu worker %llu", (unsigned long long)c.caller_ns,
          (unsigned long long)c.worker_ns);
    return failed ? 1 : 0;
}

/* FAKECUDA_DEVICE_MEMORY=8M: four root chunks. */
static int child_evict(void)
{
    if (setup() != 0) return 1;
    size_t fr, tot;
    CUdeviceptr a = managed(4 * MiB), b = managed(4 * MiB), c = managed(4 * MiB);
    OK(prefetch(a, 4 * MiB, 0));
    OK(prefetch(b, 4 * MiB, 0));
    OK(cuStreamSynchronize(st));
    OK(cuMemGetInfo(&fr, &tot));
    CHECK(fr == 0, "a and b fill the device (free %zu)", fr);
    fakecuda_host_touch((void *)(uintptr_t)a, PAGE); /* a page leaves: its chunk stays taken */
    OK(cuMemGetInfo(&fr, &tot));
    CHECK(fr == 0, "a chunk stays taken after its page leaves (free %zu)", fr);
    touch(a, 4 * MiB); /* a used last: no matter, allocation order decides */
    fakecuda_reset_stats();
    OK(prefetch(c, 4 * MiB, 0));
    OK(cuStreamSynchronize(st));
    struct fakecuda_stats s = selftest_stats();
    CHECK(s.driver_evictions == 2 && s.bytes_evicted_d2h == 4 * MiB && s.bytes_prefetched_h2d == 4 * MiB,
          "c evicts a's two chunks, first allocated (%llu evictions, %llu bytes)",
          (unsigned long long)s.driver_evictions, (unsigned long long)s.bytes_evicted_d2h);
    fakecuda_reset_stats();
    touch(b, 4 * MiB);
    CHECK(selftest_stats().gpu_faults == 0, "b still resident");

    /* Unused chunks go first: b's second block leaves for the host, a plain allocation takes it. */
    fakecuda_host_touch((void *)(uintptr_t)(b + 2 * MiB), 2 * MiB);
    fakecuda_reset_stats();
    CUdeviceptr plain1, plain2, plain3;
    OK(cuMemAlloc(&plain1, 2 * MiB));
    s = selftest_stats();
    CHECK(s.driver_evictions == 1 && s.bytes_evicted_d2h == 0, "unused chunk evicted first, nothing copied (%llu, %llu)",
          (unsigned long long)s.driver_evictions, (unsigned long long)s.bytes_evicted_d2h);
    /* Then discarded ones, before older used ones: c's second block is discarded. */
    CUdeviceptr dp[1] = { c + 2 * MiB };
    size_t ds[1] = { 2 * MiB };
    OK(cuMemDiscardBatchAsync(dp, ds, 1, 0, st));
    OK(cuStreamSynchronize(st));
    fakecuda_reset_stats();
    OK(cuMemAlloc(&plain2, 2 * MiB));
    s = selftest_stats();
    CHECK(s.driver_evictions == 1 && s.bytes_evicted_d2h == 0, "discarded chunk before used ones (%llu, %llu)",
          (unsigned long long)s.driver_evictions, (unsigned long long)s.bytes_evicted_d2h);
    touch(b, 2 * MiB);
    CHECK(selftest_stats().gpu_faults == 0, "b's first block, older, still resident");
    /* Used chunks last, oldest first; out of memory only when nothing is left. */
    fakecuda_reset_stats();
    OK(cuMemAlloc(&plain3, 4 * MiB));
    s = selftest_stats();
    CHECK(s.driver_evictions == 2 && s.bytes_evicted_d2h == 4 * MiB, "used chunks copied out (%llu, %llu)",
          (unsigned long long)s.driver_evictions, (unsigned long long)s.bytes_evicted_d2h);
    CUdeviceptr none;
    CHECK(cuMemAlloc(&none, PAGE) == CUDA_ERROR_OUT_OF_MEMORY, "nothing evictable left: out of memory");
    /* A kernel with no room left: faults, and the page stays on the host. */
    fakecuda_reset_stats();
    touch(b, PAGE);
    touch(b, PAGE);
    s = selftest_stats();
    CHECK(s.gpu_faults == 2 && s.device_resident_bytes == 0, "no room: every access faults (%llu)",
          (unsigned long long)s.gpu_faults);
    OK(prefetch(a, 4 * MiB, 0));
    OK(cuStreamSynchronize(st));
    CHECK(selftest_stats().bytes_prefetched_h2d == 0, "no room: a prefetch moves nothing");
    /* Room again: evicted pages coming back are counted. */
    OK(cuMemFree(plain3));
    fakecuda_reset_stats();
    touch(b, 2 * MiB);
    s = selftest_stats();
    CHECK(s.bytes_evicted_h2d == 2 * MiB, "evicted pages back on the device (%llu)", (unsigned long long)s.bytes_evicted_h2d);
    OK(cuMemFree(plain1));
    OK(cuMemFree(plain2));
    return failed ? 1 : 0;
}

/* FAKECUDA_DEVICES=64: the most the driver's own tools report on one node (issue 14); the
 * last device works as the first does. */
static int child_devices_64(void)
{
    if (setup() != 0) {
        CHECK(0, "child setup");
        return 1;
    }
    int n = 0;
    OK(cuDeviceGetCount(&n));
    CHECK(n == 64, "FAKECUDA_DEVICES=64 gives %d", n);
    CUuuid first, last;
    OK(cuDeviceGetUuid(&first, 0));
    OK(cuDeviceGetUuid(&last, 63));
    CHECK(memcmp(&first, &last, sizeof first) != 0, "device 63 has a UUID of its own");
    CUcontext c63;
    CUstream s63;
    if (cuDevicePrimaryCtxRetain(&c63, 63) != CUDA_SUCCESS) {
        CHECK(0, "device 63's primary context");
        return 1;
    }
    OK(cuCtxPushCurrent(c63));
    OK(cuStreamCreate(&s63, CU_STREAM_NON_BLOCKING));
    CUdeviceptr p = managed(16 * PAGE);
    CUmemLocation l = { .type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 63 };
    OK(cuMemPrefetchAsync(p, 16 * PAGE, l, 0, s63));
    OK(cuStreamSynchronize(s63));
    size_t fr, tot;
    OK(cuMemGetInfo(&fr, &tot));
    CHECK(tot - fr == 16 * PAGE, "device 63 holds the prefetched pages (%zu)", tot - fr);
    fakecuda_reset_stats();
    size_t bytes = 16 * PAGE;
    void *args[] = { &p, &bytes };
    OK(cuLaunchKernel(ftouch, 1, 1, 1, 1, 1, 1, 0, s63, args, NULL));
    OK(cuStreamSynchronize(s63));
    CHECK(selftest_stats().gpu_faults == 0, "a kernel on device 63 finds them there");
    OK(cuStreamDestroy(s63));
    OK(cuCtxPopCurrent(&c63));
    OK(cuMemFree(p));
    return failed ? 1 : 0;
}

const struct selftest_driver_mode selftest_driver_modes[] = {
    { "driver-cost", NULL, child_cost },
    { "driver-cost-worker", "FAKECUDA_IOCTL_THREAD=worker", child_cost_worker },
    { "driver-evict", "FAKECUDA_DEVICE_MEMORY=8M", child_evict },
    { "contexts", NULL, selftest_child_contexts },
    { "default-streams", NULL, selftest_child_default_streams },
    { "copies", NULL, selftest_child_copies },
    { "pools", NULL, selftest_child_pools },
    { "faults", NULL, selftest_child_faults },
    { "faults-prefetch-off", "FAKECUDA_UVM_PERF_PREFETCH_ENABLE=0", selftest_child_faults_prefetch_off },
    { "faults-min-faults", "FAKECUDA_UVM_PERF_PREFETCH_MIN_FAULTS=20", selftest_child_faults_min_faults },
    { "faults-threshold-50", "FAKECUDA_UVM_PERF_PREFETCH_THRESHOLD=50", selftest_child_faults_threshold_50 },
    { "faults-batch-one", "FAKECUDA_UVM_PERF_FAULT_BATCH_COUNT=1", selftest_child_faults_batch_one },
    { "faults-evict", "FAKECUDA_DEVICE_MEMORY=4M", selftest_child_faults_evict },
    { "read-mostly", "FAKECUDA_DEVICE_MEMORY=4M", selftest_child_read_mostly },
    { "discard-fill-none", "FAKECUDA_DISCARD_FILL=none", selftest_child_discard_fill_none },
    { "pool-prefetch", "FAKECUDA_POOL_PREFETCH=refuse", selftest_child_pool_prefetch },
    { "pool-prefetch-refuse-after", "FAKECUDA_POOL_PREFETCH_REFUSE_AFTER=2", selftest_child_pool_prefetch_refuse_after },
    { "devices-64", "FAKECUDA_DEVICES=64", child_devices_64 },
    { "runtime", "FAKECUDA_PERSONA=h100-sxm-80gb", selftest_child_runtime },
    { "context-work", NULL, selftest_child_context_work },
    { "context-work-a100", "FAKECUDA_PERSONA=a100-pcie-40gb", selftest_child_context_work },
    { "launch-uses", NULL, selftest_child_launch_uses },
    { "dead-moves", NULL, selftest_child_dead_moves },
    { NULL, NULL, NULL },
};
