/* selftest_pools.c: why it exists: fakecuda's self-test of what a memory pool keeps, in a child
 * process of its own (selftest.c runs it): memory freed into a pool stays reserved and counted
 * against the device until a synchronisation above the release threshold (default 0) or a
 * cuMemPoolTrimTo releases it; released memory allocated again is reserved anew, at a cost, and
 * in a managed pool faults again; a threshold of UINT64_MAX (PyTorch's) keeps it, a lower one
 * keeps nothing above it; the attributes read and set as cuda.h documents them; a managed pool's
 * memory taken by the prefetch and discard calls and refused by advice (the H100's answers), or
 * refused by all three with FAKECUDA_POOL_PREFETCH=refuse (cuda.h's contract), or prefetched a
 * few times and then refused (FAKECUDA_POOL_PREFETCH_REFUSE_AFTER, an H200's answers). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <cuda.h>
#include <dlfcn.h>
#include <stdint.h>

#include "selftest.h"

#define PAGE (64u * 1024u)
#define PAGES 8u /* an activation's pages */
#define BYTES ((size_t)PAGES * PAGE)

static uint64_t attr(CUmemoryPool pool, CUmemPool_attribute a)
{
    cuuint64_t v = 0;
    OK(cuMemPoolGetAttribute(pool, a, &v));
    return v;
}

static void toucher(void **params, const fakecuda_dims *d)
{
    (void)d;
    fakecuda_touch(*(void **)params[0], BYTES);
}

/* One step as a training loop makes it: allocate, use on the device, free, synchronise. */
static CUdeviceptr step(CUmemoryPool pool, CUstream s, CUfunction touch)
{
    CUdeviceptr p = 0;
    OK(cuMemAllocFromPoolAsync(&p, BYTES, pool, s));
    void *ptr = (void *)(uintptr_t)p, *args[] = { &ptr };
    OK(cuLaunchKernel(touch, 1, 1, 1, 1, 1, 1, 0, s, args, NULL));
    OK(cuMemFreeAsync(p, s));
    OK(cuStreamSynchronize(s));
    return p;
}

static void attributes(CUmemoryPool pool)
{
    cuuint64_t v = 0;
    int flag = -1;
    CUmemAllocationType type = CU_MEM_ALLOCATION_TYPE_INVALID;
    CHECK(attr(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD) == 0, "release threshold defaults to 0");
    OK(cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC, &flag));
    CHECK(flag == 1, "reuse enabled by default");
    flag = 0;
    OK(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES, &flag));
    OK(cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES, &flag));
    CHECK(flag == 0, "a reuse flag set");
    flag = 1;
    OK(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES, &flag));
    OK(cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_ALLOCATION_TYPE, &type));
    CHECK(type == CU_MEM_ALLOCATION_TYPE_MANAGED, "allocation type");
    v = 1;
    CHECK(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH, &v) == CUDA_ERROR_INVALID_VALUE,
          "a high watermark is reset only to 0");
    CHECK(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &v) == CUDA_ERROR_INVALID_VALUE,
          "the current figures are read-only");
    CHECK(cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, NULL) == CUDA_ERROR_INVALID_VALUE,
          "NULL value refused");
    CHECK(cuMemPoolGetAttribute(NULL, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &v) == CUDA_ERROR_INVALID_VALUE,
          "NULL pool refused");
}

/* cuda.h 13.0: the ranges of the prefetch, discard and advice calls "must refer to managed
 * memory allocated via ::cuMemAllocManaged or declared via __managed__": with
 * FAKECUDA_POOL_PREFETCH=refuse a managed pool's memory is refused (CUDA_ERROR_INVALID_VALUE);
 * by default, as the H100's driver 580 answered, its prefetches and discards are taken and its
 * advice refused (CUDA_ERROR_NOT_SUPPORTED); cuMemAllocManaged's is taken either way. */
static void prefetch_contract(CUmemoryPool managed, CUstream s, int accepted)
{
    CUdeviceptr pooled = 0, own = 0;
    OK(cuMemAllocFromPoolAsync(&pooled, BYTES, managed, s));
    OK(cuMemAllocManaged(&own, BYTES, CU_MEM_ATTACH_GLOBAL));
    CUmemLocation dev0 = { .type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0 };
    size_t first = 0;
    /* the CUDA 8 form, which cuda.h 13.0 names only as cuMemPrefetchAsync_v2's predecessor */
    CUresult (*prefetch_v1)(CUdeviceptr, size_t, CUdevice, CUstream) =
        (CUresult(*)(CUdeviceptr, size_t, CUdevice, CUstream))dlsym(RTLD_DEFAULT, "cuMemPrefetchAsync");
    CHECK(prefetch_v1 != NULL, "cuMemPrefetchAsync (v1) exported");
    for (int i = 0; i < 2; i++) {
        CUdeviceptr p = i == 0 ? pooled : own;
        size_t size = BYTES;
        CUresult want = i == 0 && !accepted ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
        const char *what = i == 0 ? "a managed pool's memory" : "cuMemAllocManaged's memory";
        CHECK(cuMemPrefetchAsync_v2(p, BYTES, dev0, 0, s) == want, "cuMemPrefetchAsync_v2 of %s", what);
        CHECK(prefetch_v1 == NULL || prefetch_v1(p, BYTES, 0, s) == want, "cuMemPrefetchAsync (v1) of %s", what);
        CHECK(cuMemPrefetchBatchAsync(&p, &size, 1, &dev0, &first, 1, 0, s) == want, "batch prefetch of %s", what);
        CHECK(cuMemDiscardBatchAsync(&p, &size, 1, 0, s) == want, "batch discard of %s", what);
        CUresult advice = i == 0 && accepted ? CUDA_ERROR_NOT_SUPPORTED : want;
        CHECK(cuMemAdvise_v2(p, BYTES, CU_MEM_ADVISE_SET_ACCESSED_BY, dev0) == advice, "advice on %s", what);
    }
    CUdeviceptr both[] = { own, pooled };
    size_t sizes[] = { BYTES, BYTES };
    CHECK(cuMemPrefetchBatchAsync(both, sizes, 2, &dev0, &first, 1, 0, s) ==
              (accepted ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE),
          "one refused range refuses its whole batch");
    OK(cuMemFreeAsync(pooled, s));
    OK(cuStreamSynchronize(s));
    OK(cuMemFree(own));
}

static int setup(CUstream *s, CUfunction *touch)
{
    CUcontext ctx;
    CUmodule mod;
    size_t sizes[] = { sizeof(void *) }, aligns[] = { _Alignof(void *) };
    if (cuInit(0) || cuDevicePrimaryCtxRetain(&ctx, 0) || cuCtxSetCurrent(ctx) ||
        cuStreamCreate(s, CU_STREAM_NON_BLOCKING) || fakecuda_register_kernel("pool_touch", toucher, 1, sizes, aligns) ||
        cuModuleLoadData(&mod, "fakecuda") || cuModuleGetFunction(touch, mod, "pool_touch")) {
        CHECK(0, "child setup");
        return -1;
    }
    return 0;
}

/* A child's stream and device 0's managed pool (-1: no setup). */
static int pool_child(CUstream *s, CUmemoryPool *managed)
{
    CUfunction touch;
    if (setup(s, &touch) != 0) return -1;
    CUmemLocation dev0 = { .type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0 };
    *managed = NULL;
    OK(cuMemGetDefaultMemPool(managed, &dev0, CU_MEM_ALLOCATION_TYPE_MANAGED));
    return 0;
}

/* FAKECUDA_POOL_PREFETCH=refuse */
int selftest_child_pool_prefetch(void)
{
    CUstream s;
    CUmemoryPool managed;
    if (pool_child(&s, &managed) != 0) return 1;
    prefetch_contract(managed, s, 0);
    OK(cuStreamDestroy(s));
    return failed ? 1 : 0;
}

/* FAKECUDA_POOL_PREFETCH_REFUSE_AFTER=2: a managed pool's memory prefetched twice (one range of
 * a batch counting as one), then refused, its batch with it; cuMemAllocManaged's memory taken
 * all along, and the pool's discards too. */
int selftest_child_pool_prefetch_refuse_after(void)
{
    CUstream s;
    CUmemoryPool managed;
    if (pool_child(&s, &managed) != 0) return 1;
    CUmemLocation dev0 = { .type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0 };
    CUdeviceptr pooled = 0, own = 0;
    OK(cuMemAllocFromPoolAsync(&pooled, BYTES, managed, s));
    OK(cuMemAllocManaged(&own, BYTES, CU_MEM_ATTACH_GLOBAL));
    size_t size = BYTES, first = 0;
    CHECK(cuMemPrefetchAsync_v2(pooled, BYTES, dev0, 0, s) == CUDA_SUCCESS, "the first prefetch of pool memory taken");
    CHECK(cuMemPrefetchBatchAsync(&pooled, &size, 1, &dev0, &first, 1, 0, s) == CUDA_SUCCESS, "the second, a batch's");
    CHECK(cuMemPrefetchAsync_v2(pooled, BYTES, dev0, 0, s) == CUDA_ERROR_INVALID_VALUE, "the third refused");
    CUdeviceptr both[] = { own, pooled };
    size_t sizes[] = { BYTES, BYTES };
    CHECK(cuMemPrefetchBatchAsync(both, sizes, 2, &dev0, &first, 1, 0, s) == CUDA_ERROR_INVALID_VALUE,
          "a batch with pool memory refused");
    CHECK(cuMemPrefetchAsync_v2(own, BYTES, dev0, 0, s) == CUDA_SUCCESS, "cuMemAllocManaged's memory still taken");
    CHECK(cuMemDiscardBatchAsync(&pooled, &size, 1, 0, s) == CUDA_SUCCESS, "the pool's discards still taken");
    OK(cuMemFreeAsync(pooled, s));
    OK(cuStreamSynchronize(s));
    OK(cuMemFree(own));
    OK(cuStreamDestroy(s));
    return failed ? 1 : 0;
}

int selftest_child_pools(void)
{
    CUstream s;
    CUfunction touch;
    if (setup(&s, &touch) != 0) return 1;
    CUmemLocation dev0 = { .type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0 };
    CUmemoryPool managed = NULL, pinned = NULL;
    OK(cuMemGetDefaultMemPool(&managed, &dev0, CU_MEM_ALLOCATION_TYPE_MANAGED));
    OK(cuMemGetDefaultMemPool(&pinned, &dev0, CU_MEM_ALLOCATION_TYPE_PINNED));
    attributes(managed);
    prefetch_contract(managed, s, 1);

    /* Threshold 0: each step's memory is released at its synchronisation and reserved again at
     * the next step's allocation, its pages faulting again. */
    step(managed, s, touch);
    fakecuda_reset_stats();
    for (int i = 0; i < 3; i++) step(managed, s, touch);
    struct fakecuda_stats st = selftest_stats();
    CHECK(st.pool_bytes_released == 3 * BYTES && st.pool_bytes_reserved == 3 * BYTES && st.gpu_faults == 3 * PAGES,
          "threshold 0: released %llu, reserved %llu, faults %llu each step", (unsigned long long)st.pool_bytes_released,
          (unsigned long long)st.pool_bytes_reserved, (unsigned long long)st.gpu_faults);
    struct fakecuda_entry_cost cost = { 0, 0, 0 };
    fakecuda_get_entry_cost("pool_reserve", &cost);
    CHECK(cost.calls == 3 && cost.caller_ns == 3ull * 20000, "each reservation charged");
    fakecuda_get_entry_cost("pool_release", &cost);
    CHECK(cost.calls == 3, "each release charged");
    CHECK(attr(managed, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT) == 0 && attr(managed, CU_MEMPOOL_ATTR_USED_MEM_HIGH) == BYTES,
          "nothing reserved after a synchronisation; the used high watermark kept");

    /* UINT64_MAX (as PyTorch's CudaMallocAsync sets it): the memory stays, handed out again at
     * the same address, its pages still on the device. */
    cuuint64_t keep_all = UINT64_MAX, zero = 0;
    OK(cuMemPoolSetAttribute(managed, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep_all));
    CUdeviceptr first = step(managed, s, touch);
    fakecuda_reset_stats();
    CUdeviceptr again = 0;
    for (int i = 0; i < 3; i++) again = step(managed, s, touch);
    st = selftest_stats();
    CHECK(again == first && st.pool_bytes_released == 0 && st.pool_bytes_reserved == 0 && st.gpu_faults == 0 &&
              st.allocations_reused == 3, "UINT64_MAX: kept and reused (released %llu, faults %llu)",
          (unsigned long long)st.pool_bytes_released, (unsigned long long)st.gpu_faults);
    CHECK(attr(managed, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT) == BYTES && attr(managed, CU_MEMPOOL_ATTR_USED_MEM_CURRENT) == 0,
          "kept: reserved, not used");
    OK(cuMemPoolSetAttribute(managed, CU_MEMPOOL_ATTR_USED_MEM_HIGH, &zero));
    CHECK(attr(managed, CU_MEMPOOL_ATTR_USED_MEM_HIGH) == 0, "the used high watermark reset to the current figure");

    /* cuMemPoolTrimTo keeps at least what it is asked to, and releases the rest. */
    OK(cuMemPoolTrimTo(managed, BYTES));
    CHECK(attr(managed, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT) == BYTES, "trim to what is reserved: nothing goes");
    OK(cuMemPoolTrimTo(managed, 0));
    CHECK(attr(managed, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT) == 0 && selftest_stats().pool_bytes_released == BYTES,
          "trim to 0 releases what the pool keeps");

    /* A threshold below what the pool keeps: released past it, a whole allocation at a time. */
    cuuint64_t half = BYTES / 2;
    OK(cuMemPoolSetAttribute(managed, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &half));
    fakecuda_reset_stats();
    step(managed, s, touch);
    CHECK(selftest_stats().pool_bytes_released == BYTES && attr(managed, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT) == 0,
          "above a threshold: released");
    OK(cuMemPoolSetAttribute(managed, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &zero));

    /* A pinned pool's kept memory counts against the device until released; a free whose
     * stream has not run it yet is outstanding: not released by a synchronisation elsewhere. */
    size_t free0 = 0, total = 0, free1 = 0;
    OK(cuMemPoolSetAttribute(pinned, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep_all));
    OK(cuMemGetInfo(&free0, &total));
    CUdeviceptr plain = 0;
    OK(cuMemAllocFromPoolAsync(&plain, BYTES, pinned, s));
    OK(cuMemFreeAsync(plain, s));
    OK(cuStreamSynchronize(s));
    OK(cuMemGetInfo(&free1, &total));
    CHECK(free0 - free1 == BYTES, "kept pinned memory counts against the device");
    CHECK(cuMemFreeAsync(plain, s) == CUDA_ERROR_INVALID_VALUE && cuMemFree(plain) == CUDA_ERROR_INVALID_VALUE,
          "memory the pool keeps cannot be freed again");
    OK(cuMemPoolSetAttribute(pinned, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &zero));
    OK(cuCtxSynchronize());
    OK(cuMemGetInfo(&free1, &total));
    CHECK(free1 == free0, "released at the next synchronisation under threshold 0");

    /* A created pool destroyed with memory kept: released. */
    CUmemPoolProps props = { .allocType = CU_MEM_ALLOCATION_TYPE_PINNED, .location = dev0 };
    CUmemoryPool own = NULL;
    OK(cuMemPoolCreate(&own, &props));
    OK(cuMemPoolSetAttribute(own, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep_all));
    OK(cuMemAllocFromPoolAsync(&plain, BYTES, own, s));
    OK(cuMemFreeAsync(plain, s));
    OK(cuStreamSynchronize(s));
    OK(cuMemPoolDestroy(own));
    OK(cuMemGetInfo(&free1, &total));
    CHECK(free1 == free0, "a destroyed pool's kept memory is released");
    OK(cuStreamDestroy(s));
    return failed ? 1 : 0;
}
