/* selftest_memory.c: why it exists: the memory topics of fakecuda's self-test main sequence
 * (selftest.c runs them in order on what it set up): faults of a host-filled buffer, prefetch
 * (single and batched, with the batch's checks), unused prefetched bytes and CPU faults, discard
 * (and one racing a migration on another stream), a prefetch raced by a kernel on another stream; then pointer attributes, plain and
 * stream-ordered allocations, memory pools (stream-ordered reuse), cuMemCreate and mappings (vmm.c);
 * and, in a child, a discard under FAKECUDA_DISCARD_FILL=none. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <cuda.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

#include "fakecuda.h"
#include "selftest.h"

#define MiB (1024u * 1024u)
#define PAGE (64u * 1024u)

/* The race kernel tells the host it has started; a host function on another stream waits
 * for that (no timing luck). */
static atomic_int race_started;
void selftest_k_race(void **params, const fakecuda_dims *d)
{
    atomic_store(&race_started, 1);
    selftest_k_double(params, d);
}
static void host_wait_race(void *ud) { (void)ud; selftest_wait_for(&race_started); }
static atomic_int go_free;
static void host_hold(void *ud) { selftest_wait_for((atomic_int *)ud); }

/* 3c. a discard unordered with a migration of its pages on another stream (discard_races.c):
 * the migration, enqueued first, is still waiting when the discard runs: counted, and what is
 * written there afterwards is lost at the next move; the same after the migration has
 * completed, asked for on an idle stream, is no race; asked for on a stream still waiting for
 * it, the discard is late, and counted too. */
static void discard_races(CUstream s1, CUstream s2, float *a, CUmemLocation dloc)
{
    CUmemLocation host = { .type = CU_MEM_LOCATION_TYPE_HOST, .id = 0 };
    CUdeviceptr p = (CUdeviceptr)(uintptr_t)a;
    size_t bytes = 4 * PAGE;
    static atomic_int release;
    atomic_store(&release, 0);
    fakecuda_reset_stats();
    OK(cuMemPrefetchAsync((CUdeviceptr)(uintptr_t)a, bytes, dloc, 0, s1));
    OK(cuStreamSynchronize(s1));
    OK(cuLaunchHostFunc(s2, host_hold, &release));
    OK(cuMemPrefetchAsync(p, bytes, host, 0, s2));  /* an eviction, held back */
    OK(cuMemDiscardBatchAsync(&p, &bytes, 1, 0, s1));
    OK(cuStreamSynchronize(s1));
    atomic_store(&release, 1);
    OK(cuStreamSynchronize(s2));
    struct fakecuda_stats st = selftest_stats();
    CHECK(st.discard_races == 1 && st.bytes_lost_to_discard_races == 0, "race: %llu, lost %llu",
          (unsigned long long)st.discard_races, (unsigned long long)st.bytes_lost_to_discard_races);
    fakecuda_host_touch(a, bytes);
    a[0] = 7.0f;  /* written after the race */
    OK(cuMemPrefetchAsync(p, bytes, dloc, 0, s1));
    OK(cuStreamSynchronize(s1));
    uint32_t word;
    memcpy(&word, a, sizeof word);
    CHECK(word == 0xFFFFFFFFu && selftest_stats().bytes_lost_to_discard_races > 0,
          "a write after the race is lost at the next move (%08x)", word);
    fakecuda_host_touch(a, bytes);
    a[0] = 7.0f;
    OK(cuMemPrefetchAsync(p, bytes, dloc, 0, s1));  /* the prefetch cleared the stuck status */
    OK(cuStreamSynchronize(s1));
    CHECK(a[0] == 7.0f, "kept once a prefetch cleared the status");

    /* ordered: the eviction done first, the discard asked for on an idle stream */
    fakecuda_reset_stats();
    OK(cuMemPrefetchAsync(p, bytes, host, 0, s2));
    OK(cuStreamSynchronize(s2));
    OK(cuMemDiscardBatchAsync(&p, &bytes, 1, 0, s1));
    OK(cuMemPrefetchAsync(p, bytes, dloc, 0, s1));
    OK(cuStreamSynchronize(s1));
    CHECK(selftest_stats().discard_races == 0, "an ordered discard races nothing (%llu)",
          (unsigned long long)selftest_stats().discard_races);
    /* a discard asked for on a stream still waiting (here for the eviction, by an event) lands
     * late: the work queued behind it may overtake it, so its pages keep the stuck status */
    CUevent moved;
    OK(cuEventCreate(&moved, CU_EVENT_DISABLE_TIMING));
    atomic_store(&release, 0);
    OK(cuLaunchHostFunc(s2, host_hold, &release));
    OK(cuMemPrefetchAsync(p, bytes, host, 0, s2));
    OK(cuEventRecord(moved, s2));
    OK(cuStreamWaitEvent(s1, moved, 0));
    OK(cuMemDiscardBatchAsync(&p, &bytes, 1, 0, s1));
    atomic_store(&release, 1);
    OK(cuStreamSynchronize(s1));
    CHECK(selftest_stats().discard_races == 1, "a discard on a busy stream is late (%llu)",
          (unsigned long long)selftest_stats().discard_races);
    fakecuda_host_touch(a, bytes);
    a[0] = 7.0f;
    OK(cuMemPrefetchAsync(p, bytes, dloc, 0, s1));
    OK(cuStreamSynchronize(s1));
    memcpy(&word, a, sizeof word);
    CHECK(word == 0xFFFFFFFFu, "a write after a late discard is lost at the next move (%08x)", word);
    OK(cuEventDestroy(moved));
    fakecuda_host_touch(a, bytes);
}

void selftest_managed(struct selftest_main *m)
{
    CUstream s1 = m->s1, s2 = m->s2;
    CUfunction fdouble = m->fdouble, frace = m->frace;

    /* 1. faults: 16 MiB, host-filled, one kernel: 256 faults */
    const size_t big = 16 * MiB, nbig = big / sizeof(float);
    float *a = selftest_managed_filled(big, 1.0f);
    CHECK(a && ((uintptr_t)a & (2 * MiB - 1)) == 0, "managed base 2 MiB aligned");
    fakecuda_reset_stats();
    void *args_a[] = { &a, (void *)&nbig };
    OK(cuLaunchKernel(fdouble, 1, 1, 1, 128, 1, 1, 0, s1, args_a, NULL));
    OK(cuStreamSynchronize(s1));
    struct fakecuda_stats st = selftest_stats();
    CHECK(selftest_all_equal(a, nbig, 2.0f), "kernel doubled");
    CHECK(st.gpu_faults == 256, "gpu_faults %llu", (unsigned long long)st.gpu_faults);
    CHECK(st.bytes_faulted_h2d == big && st.pages_touched_by_kernels == 256 && st.kernels_run == 1 &&
              st.launches == 1, "fault counters");
    size_t fr = 0, tot = 0;
    OK(cuMemGetInfo(&fr, &tot));
    CHECK(tot - fr == big, "cuMemGetInfo counts resident managed bytes (%zu)", tot - fr);

    /* 2. prefetch (v2 + batch): no faults */
    float *b = selftest_managed_filled(big, 3.0f);
    fakecuda_reset_stats();
    CUmemLocation dloc = { .type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0 };
    OK(cuMemPrefetchAsync((CUdeviceptr)(uintptr_t)b, big / 2, dloc, 0, s1));
    CUdeviceptr bp[2] = { (CUdeviceptr)(uintptr_t)b + big / 2, (CUdeviceptr)(uintptr_t)b + 3 * big / 4 };
    size_t bs[2] = { big / 4, big / 4 }, idx0[1] = { 0 };
    OK(cuMemPrefetchBatchAsync(bp, bs, 2, &dloc, idx0, 1, 0, s1));
    void *args_b[] = { &b, (void *)&nbig };
    OK(cuLaunchKernel(fdouble, 1, 1, 1, 1, 1, 1, 0, s1, args_b, NULL));
    OK(cuStreamSynchronize(s1));
    st = selftest_stats();
    CHECK(st.gpu_faults == 0, "no faults after prefetch (%llu)", (unsigned long long)st.gpu_faults);
    CHECK(st.bytes_prefetched_h2d == big && st.bytes_prefetched_unused == 0, "prefetched %llu unused %llu",
          (unsigned long long)st.bytes_prefetched_h2d, (unsigned long long)st.bytes_prefetched_unused);
    CHECK(st.prefetch_calls == 1 && st.batch_prefetch_calls == 1, "prefetch call counters");
    CHECK(selftest_all_equal(b, nbig, 6.0f), "values after prefetched kernel");
    /* batch validation */
    CHECK(cuMemPrefetchBatchAsync(bp, bs, 2, &dloc, idx0, 1, 0, NULL) == CUDA_ERROR_INVALID_VALUE, "legacy stream");
    CHECK(cuMemPrefetchBatchAsync(bp, bs, 2, &dloc, idx0, 1, 0, CU_STREAM_LEGACY) == CUDA_ERROR_INVALID_VALUE,
          "CU_STREAM_LEGACY");
    size_t idx1[1] = { 1 }, idx2[2] = { 0, 0 };
    CUmemLocation locs2[2] = { dloc, dloc };
    CHECK(cuMemPrefetchBatchAsync(bp, bs, 2, &dloc, idx1, 1, 0, s1) == CUDA_ERROR_INVALID_VALUE, "idx[0] != 0");
    CHECK(cuMemPrefetchBatchAsync(bp, bs, 2, locs2, idx2, 2, 0, s1) == CUDA_ERROR_INVALID_VALUE, "not increasing");
    CHECK(cuMemPrefetchBatchAsync(bp, bs, 2, &dloc, idx0, 1, 1, s1) == CUDA_ERROR_INVALID_VALUE, "flags");
    int on_stack = 0;
    CHECK(cuMemPrefetchAsync((CUdeviceptr)(uintptr_t)&on_stack, 4, dloc, 0, s1) == CUDA_ERROR_INVALID_VALUE,
          "prefetch outside managed memory");
    CHECK(cuMemPrefetchAsync((CUdeviceptr)(uintptr_t)b, big + 1, dloc, 0, s1) == CUDA_ERROR_INVALID_VALUE,
          "prefetch past the allocation");

    /* 3. prefetched then host-touched: unused bytes and CPU faults */
    fakecuda_reset_stats();
    OK(cuMemPrefetchAsync((CUdeviceptr)(uintptr_t)a, 4 * PAGE, (CUmemLocation){ .type = CU_MEM_LOCATION_TYPE_HOST }, 0,
                          s1));
    OK(cuStreamSynchronize(s1));
    OK(cuMemPrefetchAsync((CUdeviceptr)(uintptr_t)a, 4 * PAGE, dloc, 0, s1));
    OK(cuStreamSynchronize(s1));
    CHECK(selftest_stats().bytes_prefetched_unused == 4 * PAGE, "untouched prefetch reported as unused");
    fakecuda_host_touch(a, 4 * PAGE);
    st = selftest_stats();
    CHECK(st.cpu_faults == 4 && st.bytes_d2h == 8 * PAGE && st.bytes_prefetched_unused == 4 * PAGE,
          "cpu faults %llu d2h %llu unused %llu", (unsigned long long)st.cpu_faults,
          (unsigned long long)st.bytes_d2h, (unsigned long long)st.bytes_prefetched_unused);

    /* 3b. a discard: whole pages inside the range go nowhere and are poisoned; a partly
     * covered page keeps its place and its bytes; the legacy stream is refused */
    fakecuda_reset_stats();
    OK(cuMemPrefetchAsync((CUdeviceptr)(uintptr_t)a, 4 * PAGE, dloc, 0, s1));
    OK(cuStreamSynchronize(s1));
    fakecuda_reset_stats();
    uint64_t resident_before = selftest_stats().device_resident_bytes;
    CUdeviceptr dptr = (CUdeviceptr)(uintptr_t)a + PAGE / 2;
    size_t dsize = 2 * PAGE;
    OK(cuMemDiscardBatchAsync(&dptr, &dsize, 1, 0, s1));
    OK(cuStreamSynchronize(s1));
    st = selftest_stats();
    CHECK(st.bytes_discarded == PAGE && st.bytes_d2h == 0 && st.device_resident_bytes == resident_before - PAGE,
          "discard: %llu discarded, %llu resident", (unsigned long long)st.bytes_discarded,
          (unsigned long long)st.device_resident_bytes);
    uint32_t word0, word1;
    memcpy(&word0, (char *)a + PAGE / 2, sizeof word0);
    memcpy(&word1, (char *)a + PAGE, sizeof word1);
    CHECK(word0 != 0xFFFFFFFFu && word1 == 0xFFFFFFFFu, "discard poisons whole pages only");
    CHECK(cuMemDiscardBatchAsync(&dptr, &dsize, 1, 0, NULL) == CUDA_ERROR_INVALID_VALUE,
          "discard on the legacy stream refused");
    /* a copy reading the discarded page counts it; once written (a memset), it does not */
    CUdeviceptr lost_page = (CUdeviceptr)(uintptr_t)a + PAGE, after = (CUdeviceptr)(uintptr_t)a + 3 * PAGE;
    OK(cuMemcpyAsync(after, lost_page, PAGE, s1));
    OK(cuStreamSynchronize(s1));
    CHECK(selftest_stats().bytes_read_discarded == PAGE, "a read of discarded bytes counted (%llu)",
          (unsigned long long)selftest_stats().bytes_read_discarded);
    OK(cuMemsetD32Async(lost_page, 0, PAGE / 4, s1));
    OK(cuMemcpyAsync(after, lost_page, PAGE, s1));
    OK(cuStreamSynchronize(s1));
    CHECK(selftest_stats().bytes_read_discarded == PAGE, "a written page is read as any other");
    fakecuda_host_touch(a, 4 * PAGE);
    discard_races(s1, s2, a, dloc);

    /* 4. a prefetch raced by a kernel on another stream that does not wait: the prefetch
     * starts once the kernel has started, so the kernel faults on pages not yet moved */
    float *c = selftest_managed_filled(4 * big, 1.0f);
    size_t nc = 4 * big / sizeof(float);
    fakecuda_reset_stats();
    OK(cuLaunchHostFunc(s1, host_wait_race, NULL));
    OK(cuMemPrefetchAsync((CUdeviceptr)(uintptr_t)c, 4 * big, dloc, 0, s1));
    void *args_c[] = { &c, &nc };
    OK(cuLaunchKernel(frace, 1, 1, 1, 1, 1, 1, 0, s2, args_c, NULL));
    OK(cuCtxSynchronize());
    st = selftest_stats();
    CHECK(st.gpu_faults > 0, "racing kernel faults (%llu)", (unsigned long long)st.gpu_faults);
    CHECK(st.bytes_prefetched_h2d + st.bytes_faulted_h2d == 4 * big, "each page moved once");
    CHECK(selftest_all_equal(c, nc, 2.0f), "raced kernel values");
    m->a = a;
    m->b = b;
    m->c = c;
}

void selftest_memory(struct selftest_main *m)
{
    CUstream s1 = m->s1, s2 = m->s2;
    CUdevice dev = m->dev;
    CUfunction fdouble = m->fdouble;
    float *a = m->a;
    const size_t big = 16 * MiB;
    int on_stack = 0;
    size_t fr = 0, tot = 0;

    /* 12. pointers, plain and stream-ordered memory */
    unsigned int is_managed = 7;
    CUdeviceptr start = 0;
    size_t range = 0;
    int ordinal = -1;
    CUdeviceptr inner = (CUdeviceptr)(uintptr_t)a + 12345;
    OK(cuPointerGetAttribute(&is_managed, CU_POINTER_ATTRIBUTE_IS_MANAGED, inner));
    OK(cuPointerGetAttribute(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, inner));
    OK(cuPointerGetAttribute(&range, CU_POINTER_ATTRIBUTE_RANGE_SIZE, inner));
    OK(cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, inner));
    CHECK(is_managed == 1 && start == (CUdeviceptr)(uintptr_t)a && range == big && ordinal == 0, "pointer attributes");
    CHECK(cuPointerGetAttribute(&is_managed, CU_POINTER_ATTRIBUTE_IS_MANAGED, (CUdeviceptr)(uintptr_t)&on_stack) ==
              CUDA_ERROR_INVALID_VALUE, "unknown pointer");
    CUdeviceptr plain = 0, async = 0, base = 0;
    OK(cuMemAlloc(&plain, 1000));
    OK(cuPointerGetAttribute(&is_managed, CU_POINTER_ATTRIBUTE_IS_MANAGED, plain));
    CHECK(is_managed == 0 && plain % 256 == 0, "plain allocation");
    OK(cuMemGetAddressRange(&base, &range, plain + 10));
    CHECK(base == plain && range == 1000, "address range");
    OK(cuMemAllocAsync(&async, 4096, s1));
    OK(cuMemFreeAsync(async, s1));
    OK(cuStreamSynchronize(s1));
    CHECK(cuMemGetAddressRange(&base, &range, async) == CUDA_ERROR_NOT_FOUND, "freed in stream order");
    CUipcMemHandle ipc;
    OK(cuIpcGetMemHandle(&ipc, plain));
    CHECK(cuIpcGetMemHandle(&ipc, (CUdeviceptr)(uintptr_t)a) == CUDA_ERROR_INVALID_VALUE, "no IPC of managed memory");
    OK(cuMemFree(plain));
    CHECK(cuMemFree(plain) == CUDA_ERROR_INVALID_VALUE, "double free refused");

    /* 12b. memory pools: the managed default pool gives managed memory that faults */
    CUmemoryPool pinned_pool = NULL, managed_pool = NULL, current = NULL, own = NULL;
    CUmemLocation dev0 = { .type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0 };
    OK(cuMemGetDefaultMemPool(&pinned_pool, &dev0, CU_MEM_ALLOCATION_TYPE_PINNED));
    OK(cuMemGetDefaultMemPool(&managed_pool, &dev0, CU_MEM_ALLOCATION_TYPE_MANAGED));
    OK(cuDeviceGetMemPool(&current, dev));
    CHECK(pinned_pool && managed_pool && pinned_pool != managed_pool && current == pinned_pool, "default pools");
    OK(cuDeviceGetDefaultMemPool(&current, dev));
    CHECK(current == pinned_pool, "device default pool is the pinned one");
    CHECK(cuMemGetDefaultMemPool(&current, &dev0, CU_MEM_ALLOCATION_TYPE_INVALID) == CUDA_ERROR_INVALID_VALUE,
          "pool type checked");
    CUdeviceptr pooled = 0;
    OK(cuMemAllocFromPoolAsync(&pooled, 4 * PAGE, managed_pool, s1));
    OK(cuPointerGetAttribute(&is_managed, CU_POINTER_ATTRIBUTE_IS_MANAGED, pooled));
    CHECK(is_managed == 1 && pooled % (2 * MiB) == 0, "managed pool memory is managed");
    OK(cuStreamSynchronize(s1));
    fakecuda_reset_stats();
    float *pf = (float *)(uintptr_t)pooled;
    size_t npf = 4 * PAGE / sizeof(float);
    fakecuda_host_touch(pf, 4 * PAGE);
    for (size_t i = 0; i < npf; i++) pf[i] = 1.0f;
    void *args_pf[] = { &pf, &npf };
    OK(cuLaunchKernel(fdouble, 1, 1, 1, 1, 1, 1, 0, s1, args_pf, NULL));
    OK(cuStreamSynchronize(s1));
    CHECK(selftest_stats().gpu_faults == 4 && selftest_all_equal(pf, npf, 2.0f), "managed pool memory faults like managed memory");
    /* stream-ordered reuse: while its free has not run, the memory goes to the next allocation
       of the same size from the same pool on the same stream, its pages where they were */
    uint64_t resident_with_pooled = selftest_stats().device_resident_bytes;
    OK(cuLaunchHostFunc(s1, host_hold, &go_free)); /* the frees below wait behind it */
    OK(cuMemFreeAsync(pooled, s1));
    CHECK(cuMemFreeAsync(pooled, s1) == CUDA_ERROR_INVALID_VALUE, "stream-ordered double free refused");
    CUdeviceptr again = 0, other = 0;
    OK(cuMemAllocFromPoolAsync(&other, 4 * PAGE, managed_pool, s2));
    CHECK(other != pooled, "no reuse on another stream");
    OK(cuMemAllocFromPoolAsync(&again, 4 * PAGE, managed_pool, s1));
    CHECK(again == pooled && selftest_stats().allocations_reused == 1, "reused on the same stream");
    OK(cuMemFreeAsync(again, s1));
    OK(cuMemAllocFromPoolAsync(&again, 2 * PAGE, managed_pool, s1));
    CHECK(again != pooled, "no reuse for another size");
    OK(cuMemFreeAsync(again, s1));
    OK(cuMemFreeAsync(other, s2));
    atomic_store(&go_free, 1);
    OK(cuStreamSynchronize(s1));
    OK(cuStreamSynchronize(s2));
    CHECK(selftest_stats().device_resident_bytes == resident_with_pooled - 4 * PAGE &&
              cuMemGetAddressRange(&base, &range, pooled) == CUDA_ERROR_NOT_FOUND,
          "a free that ran gave the memory back");
    CUmemPoolProps props = { .allocType = CU_MEM_ALLOCATION_TYPE_PINNED, .location = dev0 };
    OK(cuMemPoolCreate(&own, &props));
    OK(cuDeviceSetMemPool(dev, own));
    OK(cuDeviceGetMemPool(&current, dev));
    CHECK(current == own, "current pool set");
    CHECK(cuDeviceSetMemPool(dev, managed_pool) == CUDA_ERROR_INVALID_VALUE, "a managed pool cannot be current");
    OK(cuMemAllocAsync(&async, 4096, s1));
    OK(cuPointerGetAttribute(&is_managed, CU_POINTER_ATTRIBUTE_IS_MANAGED, async));
    CHECK(is_managed == 0, "pinned pool memory is plain");
    OK(cuMemFreeAsync(async, s1));
    OK(cuStreamSynchronize(s1)); /* its bytes are free before 12c counts free memory */
    OK(cuMemPoolDestroy(own));
    OK(cuDeviceGetMemPool(&current, dev));
    CHECK(current == pinned_pool, "destroying the current pool restores the default");
    CHECK(cuMemPoolDestroy(pinned_pool) == CUDA_ERROR_INVALID_VALUE, "a default pool cannot be destroyed");

    /* 12c. cuMemCreate: physical device memory, by handle */
    CUmemAllocationProp vmm = { .type = CU_MEM_ALLOCATION_TYPE_PINNED, .location = dev0 };
    CUmemGenericAllocationHandle phys = 0;
    OK(cuMemGetInfo(&fr, &tot));
    size_t free_before = fr;
    CHECK(cuMemCreate(&phys, 4096, &vmm, 0) == CUDA_ERROR_INVALID_VALUE, "cuMemCreate granularity");
    OK(cuMemCreate(&phys, 2 * MiB, &vmm, 0));
    OK(cuMemGetInfo(&fr, &tot));
    CHECK(free_before - fr == 2 * MiB, "cuMemCreate counts against the device");
    OK(cuMemRelease(phys));
    OK(cuMemGetInfo(&fr, &tot));
    CHECK(fr == free_before, "cuMemRelease gives it back");

    /* 12d. reserve, map, grant access, copy, retain, unmap, free (PyTorch's expandable segments) */
    size_t gran = 0;
    OK(cuMemGetAllocationGranularity(&gran, &vmm, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
    CHECK(gran == 2 * MiB, "granularity 2 MiB");
    CUdeviceptr va = 0;
    OK(cuMemAddressReserve(&va, 8 * gran, 0, 0, 0));
    CHECK(va != 0 && va % gran == 0, "reservation aligned");
    OK(cuMemCreate(&phys, gran, &vmm, 0));
    CHECK(cuMemMap(va + 8 * gran, gran, 0, phys, 0) == CUDA_ERROR_INVALID_VALUE, "map outside the reservation");
    OK(cuMemMap(va + gran, gran, 0, phys, 0));
    CHECK(cuMemMap(va + gran, gran, 0, phys, 0) == CUDA_ERROR_INVALID_VALUE, "map over a mapping");
    CHECK(cuMemRelease(phys) == CUDA_SUCCESS, "release while mapped");
    CUmemAccessDesc rw = { .location = dev0, .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE };
    CHECK(cuMemSetAccess(va, 2 * gran, &rw, 1) == CUDA_ERROR_INVALID_VALUE, "access to unmapped addresses");
    OK(cuMemSetAccess(va + gran, gran, &rw, 1));
    unsigned words[4] = { 7, 7, 7, 7 }, back[4] = { 0 };
    OK(cuMemcpyHtoD(va + gran, words, sizeof words));
    OK(cuMemcpyDtoH(back, va + gran, sizeof back));
    CHECK(back[3] == 7, "a mapping is device memory");
    CUmemGenericAllocationHandle retained = 0;
    CUmemAllocationProp asked = { 0 };
    OK(cuMemRetainAllocationHandle(&retained, (void *)(uintptr_t)(va + gran + 64)));
    OK(cuMemGetAllocationPropertiesFromHandle(&asked, retained));
    CHECK(retained == phys && asked.location.id == dev0.id, "the mapped handle, retained");
    OK(cuMemRelease(retained));
    CHECK(cuMemAddressFree(va, 8 * gran) == CUDA_ERROR_INVALID_VALUE, "a reservation with a mapping");
    OK(cuMemGetInfo(&fr, &tot));
    CHECK(free_before - fr == gran, "a mapped handle holds its memory after its release");
    OK(cuMemUnmap(va + gran, gran));
    OK(cuMemGetInfo(&fr, &tot));
    CHECK(fr == free_before, "its last unmap frees a released handle");
    OK(cuMemAddressFree(va, 8 * gran));
}

/* FAKECUDA_DISCARD_FILL=none (a child): a discarded page keeps its bytes, and is lost all the
 * same: a copy's read of it counts. */
int selftest_child_discard_fill_none(void)
{
    CUcontext c;
    CUstream s;
    CHECK(!cuInit(0) && !cuDevicePrimaryCtxRetain(&c, 0) && !cuCtxSetCurrent(c) &&
              !cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), "child setup");
    float *a = selftest_managed_filled(2 * PAGE, 1.0f);
    CHECK(a != NULL, "managed memory");
    if (failed) return 1;
    const CUmemLocation dev = { .type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0 };
    OK(cuMemPrefetchAsync((CUdeviceptr)(uintptr_t)a, 2 * PAGE, dev, 0, s));
    CUdeviceptr lost_page = (CUdeviceptr)(uintptr_t)a;
    size_t size = PAGE;
    fakecuda_reset_stats();
    OK(cuMemDiscardBatchAsync(&lost_page, &size, 1, 0, s));
    OK(cuStreamSynchronize(s));
    CHECK(selftest_stats().bytes_discarded == PAGE, "one page discarded (%llu)",
          (unsigned long long)selftest_stats().bytes_discarded);
    CHECK(selftest_all_equal(a, PAGE / sizeof *a, 1.0f), "its bytes left as they were");
    OK(cuMemcpyAsync(lost_page + PAGE, lost_page, PAGE, s));
    OK(cuStreamSynchronize(s));
    CHECK(selftest_stats().bytes_read_discarded == PAGE, "a read of it counted (%llu)",
          (unsigned long long)selftest_stats().bytes_read_discarded);
    return failed ? 1 : 0;
}
