/* selftest_read_mostly.c: why it exists: fakecuda's self-test of read-mostly memory
 * (cuMemAdvise CU_MEM_ADVISE_SET_READ_MOSTLY) as the UVM driver keeps it (migrate.c cites
 * the source), in a child process with a device of two root chunks: a read duplicates a page
 * (copied in, its host copy still valid), an eviction of a duplicate copies nothing back, a
 * prefetch to the host of a duplicate moves nothing and leaves it on the device, a write
 * faults and collapses the copies so that its eviction copies again, a prefetch to the host
 * of a read-mostly page only on the device copies it out and leaves it there, and unsetting
 * the advice collapses a duplicate to the host without a copy. Memory without the advice
 * pays the copy back (the check that the model is not kinder than the driver elsewhere). */
#include <cuda.h>
#include <stdint.h>

#include "fakecuda.h"
#include "selftest.h"

#define MiB (1024ull * 1024ull)
#define U(x) ((unsigned long long)(x))

static CUfunction fwrite_k, fread_k;
static CUstream st;
static const CUmemLocation device0 = { .type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0 },
                           host = { .type = CU_MEM_LOCATION_TYPE_HOST, .id = 0 };

static void k_write(void **params, const fakecuda_dims *d)
{
    (void)d;
    fakecuda_touch(*(void **)params[0], *(size_t *)params[1]);
}

static void k_read(void **params, const fakecuda_dims *d)
{
    (void)d;
    fakecuda_touch_read(*(void **)params[0], *(size_t *)params[1]);
}

static int setup(void)
{
    size_t sz[2] = { sizeof(void *), sizeof(size_t) }, al[2] = { _Alignof(void *), _Alignof(size_t) };
    fakecuda_register_kernel("rm_write", k_write, 2, sz, al);
    fakecuda_register_kernel("rm_read", k_read, 2, sz, al);
    CUcontext c;
    CUmodule m;
    return cuInit(0) || cuDevicePrimaryCtxRetain(&c, 0) || cuCtxSetCurrent(c) || cuModuleLoadData(&m, "x") ||
                   cuModuleGetFunction(&fwrite_k, m, "rm_write") || cuModuleGetFunction(&fread_k, m, "rm_read") ||
                   cuStreamCreate(&st, CU_STREAM_NON_BLOCKING)
               ? -1
               : 0;
}

static void run(CUfunction f, CUdeviceptr p, size_t n)
{
    void *args[] = { &p, &n };
    OK(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, st, args, NULL));
    OK(cuStreamSynchronize(st));
}

/* 2 MiB of managed memory written by the host, read-mostly or not; stats reset. */
static CUdeviceptr host_written(int read_mostly)
{
    CUdeviceptr p = 0;
    OK(cuMemAllocManaged(&p, 2 * MiB, CU_MEM_ATTACH_GLOBAL));
    fakecuda_host_touch((void *)(uintptr_t)p, 2 * MiB);
    if (read_mostly) OK(cuMemAdvise(p, 2 * MiB, CU_MEM_ADVISE_SET_READ_MOSTLY, device0));
    fakecuda_reset_stats();
    return p;
}

/* Fills the device's two chunks with 4 MiB written by a kernel: the driver evicts what was
 * there. The stats of that, then reset. */
static struct fakecuda_stats push_out(void)
{
    CUdeviceptr w = 0;
    OK(cuMemAllocManaged(&w, 4 * MiB, CU_MEM_ATTACH_GLOBAL));
    fakecuda_reset_stats();
    run(fwrite_k, w, 4 * MiB);
    struct fakecuda_stats s = selftest_stats();
    OK(cuMemFree(w));
    fakecuda_reset_stats();
    return s;
}

static void to_host(CUdeviceptr p)
{
    OK(cuMemPrefetchAsync(p, 2 * MiB, host, 0, st));
    OK(cuStreamSynchronize(st));
}

/* FAKECUDA_DEVICE_MEMORY=4M: two root chunks. */
int selftest_child_read_mostly(void)
{
    if (setup() != 0) return 1;
    /* Without the advice, a page a kernel only read is copied back when evicted (UVM does
     * not track dirtiness). */
    CUdeviceptr plain = host_written(0);
    run(fread_k, plain, 2 * MiB);
    struct fakecuda_stats s = push_out();
    CHECK(s.driver_evictions == 1 && s.bytes_evicted_d2h == 2 * MiB, "plain memory read: its eviction copies "
          "2 MiB (%llu evictions, %llu bytes)", U(s.driver_evictions), U(s.bytes_evicted_d2h));
    OK(cuMemFree(plain));

    /* Read-mostly: a read copies the page in, and its host copy stays valid. */
    CUdeviceptr r = host_written(1);
    run(fread_k, r, 2 * MiB);
    s = selftest_stats();
    CHECK(s.bytes_h2d == 2 * MiB && s.gpu_faults == 32 && s.device_resident_bytes == 2 * MiB,
          "a read duplicates: 2 MiB in, 32 faults (%llu bytes, %llu faults)", U(s.bytes_h2d), U(s.gpu_faults));
    /* A prefetch to the host of a duplicate moves nothing, and the device keeps its copy. */
    fakecuda_reset_stats();
    to_host(r);
    s = selftest_stats();
    CHECK(s.bytes_d2h_all == 0 && s.device_resident_bytes == 2 * MiB,
          "prefetch to the host of a duplicate: nothing moves, still on the device (%llu out, %llu resident)",
          U(s.bytes_d2h_all), U(s.device_resident_bytes));
    /* Its eviction copies nothing back. */
    s = push_out();
    CHECK(s.driver_evictions == 1 && s.bytes_evicted_d2h == 0 && s.bytes_d2h_all == 0,
          "a duplicate's eviction copies nothing (%llu evictions, %llu bytes)", U(s.driver_evictions),
          U(s.bytes_evicted_d2h));

    /* A write to a duplicate faults, moves nothing, and collapses the copies: the eviction
     * that follows copies the page back. */
    run(fread_k, r, 2 * MiB);
    fakecuda_reset_stats();
    run(fwrite_k, r, 2 * MiB);
    s = selftest_stats();
    CHECK(s.gpu_faults == 32 && s.bytes_h2d == 0 && s.bytes_d2h_all == 0,
          "a write to a duplicate faults, nothing moves (%llu faults, %llu in, %llu out)", U(s.gpu_faults),
          U(s.bytes_h2d), U(s.bytes_d2h_all));
    fakecuda_reset_stats();
    run(fwrite_k, r, 2 * MiB);
    CHECK(selftest_stats().gpu_faults == 0, "a second write: no fault (%llu)", U(selftest_stats().gpu_faults));
    s = push_out();
    CHECK(s.driver_evictions == 1 && s.bytes_evicted_d2h == 2 * MiB, "written: its eviction copies 2 MiB "
          "(%llu evictions, %llu bytes)", U(s.driver_evictions), U(s.bytes_evicted_d2h));

    /* A write from the host to a page only there, then a write on the device: no duplicate;
     * a prefetch to the host copies it out and leaves it on the device (a duplicate at the
     * host), so the next eviction is free again. */
    run(fwrite_k, r, 2 * MiB);
    fakecuda_reset_stats();
    to_host(r);
    s = selftest_stats();
    CHECK(s.bytes_d2h_all == 2 * MiB && s.device_resident_bytes == 2 * MiB,
          "prefetch to the host of a read-mostly page on the device: copied out, stays (%llu out, %llu resident)",
          U(s.bytes_d2h_all), U(s.device_resident_bytes));
    s = push_out();
    CHECK(s.bytes_evicted_d2h == 0, "then evicted for nothing (%llu)", U(s.bytes_evicted_d2h));

    /* The host's write to a duplicate: a CPU fault, nothing moves, the device's copy goes. */
    run(fread_k, r, 2 * MiB);
    fakecuda_reset_stats();
    fakecuda_host_touch((void *)(uintptr_t)r, 2 * MiB);
    s = selftest_stats();
    CHECK(s.cpu_faults == 32 && s.bytes_d2h_all == 0 && s.device_resident_bytes == 0,
          "the host writes a duplicate: %llu CPU faults, %llu out, %llu resident", U(s.cpu_faults),
          U(s.bytes_d2h_all), U(s.device_resident_bytes));

    /* Unsetting the advice collapses a duplicate to the host (no preferred location), no copy. */
    run(fread_k, r, 2 * MiB);
    fakecuda_reset_stats();
    OK(cuMemAdvise(r, 2 * MiB, CU_MEM_ADVISE_UNSET_READ_MOSTLY, device0));
    s = selftest_stats();
    CHECK(s.bytes_d2h_all == 0 && s.device_resident_bytes == 0, "unset: the duplicate collapses to the host "
          "(%llu out, %llu resident)", U(s.bytes_d2h_all), U(s.device_resident_bytes));
    /* No longer read-mostly: a read migrates, and its eviction copies. */
    run(fread_k, r, 2 * MiB);
    s = push_out();
    CHECK(s.bytes_evicted_d2h == 2 * MiB, "advice unset: a read page's eviction copies (%llu)",
          U(s.bytes_evicted_d2h));
    OK(cuMemFree(r));
    return failed ? 1 : 0;
}
