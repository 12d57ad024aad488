/* selftest_faults.c: why it exists: fakecuda's self-test of the GPU fault path as the UVM
 * driver's, each check in a child process with its knobs (selftest.c runs them): faults
 * fetched in batches of uvm_perf_fault_batch_count, the fault-time prefetcher (threshold,
 * its subregions, never across a VA block, clipped to a short block, off with a preferred
 * location elsewhere, the whole block on a first touch to the preferred location,
 * min_faults, off with its knob), a kernel waiting for an eviction and then the fill, one
 * after the other, and the list rules for short blocks. */
#include <cuda.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fakecuda.h"
#include "fakecuda_model.h"
#include "selftest.h"

#define MiB (1024ull * 1024ull)
#define PAGE ((unsigned long long)FAKECUDA_PAGE)
#define U(x) ((unsigned long long)(x))
/* A page's transfer and a fault's service, as migrate.c charges them */
#define XFER_NS (PAGE * 1000ull / FAKECUDA_H2D_BYTES_PER_US)
#define EVICT_NS (PAGE * 1000ull / FAKECUDA_EVICT_D2H_BYTES_PER_US) /* a page the driver evicts */
#define FAULT_NS (FAKECUDA_GPU_FAULT_US * 1000ull)

static CUfunction ftouch;
static CUstream st;

static void k_touch(void **params, const fakecuda_dims *d)
{
    (void)d;
    fakecuda_touch(*(void **)params[0], *(size_t *)params[1]);
}

static int setup(void)
{
    size_t sz[2] = { sizeof(void *), sizeof(size_t) }, al[2] = { _Alignof(void *), _Alignof(size_t) };
    fakecuda_register_kernel("touch", k_touch, 2, sz, al);
    CUcontext c;
    CUmodule m;
    return cuInit(0) || cuDevicePrimaryCtxRetain(&c, 0) || cuCtxSetCurrent(c) || cuModuleLoadData(&m, "x") ||
                   cuModuleGetFunction(&ftouch, m, "touch") || cuStreamCreate(&st, CU_STREAM_NON_BLOCKING)
               ? -1
               : 0;
}

/* One kernel, one burst of accesses to [p, p+n) */
static void touch(CUdeviceptr p, size_t n)
{
    void *args[] = { &p, &n };
    OK(cuLaunchKernel(ftouch, 1, 1, 1, 1, 1, 1, 0, st, args, NULL));
    OK(cuStreamSynchronize(st));
}

/* Managed memory written by the host first (so its pages are on the host), stats reset. */
static CUdeviceptr host_filled(size_t n)
{
    CUdeviceptr p = 0;
    OK(cuMemAllocManaged(&p, n, CU_MEM_ATTACH_GLOBAL));
    fakecuda_host_touch((void *)(uintptr_t)p, n);
    fakecuda_reset_stats();
    return p;
}

/* A sequential scan, one 64 KiB page per kernel: the faults it takes. */
static unsigned long long scan(CUdeviceptr p, size_t n)
{
    fakecuda_reset_stats();
    for (size_t off = 0; off < n; off += PAGE) touch(p + off, PAGE);
    struct fakecuda_stats s = selftest_stats();
    CHECK(s.gpu_fault_batches == s.gpu_faults && s.bytes_h2d == n, "scan: a batch per fault, every byte in once "
          "(%llu batches, %llu faults, %llu bytes)", U(s.gpu_fault_batches), U(s.gpu_faults), U(s.bytes_h2d));
    return s.gpu_faults;
}

static int child_batches(void)
{
    if (setup() != 0) return 1;
    /* 512 faulting pages in one burst: two batches of 256 (uvm_perf_fault_batch_count), each
     * page a fault and a transfer, nothing prefetched (every page of each block faulted). */
    CUdeviceptr a = host_filled(32 * MiB);
    touch(a, 32 * MiB);
    struct fakecuda_stats s = selftest_stats();
    CHECK(s.gpu_faults == 512 && s.gpu_fault_batches == 2 && s.bytes_fault_prefetched_h2d == 0 &&
          s.bytes_faulted_h2d == 32 * MiB && s.bytes_h2d == 32 * MiB && s.bytes_d2h_all == 0,
          "32 MiB in one burst: 512 faults in 2 batches (%llu, %llu, prefetched %llu)", U(s.gpu_faults),
          U(s.gpu_fault_batches), U(s.bytes_fault_prefetched_h2d));
    CHECK(s.gpu_fault_stall_ns == 512 * (FAULT_NS + XFER_NS), "stall: a fault's service and transfer per page (%llu)",
          U(s.gpu_fault_stall_ns));
    /* The same pages again: resident, no fault, no batch */
    fakecuda_reset_stats();
    touch(a, 32 * MiB);
    CHECK(selftest_stats().gpu_fault_batches == 0, "resident: no batch");

    /* A sequential scan a page at a time: faults at pages 0, 1, 2, 4, 8, 16 of each block;
     * each time the next power-of-two subregion is more than 51% covered. */
    CUdeviceptr b = host_filled(4 * MiB);
    unsigned long long f = scan(b, 4 * MiB);
    CHECK(f == 12, "sequential scan: 6 faults per 2 MiB block (%llu)", f);

    /* 17 of 32 pages in one burst: 53% of the block, more than 51%: the whole block. 16: 50%,
     * not more: the 1 MiB subregion only, which the faults cover. Never the next block. */
    CUdeviceptr c = host_filled(4 * MiB);
    touch(c, 17 * PAGE);
    s = selftest_stats();
    CHECK(s.gpu_faults == 17 && s.bytes_fault_prefetched_h2d == 15 * PAGE && s.device_resident_bytes == 2 * MiB + 32 * MiB + 4 * MiB,
          "17 pages of 32: the rest of the block prefetched, not the next (%llu faults, %llu prefetched)",
          U(s.gpu_faults), U(s.bytes_fault_prefetched_h2d));
    fakecuda_reset_stats();
    touch(c + 2 * MiB, 16 * PAGE);
    s = selftest_stats();
    CHECK(s.gpu_faults == 16 && s.bytes_fault_prefetched_h2d == 0, "16 pages of 32, 50%%: nothing more (%llu)",
          U(s.bytes_fault_prefetched_h2d));

    /* A short block (the allocation's last, 3 pages): the tree is clipped to it: 2 of 3
     * faulted, 66%, brings the third, and nothing past the allocation. */
    CUdeviceptr d = host_filled(2 * MiB + 3 * PAGE);
    touch(d + 2 * MiB, 2 * PAGE);
    s = selftest_stats();
    CHECK(s.gpu_faults == 2 && s.bytes_fault_prefetched_h2d == PAGE, "short block: 2 of 3 bring the third (%llu)",
          U(s.bytes_fault_prefetched_h2d));

    /* A preferred location other than the faulting device: no prefetching, a fault a page. */
    CUdeviceptr e = host_filled(2 * MiB);
    CUmemLocation host, dev0;
    memset(&host, 0, sizeof host);
    memset(&dev0, 0, sizeof dev0);
    host.type = CU_MEM_LOCATION_TYPE_HOST;
    dev0.type = CU_MEM_LOCATION_TYPE_DEVICE;
    OK(cuMemAdvise(e, 2 * MiB, CU_MEM_ADVISE_SET_PREFERRED_LOCATION, host));
    f = scan(e, 2 * MiB);
    CHECK(f == 32, "preferred location the host: 32 faults (%llu)", f);
    OK(cuMemAdvise(e, 2 * MiB, CU_MEM_ADVISE_UNSET_PREFERRED_LOCATION, host));
    fakecuda_host_touch((void *)(uintptr_t)e, 2 * MiB);
    f = scan(e, 2 * MiB);
    CHECK(f == 6, "unset: the prefetcher again (%llu)", f);
    /* The destination preferred and nothing of the block anywhere yet: one fault populates
     * the whole block there (nothing crosses the link: first touch). */
    CUdeviceptr g = 0;
    OK(cuMemAllocManaged(&g, 2 * MiB, CU_MEM_ATTACH_GLOBAL));
    OK(cuMemAdvise(g, 2 * MiB, CU_MEM_ADVISE_SET_PREFERRED_LOCATION, dev0));
    fakecuda_reset_stats();
    unsigned long long before = selftest_stats().device_resident_bytes;
    touch(g, PAGE);
    s = selftest_stats();
    CHECK(s.gpu_faults == 1 && s.device_resident_bytes - before == 2 * MiB && s.bytes_h2d == 0,
          "first touch to the preferred location: the whole block (%llu faults, %llu resident)", U(s.gpu_faults),
          U(s.device_resident_bytes));
    return failed ? 1 : 0;
}

/* FAKECUDA_UVM_PERF_PREFETCH_ENABLE=0: one page per fault. */
static int child_prefetch_off(void)
{
    if (setup() != 0) return 1;
    unsigned long long f = scan(host_filled(2 * MiB), 2 * MiB);
    CHECK(f == 32, "prefetcher off: 32 faults (%llu)", f);
    return failed ? 1 : 0;
}

/* FAKECUDA_UVM_PERF_PREFETCH_THRESHOLD=50: 16 of 32 pages is 50%, not more: nothing more;
 * 17 of 32: the rest of the block. */
static int child_threshold_50(void)
{
    if (setup() != 0) return 1;
    CUdeviceptr a = host_filled(4 * MiB);
    touch(a, 16 * PAGE);
    CHECK(selftest_stats().bytes_fault_prefetched_h2d == 0, "16 of 32 at 50%%: nothing prefetched");
    touch(a + 2 * MiB, 17 * PAGE);
    CHECK(selftest_stats().bytes_fault_prefetched_h2d == 15 * PAGE, "17 of 32 at 50%%: the block");
    return failed ? 1 : 0;
}

/* FAKECUDA_UVM_PERF_PREFETCH_MIN_FAULTS=20: the block's 20th fault is the first to prefetch
 * (20 of 32 counted: the whole block). */
static int child_min_faults(void)
{
    if (setup() != 0) return 1;
    unsigned long long f = scan(host_filled(2 * MiB), 2 * MiB);
    CHECK(f == 20, "min_faults 20: 20 faults (%llu)", f);
    return failed ? 1 : 0;
}

/* FAKECUDA_UVM_PERF_FAULT_BATCH_COUNT=1: one burst over 4 MiB is serviced as a sequential
 * scan: 6 faults per block. With FAKECUDA_UVM_PERF_PREFETCH_THRESHOLD=100 too (no subregion is
 * more than 100% covered): no prefetching, 64 faults in 64 batches. */
static int child_batch_one(void)
{
    if (setup() != 0) return 1;
    const char *t = getenv("FAKECUDA_UVM_PERF_PREFETCH_THRESHOLD");
    unsigned long long want = t && !strcmp(t, "100") ? 64 : 12;
    CUdeviceptr a = host_filled(4 * MiB);
    touch(a, 4 * MiB);
    struct fakecuda_stats s = selftest_stats();
    CHECK(s.gpu_faults == want && s.gpu_fault_batches == want && s.bytes_h2d == 4 * MiB,
          "batches of 1: %llu batches, expected %llu", U(s.gpu_fault_batches), want);
    return failed ? 1 : 0;
}

/* FAKECUDA_DEVICE_MEMORY=4M: the device holds two root chunks. */
static int child_evict_fill(void)
{
    if (setup() != 0) return 1;
    CUdeviceptr a = host_filled(4 * MiB), b = host_filled(2 * MiB);
    touch(a, 4 * MiB);
    fakecuda_reset_stats();
    touch(b, 2 * MiB);
    /* b's block evicts a's first (the oldest USED), then fills: the kernel waits for the
     * 2 MiB copied out and then for its faults, not for the longer of the two. */
    struct fakecuda_stats s = selftest_stats();
    CHECK(s.driver_evictions == 1 && s.bytes_evicted_d2h == 2 * MiB && s.bytes_d2h_all == 2 * MiB &&
              s.bytes_h2d == 2 * MiB && s.gpu_faults == 32,
          "one chunk evicted, one filled (%llu evictions, %llu out, %llu in)", U(s.driver_evictions),
          U(s.bytes_evicted_d2h), U(s.bytes_h2d));
    CHECK(s.gpu_fault_stall_ns == 32 * EVICT_NS + 32 * (FAULT_NS + XFER_NS),
          "eviction, then fill: stall %llu ns, expected %llu", U(s.gpu_fault_stall_ns),
          32 * EVICT_NS + 32 * (FAULT_NS + XFER_NS));
    OK(cuMemFree(a));
    OK(cuMemFree(b));

    /* A short block whose pages all leave stays on USED (block_clear_resident_processor acts
     * only on 2 MiB blocks): the next eviction takes the older full block, copying it,
     * where a short block's chunk on UNUSED would have cost nothing. */
    CUdeviceptr y = host_filled(2 * MiB), x = host_filled(1 * MiB), z = host_filled(2 * MiB);
    touch(y, 2 * MiB);
    touch(x, 1 * MiB);
    fakecuda_host_touch((void *)(uintptr_t)x, 1 * MiB);
    fakecuda_reset_stats();
    touch(z, 2 * MiB);
    s = selftest_stats();
    CHECK(s.driver_evictions == 1 && s.bytes_evicted_d2h == 2 * MiB,
          "short block not on UNUSED: the full block before it is evicted, copied (%llu evictions, %llu bytes)",
          U(s.driver_evictions), U(s.bytes_evicted_d2h));
    return failed ? 1 : 0;
}

int selftest_child_faults(void) { return child_batches(); }
int selftest_child_faults_prefetch_off(void) { return child_prefetch_off(); }
int selftest_child_faults_min_faults(void) { return child_min_faults(); }
int selftest_child_faults_threshold_50(void) { return child_threshold_50(); }
int selftest_child_faults_batch_one(void) { return child_batch_one(); }
int selftest_child_faults_evict(void) { return child_evict_fill(); }
