/* memory.c: why it exists: managed allocations (host memory with a residency state per
 * FAKECUDA_PAGE page: unpopulated, host or device N), plain device allocations, memory
 * pools (default pinned and managed pools per device, created pools) for stream-ordered
 * allocation, page migration by kernel touches (GPU faults), host touches (CPU faults)
 * and prefetches (the prefetch entry points validate here and run as stream ops), pointer
 * queries, IPC handles and the handles of cuMemCreate. */
#include "fakecuda_internal.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

enum { FC_BIT_PREFETCHED = 1, FC_BIT_TOUCHED = 2 };
enum { WHY_KERNEL, WHY_HOST, WHY_PREFETCH, WHY_DISCARD };

typedef struct fc_alloc {
    uintptr_t base;
    size_t size;
    void *map;
    size_t map_len;
    int managed;
    int device;      /* plain: owning device; managed: device of the allocating context */
    CUcontext ctx;
    size_t npages;
    pthread_mutex_t mu; /* guards loc[] and bits[] */
    uint8_t *loc;       /* FC_LOC_UNPOP, FC_LOC_HOST, FC_LOC_DEV0 + d */
    uint8_t *bits;      /* FC_BIT_* */
    unsigned long long pool;        /* the serial of the pool it came from; 0: none */
    /* Freed in stream order and not yet handed out again (on the freed list): */
    const struct fc_op *pending_free; /* its free, not yet run on its stream */
    unsigned long long free_stream;   /* that stream's id */
    struct fc_alloc *next_freed;
} fc_alloc;

/* Allocations sorted by base, under a reader/writer lock (lock order: fc_reg_lock, then
 * an allocation's mu). */
static pthread_rwlock_t fc_reg_lock = PTHREAD_RWLOCK_INITIALIZER;
static fc_alloc **fc_reg;
static size_t fc_nreg, fc_capreg;

_Thread_local int fc_tls_kernel_device = -1;

/* Index of the first allocation whose end is above p (fc_nreg if none). */
static size_t reg_first_end_above(uintptr_t p)
{
    size_t lo = 0, hi = fc_nreg;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (fc_reg[mid]->base + fc_reg[mid]->size <= p) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

static fc_alloc *reg_find(uintptr_t p)
{
    size_t i = reg_first_end_above(p);
    return i < fc_nreg && fc_reg[i]->base <= p ? fc_reg[i] : NULL;
}

static int reg_insert(fc_alloc *a)
{
    pthread_rwlock_wrlock(&fc_reg_lock);
    if (fc_nreg == fc_capreg) {
        size_t nc = fc_capreg ? fc_capreg * 2 : 64;
        fc_alloc **n = realloc(fc_reg, nc * sizeof *n);
        if (!n) { pthread_rwlock_unlock(&fc_reg_lock); return -1; }
        fc_reg = n;
        fc_capreg = nc;
    }
    size_t i = reg_first_end_above(a->base);
    memmove(&fc_reg[i + 1], &fc_reg[i], (fc_nreg - i) * sizeof *fc_reg);
    fc_reg[i] = a;
    fc_nreg++;
    pthread_rwlock_unlock(&fc_reg_lock);
    return 0;
}

/* Removes the allocation that starts exactly at p; NULL if none. */
static fc_alloc *reg_remove(uintptr_t p)
{
    pthread_rwlock_wrlock(&fc_reg_lock);
    fc_alloc *a = reg_find(p);
    if (a && a->base == p) {
        size_t i = reg_first_end_above(p);
        memmove(&fc_reg[i], &fc_reg[i + 1], (fc_nreg - i - 1) * sizeof *fc_reg);
        fc_nreg--;
    } else {
        a = NULL;
    }
    pthread_rwlock_unlock(&fc_reg_lock);
    return a;
}

static int64_t xfer_ns(uint64_t bytes, uint64_t bytes_per_us) { return (int64_t)(bytes * 1000u / bytes_per_us); }

/* Moves page p of a to target for the given reason; counts and returns modelled ns. */
static int64_t page_move(fc_alloc *a, size_t p, uint8_t target, int why)
{
    uint8_t cur = a->loc[p];
    uint8_t *b = &a->bits[p];
    int64_t ns = 0;
    if (why == WHY_KERNEL && !(*b & FC_BIT_TOUCHED)) {
        *b |= FC_BIT_TOUCHED;
        FC_COUNT(pages_touched_by_kernels, 1);
    }
    if (cur == target) {
        if (why == WHY_KERNEL) *b &= (uint8_t)~FC_BIT_PREFETCHED; /* the prefetch paid off */
        return 0;
    }
    if (*b & FC_BIT_PREFETCHED) { /* migrated away before any kernel used it */
        FC_COUNT(bytes_prefetched_unused, FAKECUDA_PAGE);
        *b &= (uint8_t)~FC_BIT_PREFETCHED;
    }
    switch (why) {
    case WHY_KERNEL:
        FC_COUNT(gpu_faults, 1);
        ns += FAKECUDA_GPU_FAULT_US * 1000;
        if (cur == FC_LOC_HOST) FC_COUNT(bytes_faulted_h2d, FAKECUDA_PAGE);
        if (cur != FC_LOC_UNPOP) ns += xfer_ns(FAKECUDA_PAGE, FAKECUDA_H2D_BYTES_PER_US);
        break;
    case WHY_HOST:
        if (cur >= FC_LOC_DEV0) {
            FC_COUNT(cpu_faults, 1);
            FC_COUNT(bytes_d2h, FAKECUDA_PAGE);
            ns += FAKECUDA_CPU_FAULT_US * 1000 + xfer_ns(FAKECUDA_PAGE, FAKECUDA_D2H_BYTES_PER_US);
        }
        break;
    case WHY_PREFETCH:
        if (target >= FC_LOC_DEV0 && cur == FC_LOC_HOST) {
            FC_COUNT(bytes_prefetched_h2d, FAKECUDA_PAGE);
            *b |= FC_BIT_PREFETCHED;
            ns += xfer_ns(FAKECUDA_PAGE, FAKECUDA_H2D_BYTES_PER_US);
        } else if (target == FC_LOC_HOST && cur >= FC_LOC_DEV0) {
            FC_COUNT(bytes_d2h, FAKECUDA_PAGE);
            ns += xfer_ns(FAKECUDA_PAGE, FAKECUDA_D2H_BYTES_PER_US);
        } else if (cur >= FC_LOC_DEV0) { /* peer to peer: costed, not counted */
            ns += xfer_ns(FAKECUDA_PAGE, FAKECUDA_H2D_BYTES_PER_US);
        } /* unpopulated: populated in place, nothing moves */
        break;
    case WHY_DISCARD: /* dead: nothing moves, and whoever reads it before writing sees poison */
        FC_COUNT(bytes_discarded, FAKECUDA_PAGE);
        memset((void *)(a->base + p * FAKECUDA_PAGE), FAKECUDA_DISCARD_POISON, FAKECUDA_PAGE);
        break;
    }
    if (cur >= FC_LOC_DEV0) atomic_fetch_sub(&fc_dev_resident[cur - FC_LOC_DEV0], FAKECUDA_PAGE);
    if (target >= FC_LOC_DEV0) fc_dev_resident_add(target - FC_LOC_DEV0, FAKECUDA_PAGE);
    a->loc[p] = target;
    return ns;
}

/* Walks [addr, addr+len) page by page, releasing the locks and sleeping off the modelled
 * time every FAKECUDA_SLEEP_CHUNK_US, so that a racing stream sees pages move one by one.
 * Memory that is not managed is skipped. */
static void migrate_range(uintptr_t addr, size_t len, uint8_t target, int why)
{
    uintptr_t end = addr + len < addr ? UINTPTR_MAX : addr + len;
    const int64_t chunk = (int64_t)FAKECUDA_SLEEP_CHUNK_US * 1000;
    while (addr < end) {
        int64_t ns = 0;
        pthread_rwlock_rdlock(&fc_reg_lock);
        size_t i = reg_first_end_above(addr);
        if (i == fc_nreg || fc_reg[i]->base >= end) {
            pthread_rwlock_unlock(&fc_reg_lock);
            break;
        }
        fc_alloc *a = fc_reg[i];
        if (a->base > addr) addr = a->base;
        if (!a->managed) {
            addr = a->base + a->size;
            pthread_rwlock_unlock(&fc_reg_lock);
            continue;
        }
        uintptr_t stop = end < a->base + a->size ? end : a->base + a->size;
        size_t p = (addr - a->base) / FAKECUDA_PAGE;
        size_t plast = (stop - 1 - a->base) / FAKECUDA_PAGE;
        pthread_mutex_lock(&a->mu);
        for (; p <= plast && ns < chunk; p++) ns += page_move(a, p, target, why);
        pthread_mutex_unlock(&a->mu);
        addr = p > plast ? stop : a->base + p * FAKECUDA_PAGE;
        pthread_rwlock_unlock(&fc_reg_lock);
        fc_charge_ns(ns);
    }
}

FC_EXPORT void fakecuda_touch(const void *ptr, size_t bytes)
{
    int dev = fc_tls_kernel_device;
    if (dev < 0) dev = fc_ctx_valid(fc_current_ctx()) ? fc_ctx_device(fc_current_ctx()) : 0;
    if (ptr && bytes) migrate_range((uintptr_t)ptr, bytes, (uint8_t)(FC_LOC_DEV0 + dev), WHY_KERNEL);
}

FC_EXPORT void fakecuda_host_touch(const void *ptr, size_t bytes)
{
    if (ptr && bytes) migrate_range((uintptr_t)ptr, bytes, FC_LOC_HOST, WHY_HOST);
    fc_pay_debt(0);
}

/* Sums (and with clear, forgets) the page bits: prefetched pages no kernel touched. The
 * lock wait is bounded so that the exit-time stats writer can never hang. */
void fc_managed_scan(uint64_t *unused_bytes, int clear)
{
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_nsec += 200 * 1000000;
    if (dl.tv_nsec >= 1000000000) { dl.tv_sec++; dl.tv_nsec -= 1000000000; }
    if (pthread_rwlock_timedrdlock(&fc_reg_lock, &dl) != 0) return;
    for (size_t i = 0; i < fc_nreg; i++) {
        fc_alloc *a = fc_reg[i];
        if (!a->managed) continue;
        pthread_mutex_lock(&a->mu);
        for (size_t p = 0; p < a->npages; p++) {
            if (a->bits[p] & FC_BIT_PREFETCHED) *unused_bytes += FAKECUDA_PAGE;
            if (clear) a->bits[p] = 0;
        }
        pthread_mutex_unlock(&a->mu);
    }
    pthread_rwlock_unlock(&fc_reg_lock);
}

/* ---- allocation ---- */
static CUresult alloc_common(CUdeviceptr *dptr, size_t size, int managed, int device, CUcontext ctx,
                             unsigned long long pool)
{
    if (!dptr || size == 0) return CUDA_ERROR_INVALID_VALUE;
    if (!managed && atomic_load(&fc_dev_plain[device]) + size > fc_cfg.device_memory)
        return CUDA_ERROR_OUT_OF_MEMORY;
    fc_alloc *a = calloc(1, sizeof *a);
    if (!a) return CUDA_ERROR_OUT_OF_MEMORY;
    size_t align = managed ? FAKECUDA_MANAGED_ALIGN : 4096;
    size_t len = (size + align - 1) / align * align;
    size_t extra = managed ? align : 0;
    if (len < size || len + extra < len) { free(a); return CUDA_ERROR_OUT_OF_MEMORY; }
    void *m = mmap(NULL, len + extra, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) { free(a); return CUDA_ERROR_OUT_OF_MEMORY; }
    uintptr_t base = (uintptr_t)m;
    if (managed) { /* trim to a 2 MiB-aligned base */
        uintptr_t al = (base + align - 1) & ~(uintptr_t)(align - 1);
        if (al > base) munmap(m, al - base);
        if (base + len + extra > al + len) munmap((void *)(al + len), base + len + extra - (al + len));
        base = al;
    }
    a->base = base;
    a->size = size;
    a->map = (void *)base;
    a->map_len = len;
    a->managed = managed;
    a->device = device;
    a->ctx = ctx;
    a->pool = pool;
    pthread_mutex_init(&a->mu, NULL);
    if (managed) {
        a->npages = (size + FAKECUDA_PAGE - 1) / FAKECUDA_PAGE;
        a->loc = calloc(a->npages, 1);
        a->bits = calloc(a->npages, 1);
    }
    if ((managed && (!a->loc || !a->bits)) || reg_insert(a) != 0) {
        munmap(a->map, a->map_len);
        free(a->loc);
        free(a->bits);
        free(a);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (!managed) atomic_fetch_add(&fc_dev_plain[device], size);
    *dptr = (CUdeviceptr)base;
    return CUDA_SUCCESS;
}

static void alloc_destroy(fc_alloc *a)
{
    if (a->managed) {
        for (size_t p = 0; p < a->npages; p++) {
            if (a->bits[p] & FC_BIT_PREFETCHED) FC_COUNT(bytes_prefetched_unused, FAKECUDA_PAGE);
            if (a->loc[p] >= FC_LOC_DEV0) atomic_fetch_sub(&fc_dev_resident[a->loc[p] - FC_LOC_DEV0], FAKECUDA_PAGE);
        }
    } else {
        atomic_fetch_sub(&fc_dev_plain[a->device], a->size);
    }
    munmap(a->map, a->map_len);
    pthread_mutex_destroy(&a->mu);
    free(a->loc);
    free(a->bits);
    free(a);
}

static void free_now(uintptr_t p)
{
    fc_alloc *a = reg_remove(p);
    if (a) alloc_destroy(a);
}

static CUcontext need_ctx(CUresult *err)
{
    CUcontext c = fc_current_ctx();
    if (!fc_ctx_valid(c)) { *err = CUDA_ERROR_INVALID_CONTEXT; return NULL; }
    return c;
}

FC_EXPORT CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags)
{
    FC_ENTRY(cuMemAllocManaged, 6000);
    CUresult err = CUDA_SUCCESS;
    CUcontext c = need_ctx(&err);
    if (!c) return err;
    if (flags != CU_MEM_ATTACH_GLOBAL && flags != CU_MEM_ATTACH_HOST) return CUDA_ERROR_INVALID_VALUE;
    return alloc_common(dptr, bytesize, 1, fc_ctx_device(c), c, 0);
}
FC_ALIAS(cuMemAllocManaged);

FC_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
    FC_ENTRY(cuMemAlloc_v2, 3020);
    CUresult err = CUDA_SUCCESS;
    CUcontext c = need_ctx(&err);
    if (!c) return err;
    return alloc_common(dptr, bytesize, 0, fc_ctx_device(c), c, 0);
}
FC_ALIAS(cuMemAlloc_v2);

/* Like the driver, cuMemFree waits for the device's outstanding work first. */
FC_EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr)
{
    FC_ENTRY(cuMemFree_v2, 3020);
    if (dptr == 0) return CUDA_SUCCESS;
    pthread_rwlock_rdlock(&fc_reg_lock);
    fc_alloc *a = reg_find((uintptr_t)dptr);
    int dev = a && a->base == (uintptr_t)dptr ? a->device : -1;
    pthread_rwlock_unlock(&fc_reg_lock);
    if (dev < 0) return CUDA_ERROR_INVALID_VALUE;
    fc_sync_ctx_streams(NULL, dev);
    a = reg_remove((uintptr_t)dptr);
    if (!a) return CUDA_ERROR_INVALID_VALUE;
    alloc_destroy(a);
    return CUDA_SUCCESS;
}
FC_ALIAS(cuMemFree_v2);

/* ---- memory pools ---- */
/* Each device's two default pools (pinned, managed), made on first use; a device's
 * current pool (what cuMemAllocAsync uses) is its default pinned pool until
 * cuDeviceSetMemPool names another. */
static struct CUmemPoolHandle_st fc_default_pools[FAKECUDA_MAX_DEVICES][2];
static _Atomic(CUmemoryPool) fc_current_pools[FAKECUDA_MAX_DEVICES];
static pthread_once_t fc_pools_once = PTHREAD_ONCE_INIT;

static _Atomic unsigned long long fc_pool_serials = 1;

static void pools_init(void)
{
    for (int d = 0; d < FAKECUDA_MAX_DEVICES; d++)
        for (int managed = 0; managed < 2; managed++)
            fc_default_pools[d][managed] = (struct CUmemPoolHandle_st){
                .magic = FC_MAGIC_POOL, .device = d, .managed = managed, .is_default = 1,
                .serial = atomic_fetch_add(&fc_pool_serials, 1) };
}

static CUmemoryPool default_pool(int device, int managed)
{
    pthread_once(&fc_pools_once, pools_init);
    return &fc_default_pools[device][managed];
}

static CUmemoryPool current_pool(int device)
{
    CUmemoryPool p = atomic_load(&fc_current_pools[device]);
    return p ? p : default_pool(device, 0);
}

static int pool_valid(CUmemoryPool p) { return p && p->magic == FC_MAGIC_POOL; }

/* A pool's type and device from a CUmemAllocationType and a device location. */
static CUresult pool_kind(CUmemAllocationType type, const CUmemLocation *l, int *managed, int *device)
{
    if (!l || (type != CU_MEM_ALLOCATION_TYPE_PINNED && type != CU_MEM_ALLOCATION_TYPE_MANAGED))
        return CUDA_ERROR_INVALID_VALUE;
    if (l->type != CU_MEM_LOCATION_TYPE_DEVICE) return CUDA_ERROR_NOT_SUPPORTED; /* host, NUMA, none */
    if (l->id < 0 || l->id >= fc_cfg.ndevices) return CUDA_ERROR_INVALID_DEVICE;
    *managed = type == CU_MEM_ALLOCATION_TYPE_MANAGED;
    *device = l->id;
    return CUDA_SUCCESS;
}

FC_EXPORT CUresult cuMemGetDefaultMemPool(CUmemoryPool *pool_out, CUmemLocation *location, CUmemAllocationType type)
{
    FC_ENTRY(cuMemGetDefaultMemPool, 13000);
    int managed, device;
    CUresult err = pool_kind(type, location, &managed, &device);
    if (err != CUDA_SUCCESS) return err;
    if (!pool_out) return CUDA_ERROR_INVALID_VALUE;
    *pool_out = default_pool(device, managed);
    return CUDA_SUCCESS;
}
FC_ALIAS(cuMemGetDefaultMemPool);

FC_EXPORT CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool_out, CUdevice dev)
{
    FC_ENTRY(cuDeviceGetDefaultMemPool, 11020);
    if (!pool_out) return CUDA_ERROR_INVALID_VALUE;
    if (dev < 0 || dev >= fc_cfg.ndevices) return CUDA_ERROR_INVALID_DEVICE;
    *pool_out = default_pool(dev, 0);
    return CUDA_SUCCESS;
}
FC_ALIAS(cuDeviceGetDefaultMemPool);

FC_EXPORT CUresult cuDeviceGetMemPool(CUmemoryPool *pool, CUdevice dev)
{
    FC_ENTRY(cuDeviceGetMemPool, 11020);
    if (!pool) return CUDA_ERROR_INVALID_VALUE;
    if (dev < 0 || dev >= fc_cfg.ndevices) return CUDA_ERROR_INVALID_DEVICE;
    *pool = current_pool(dev);
    return CUDA_SUCCESS;
}
FC_ALIAS(cuDeviceGetMemPool);

/* As cuda.h says: the pool must be local to the device (and, for cuMemAllocAsync's
 * current pool, a pinned one). */
FC_EXPORT CUresult cuDeviceSetMemPool(CUdevice dev, CUmemoryPool pool)
{
    FC_ENTRY(cuDeviceSetMemPool, 11020);
    if (dev < 0 || dev >= fc_cfg.ndevices) return CUDA_ERROR_INVALID_DEVICE;
    if (!pool_valid(pool) || pool->device != dev || pool->managed) return CUDA_ERROR_INVALID_VALUE;
    atomic_store(&fc_current_pools[dev], pool);
    return CUDA_SUCCESS;
}
FC_ALIAS(cuDeviceSetMemPool);

FC_EXPORT CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *poolProps)
{
    FC_ENTRY(cuMemPoolCreate, 11020);
    if (!pool || !poolProps) return CUDA_ERROR_INVALID_VALUE;
    int managed, device;
    CUresult err = pool_kind(poolProps->allocType, &poolProps->location, &managed, &device);
    if (err != CUDA_SUCCESS) return err;
    struct CUmemPoolHandle_st *p = calloc(1, sizeof *p);
    if (!p) return CUDA_ERROR_OUT_OF_MEMORY;
    *p = (struct CUmemPoolHandle_st){ .magic = FC_MAGIC_POOL, .device = device, .managed = managed,
                                      .serial = atomic_fetch_add(&fc_pool_serials, 1) };
    fc_keep(&p->keep);
    *pool = p;
    return CUDA_SUCCESS;
}
FC_ALIAS(cuMemPoolCreate);

/* Destroying a device's current pool makes its default pool current again (cuda.h).
 * Allocations keep no reference to their pool, so outstanding ones stay valid. */
FC_EXPORT CUresult cuMemPoolDestroy(CUmemoryPool pool)
{
    FC_ENTRY(cuMemPoolDestroy, 11020);
    if (!pool_valid(pool) || pool->is_default) return CUDA_ERROR_INVALID_VALUE;
    CUmemoryPool expected = pool;
    atomic_compare_exchange_strong(&fc_current_pools[pool->device], &expected, NULL);
    pool->magic = FC_MAGIC_DEAD;
    fc_unkeep(&pool->keep);
    free(pool);
    return CUDA_SUCCESS;
}
FC_ALIAS(cuMemPoolDestroy);

/* Stream-ordered reuse, as the driver's pools do it: memory freed with cuMemFreeAsync is
 * handed out again at once by an allocation of the same size from the same pool on the
 * same stream, before that free has run (stream order makes it safe: the new owner's work
 * comes after the old owner's on that stream). Its pages stay where they were. A free
 * that runs before any reuse gives the memory back. */
static pthread_mutex_t fc_freed_mu = PTHREAD_MUTEX_INITIALIZER;
static fc_alloc *fc_freed; /* freed in stream order, not yet run nor handed out again */

/* Freed in stream order already, its memory not handed out again: freeing it is an error. */
static int freed_already(fc_alloc *a)
{
    pthread_mutex_lock(&fc_freed_mu);
    int freed = a->pending_free != NULL;
    pthread_mutex_unlock(&fc_freed_mu);
    return freed;
}

static fc_alloc *take_freed(size_t size, unsigned long long pool, unsigned long long stream)
{
    pthread_mutex_lock(&fc_freed_mu);
    fc_alloc **link = &fc_freed;
    while (*link && !((*link)->pool == pool && (*link)->free_stream == stream && (*link)->size == size))
        link = &(*link)->next_freed;
    fc_alloc *a = *link;
    if (a) {
        *link = a->next_freed;
        a->pending_free = NULL;
    }
    pthread_mutex_unlock(&fc_freed_mu);
    return a;
}

/* Stream-ordered allocation: memory of the pool's kind (managed from a managed pool),
 * allocated at once (earlier than stream order requires, which no correct program can
 * observe). In a capture, too: graph-owned memory is not modelled, so what a capture
 * allocates lives until the process exits (free_async accepts and ignores its free). */
static CUresult alloc_async(CUdeviceptr *dptr, size_t size, CUmemoryPool pool, CUstream hStream)
{
    CUresult err = CUDA_SUCCESS;
    CUstream s = fc_resolve_stream(hStream, &err);
    if (!s) return err;
    if (!pool) pool = current_pool(s->device);
    else if (!pool_valid(pool)) return CUDA_ERROR_INVALID_VALUE;
    fc_alloc *reused = dptr && size ? take_freed(size, pool->serial, s->id) : NULL;
    if (reused) {
        FC_COUNT(allocations_reused, 1);
        *dptr = (CUdeviceptr)reused->base;
        return CUDA_SUCCESS;
    }
    return alloc_common(dptr, size, pool->managed, pool->device, s->ctx, pool->serial);
}
FC_DEF(cuMemAllocAsync, 11020, (CUdeviceptr *dptr, size_t bytesize, CUstream hStream),
       alloc_async(dptr, bytesize, NULL, hStream));
FC_DEF(cuMemAllocAsync_ptsz, 11020, (CUdeviceptr *dptr, size_t bytesize, CUstream hStream),
       alloc_async(dptr, bytesize, NULL, hStream));
FC_DEF(cuMemAllocFromPoolAsync, 11020, (CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream hStream),
       alloc_async(dptr, bytesize, pool, hStream));
FC_DEF(cuMemAllocFromPoolAsync_ptsz, 11020, (CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
        CUstream hStream),
       alloc_async(dptr, bytesize, pool, hStream));

static CUresult free_async(CUdeviceptr dptr, CUstream hStream)
{
    CUresult err = CUDA_SUCCESS;
    CUstream s = fc_resolve_stream(hStream, &err);
    if (!s) return err;
    pthread_rwlock_rdlock(&fc_reg_lock);
    fc_alloc *a = reg_find((uintptr_t)dptr);
    int ok = a && a->base == (uintptr_t)dptr && !freed_already(a);
    pthread_rwlock_unlock(&fc_reg_lock);
    if (!ok) return CUDA_ERROR_INVALID_VALUE;
    if (fc_stream_capturing(s)) return CUDA_SUCCESS; /* a free node: the graph's memory is kept */
    fc_op *op = calloc(1, sizeof *op);
    if (!op) return CUDA_ERROR_OUT_OF_MEMORY;
    op->kind = FC_OP_FREE;
    op->u.free.ptr = (uintptr_t)dptr;
    op->u.free.pooled = a->pool != 0;
    if (op->u.free.pooled) { /* on the freed list before its free can run */
        pthread_mutex_lock(&fc_freed_mu);
        a->pending_free = op;
        a->free_stream = s->id;
        a->next_freed = fc_freed;
        fc_freed = a;
        pthread_mutex_unlock(&fc_freed_mu);
    }
    fc_enqueue(s, op);
    return CUDA_SUCCESS;
}

/* A pool's memory is given back only if no allocation took it again meanwhile (its
 * freed-list entry is this free's). */
void fc_run_free(const fc_op *op)
{
    if (!op->u.free.pooled) {
        free_now(op->u.free.ptr);
        return;
    }
    pthread_mutex_lock(&fc_freed_mu);
    fc_alloc **link = &fc_freed;
    while (*link && (*link)->pending_free != op)
        link = &(*link)->next_freed;
    fc_alloc *a = *link;
    if (a) *link = a->next_freed;
    pthread_mutex_unlock(&fc_freed_mu);
    if (a) free_now(a->base);
}
FC_DEF(cuMemFreeAsync, 11020, (CUdeviceptr dptr, CUstream hStream), free_async(dptr, hStream));
FC_DEF(cuMemFreeAsync_ptsz, 11020, (CUdeviceptr dptr, CUstream hStream), free_async(dptr, hStream));

/* ---- pointer queries ---- */
FC_EXPORT CUresult cuPointerGetAttribute(void *data, CUpointer_attribute attribute, CUdeviceptr ptr)
{
    FC_ENTRY(cuPointerGetAttribute, 4000);
    if (!data) return CUDA_ERROR_INVALID_VALUE;
    pthread_rwlock_rdlock(&fc_reg_lock);
    fc_alloc *a = reg_find((uintptr_t)ptr);
    struct { uintptr_t base; size_t size; int managed, device; CUcontext ctx; } c = { 0, 0, 0, 0, NULL };
    if (a) { c.base = a->base; c.size = a->size; c.managed = a->managed; c.device = a->device; c.ctx = a->ctx; }
    pthread_rwlock_unlock(&fc_reg_lock);
    if (!a) return CUDA_ERROR_INVALID_VALUE;
    switch (attribute) {
    case CU_POINTER_ATTRIBUTE_CONTEXT: *(CUcontext *)data = c.ctx; break;
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE: *(unsigned int *)data = CU_MEMORYTYPE_DEVICE; break;
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER: *(CUdeviceptr *)data = ptr; break;
    case CU_POINTER_ATTRIBUTE_HOST_POINTER:
        if (!c.managed) return CUDA_ERROR_INVALID_VALUE;
        *(void **)data = (void *)(uintptr_t)ptr;
        break;
    case CU_POINTER_ATTRIBUTE_IS_MANAGED: *(unsigned int *)data = (unsigned)c.managed; break;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: *(int *)data = c.device; break;
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR: *(CUdeviceptr *)data = (CUdeviceptr)c.base; break;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE: *(size_t *)data = c.size; break;
    case CU_POINTER_ATTRIBUTE_MAPPED: *(unsigned int *)data = 1; break;
    default: return CUDA_ERROR_INVALID_VALUE;
    }
    return CUDA_SUCCESS;
}
FC_ALIAS(cuPointerGetAttribute);

FC_EXPORT CUresult cuMemGetAddressRange_v2(CUdeviceptr *pbase, size_t *psize, CUdeviceptr dptr)
{
    FC_ENTRY(cuMemGetAddressRange_v2, 3020);
    pthread_rwlock_rdlock(&fc_reg_lock);
    fc_alloc *a = reg_find((uintptr_t)dptr);
    uintptr_t base = a ? a->base : 0;
    size_t size = a ? a->size : 0;
    pthread_rwlock_unlock(&fc_reg_lock);
    if (!a) return CUDA_ERROR_NOT_FOUND;
    if (pbase) *pbase = (CUdeviceptr)base;
    if (psize) *psize = size;
    return CUDA_SUCCESS;
}
FC_ALIAS(cuMemGetAddressRange_v2);

/* ---- prefetch and advice ---- */
CUresult fc_check_managed_range(uintptr_t p, size_t n)
{
    if (n == 0 || p + n < p) return CUDA_ERROR_INVALID_VALUE;
    pthread_rwlock_rdlock(&fc_reg_lock);
    fc_alloc *a = reg_find(p);
    int ok = a && a->managed && p + n <= a->base + a->size;
    pthread_rwlock_unlock(&fc_reg_lock);
    return ok ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

void fc_run_prefetch(const fc_range *r, size_t n)
{
    for (size_t i = 0; i < n; i++)
        migrate_range(r[i].ptr, r[i].size, (uint8_t)r[i].loc, r[i].loc == FC_LOC_UNPOP ? WHY_DISCARD : WHY_PREFETCH);
    fc_pay_debt(0); /* the stream is busy until the last byte has moved */
}

/* FC_LOC_* for a CUmemLocation, or -1. */
static int loc_from_location(CUmemLocation l, CUresult *err)
{
    switch (l.type) {
    case CU_MEM_LOCATION_TYPE_DEVICE:
        if (l.id < 0 || l.id >= fc_cfg.ndevices) { *err = CUDA_ERROR_INVALID_DEVICE; return -1; }
        return FC_LOC_DEV0 + l.id;
    case CU_MEM_LOCATION_TYPE_HOST:
    case CU_MEM_LOCATION_TYPE_HOST_NUMA:
    case CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT: return FC_LOC_HOST;
    default: *err = CUDA_ERROR_INVALID_VALUE; return -1;
    }
}

/* One stream op for the whole call (a batch is one op), counted in `calls` (if any). */
static CUresult prefetch_enqueue(const CUdeviceptr *ptrs, const size_t *sizes, const int *locs, size_t n,
                                 CUstream hStream, _Atomic uint64_t *calls)
{
    CUresult err = CUDA_SUCCESS;
    CUstream s = fc_resolve_stream(hStream, &err);
    if (!s) return err;
    for (size_t i = 0; i < n; i++)
        if ((err = fc_check_managed_range((uintptr_t)ptrs[i], sizes[i])) != CUDA_SUCCESS) return err;
    if (fc_stream_capturing(s)) { /* not capturable in this model: invalidates the capture */
        fc_capture_invalidate(s);
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    }
    fc_op *op = calloc(1, sizeof *op + n * sizeof(fc_range));
    if (!op) return CUDA_ERROR_OUT_OF_MEMORY;
    op->kind = FC_OP_PREFETCH;
    op->u.pf.n = n;
    op->u.pf.r = (fc_range *)(op + 1);
    for (size_t i = 0; i < n; i++) op->u.pf.r[i] = (fc_range){ (uintptr_t)ptrs[i], sizes[i], locs[i] };
    if (calls) atomic_fetch_add_explicit(calls, 1, memory_order_relaxed);
    fc_enqueue(s, op);
    return CUDA_SUCCESS;
}

static CUresult prefetch_v1(CUdeviceptr p, size_t n, CUdevice dst, CUstream s)
{
    int loc;
    if (dst == CU_DEVICE_CPU) loc = FC_LOC_HOST;
    else if (dst >= 0 && dst < fc_cfg.ndevices) loc = FC_LOC_DEV0 + dst;
    else return CUDA_ERROR_INVALID_DEVICE;
    return prefetch_enqueue(&p, &n, &loc, 1, s, &fc_ctr.prefetch_calls);
}
FC_DEF(cuMemPrefetchAsync, 8000, (CUdeviceptr devPtr, size_t count, CUdevice dstDevice, CUstream hStream),
       prefetch_v1(devPtr, count, dstDevice, hStream));
FC_DEF(cuMemPrefetchAsync_ptsz, 8000, (CUdeviceptr devPtr, size_t count, CUdevice dstDevice, CUstream hStream),
       prefetch_v1(devPtr, count, dstDevice, hStream));

static CUresult prefetch_v2(CUdeviceptr p, size_t n, CUmemLocation l, unsigned flags, CUstream s)
{
    CUresult err = CUDA_ERROR_INVALID_VALUE;
    if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
    int loc = loc_from_location(l, &err);
    if (loc < 0) return err;
    return prefetch_enqueue(&p, &n, &loc, 1, s, &fc_ctr.prefetch_calls);
}
FC_DEF(cuMemPrefetchAsync_v2, 12020, (CUdeviceptr devPtr, size_t count, CUmemLocation location, unsigned int flags,
        CUstream hStream),
       prefetch_v2(devPtr, count, location, flags, hStream));
FC_DEF(cuMemPrefetchAsync_v2_ptsz, 12020, (CUdeviceptr devPtr, size_t count, CUmemLocation location,
        unsigned int flags, CUstream hStream),
       prefetch_v2(devPtr, count, location, flags, hStream));

/* cuda.h: prefetchLocIdxs[0] == 0, strictly increasing, last < count, numPrefetchLocs <=
 * count, flags 0, and never the legacy NULL stream (in the _ptsz form 0 is the per-thread
 * stream, so only CU_STREAM_LEGACY is refused there). */
static CUresult prefetch_batch(CUdeviceptr *dptrs, size_t *sizes, size_t count, CUmemLocation *locs,
                               size_t *idxs, size_t nlocs, unsigned long long flags, CUstream s, int ptsz)
{
    if (!dptrs || !sizes || !locs || !idxs || count == 0 || nlocs == 0 || nlocs > count || flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (s == CU_STREAM_LEGACY || (!ptsz && s == NULL)) return CUDA_ERROR_INVALID_VALUE;
    if (idxs[0] != 0) return CUDA_ERROR_INVALID_VALUE;
    for (size_t k = 1; k < nlocs; k++)
        if (idxs[k] <= idxs[k - 1]) return CUDA_ERROR_INVALID_VALUE;
    if (idxs[nlocs - 1] >= count) return CUDA_ERROR_INVALID_VALUE;
    int *loc = malloc(count * sizeof *loc);
    if (!loc) return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult err = CUDA_SUCCESS;
    for (size_t k = 0; k < nlocs && err == CUDA_SUCCESS; k++) {
        int l = loc_from_location(locs[k], &err);
        size_t last = k + 1 < nlocs ? idxs[k + 1] : count;
        for (size_t i = idxs[k]; i < last && l >= 0; i++) loc[i] = l;
    }
    if (err == CUDA_SUCCESS) err = prefetch_enqueue(dptrs, sizes, loc, count, s, &fc_ctr.batch_prefetch_calls);
    free(loc);
    return err;
}
FC_DEF(cuMemPrefetchBatchAsync, 13000, (CUdeviceptr *dptrs, size_t *sizes, size_t count,
        CUmemLocation *prefetchLocs, size_t *prefetchLocIdxs, size_t numPrefetchLocs, unsigned long long flags,
        CUstream hStream),
       prefetch_batch(dptrs, sizes, count, prefetchLocs, prefetchLocIdxs, numPrefetchLocs, flags, hStream, 0));
FC_DEF(cuMemPrefetchBatchAsync_ptsz, 13000, (CUdeviceptr *dptrs, size_t *sizes, size_t count,
        CUmemLocation *prefetchLocs, size_t *prefetchLocIdxs, size_t numPrefetchLocs, unsigned long long flags,
        CUstream hStream),
       prefetch_batch(dptrs, sizes, count, prefetchLocs, prefetchLocIdxs, numPrefetchLocs, flags, hStream, 1));

/* A discard is a stream op like a prefetch, whose destination is "unpopulated": each whole
 * 64 KiB page inside a range stops being anywhere and its bytes are poisoned; the bytes of
 * partly covered pages are left as they are. Same rules as a batch prefetch: flags 0, never
 * the legacy NULL stream, ranges inside managed allocations. */
static CUresult discard_batch(CUdeviceptr *dptrs, size_t *sizes, size_t count, unsigned long long flags, CUstream s,
                              int ptsz)
{
    if (!dptrs || !sizes || count == 0 || flags != 0) return CUDA_ERROR_INVALID_VALUE;
    if (s == CU_STREAM_LEGACY || (!ptsz && s == NULL)) return CUDA_ERROR_INVALID_VALUE;
    CUdeviceptr *pages = malloc(count * (sizeof *pages + sizeof(size_t) + sizeof(int)));
    if (!pages) return CUDA_ERROR_OUT_OF_MEMORY;
    size_t *lens = (size_t *)(pages + count);
    int *unpopulated = (int *)(lens + count);
    size_t n = 0;
    CUresult err = CUDA_SUCCESS;
    for (size_t i = 0; i < count && err == CUDA_SUCCESS; i++) {
        if ((err = fc_check_managed_range((uintptr_t)dptrs[i], sizes[i])) != CUDA_SUCCESS) break;
        CUdeviceptr first = (dptrs[i] + FAKECUDA_PAGE - 1) / FAKECUDA_PAGE * FAKECUDA_PAGE;
        CUdeviceptr end = (dptrs[i] + sizes[i]) / FAKECUDA_PAGE * FAKECUDA_PAGE;
        if (end > first) {
            pages[n] = first;
            lens[n] = end - first;
            unpopulated[n++] = FC_LOC_UNPOP;
        }
    }
    if (err == CUDA_SUCCESS && n > 0) err = prefetch_enqueue(pages, lens, unpopulated, n, s, NULL);
    free(pages);
    return err;
}
FC_DEF(cuMemDiscardBatchAsync, 13000, (CUdeviceptr *dptrs, size_t *sizes, size_t count, unsigned long long flags,
        CUstream hStream),
       discard_batch(dptrs, sizes, count, flags, hStream, 0));
FC_DEF(cuMemDiscardBatchAsync_ptsz, 13000, (CUdeviceptr *dptrs, size_t *sizes, size_t count,
        unsigned long long flags, CUstream hStream),
       discard_batch(dptrs, sizes, count, flags, hStream, 1));

/* Advice is validated and accepted; it does not change the model's behaviour. */
static CUresult advise(CUdeviceptr p, size_t n, CUmem_advise advice)
{
    if (advice < CU_MEM_ADVISE_SET_READ_MOSTLY || advice > CU_MEM_ADVISE_UNSET_ACCESSED_BY)
        return CUDA_ERROR_INVALID_VALUE;
    return fc_check_managed_range((uintptr_t)p, n);
}
FC_EXPORT CUresult cuMemAdvise(CUdeviceptr devPtr, size_t count, CUmem_advise advice, CUdevice device)
{
    FC_ENTRY(cuMemAdvise, 8000);
    if (device != CU_DEVICE_CPU && (device < 0 || device >= fc_cfg.ndevices)) return CUDA_ERROR_INVALID_DEVICE;
    return advise(devPtr, count, advice);
}
FC_ALIAS(cuMemAdvise);
FC_EXPORT CUresult cuMemAdvise_v2(CUdeviceptr devPtr, size_t count, CUmem_advise advice, CUmemLocation location)
{
    FC_ENTRY(cuMemAdvise_v2, 12020);
    CUresult err = CUDA_SUCCESS;
    if (loc_from_location(location, &err) < 0) return err;
    return advise(devPtr, count, advice);
}
FC_ALIAS(cuMemAdvise_v2);

/* ---- interprocess handles ---- */
/* Only plain device memory, by its base, can be exported; managed memory cannot
 * (the driver returns CUDA_ERROR_INVALID_VALUE for it). The handle holds the address. */
FC_EXPORT CUresult cuIpcGetMemHandle(CUipcMemHandle *pHandle, CUdeviceptr dptr)
{
    FC_ENTRY(cuIpcGetMemHandle, 4010);
    if (!pHandle) return CUDA_ERROR_INVALID_VALUE;
    pthread_rwlock_rdlock(&fc_reg_lock);
    fc_alloc *a = reg_find((uintptr_t)dptr);
    int ok = a && a->base == (uintptr_t)dptr && !a->managed;
    pthread_rwlock_unlock(&fc_reg_lock);
    if (!ok) return CUDA_ERROR_INVALID_VALUE;
    memset(pHandle, 0, sizeof *pHandle);
    memcpy(pHandle->reserved, &dptr, sizeof dptr);
    return CUDA_SUCCESS;
}
FC_ALIAS(cuIpcGetMemHandle);

/* ---- virtual memory management: physical allocations only ---- */
/* A cuMemCreate handle: device memory counted against the device (cuMemGetInfo); it
 * cannot be mapped here (no cuMemAddressReserve/cuMemMap), only created and released. */
typedef struct fc_physical {
    uint32_t magic;
    int device;
    size_t size;
    fc_link keep;
} fc_physical;
#define FC_MAGIC_PHYS 0x50485921u

FC_EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
                               unsigned long long flags)
{
    FC_ENTRY(cuMemCreate, 10020);
    if (!handle || !prop || flags != 0 || size == 0 || size % FAKECUDA_MANAGED_ALIGN != 0 ||
        prop->type != CU_MEM_ALLOCATION_TYPE_PINNED || prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
        return CUDA_ERROR_INVALID_VALUE;
    int dev = prop->location.id;
    if (dev < 0 || dev >= fc_cfg.ndevices) return CUDA_ERROR_INVALID_DEVICE;
    if (atomic_load(&fc_dev_plain[dev]) + size > fc_cfg.device_memory) return CUDA_ERROR_OUT_OF_MEMORY;
    fc_physical *p = calloc(1, sizeof *p);
    if (!p) return CUDA_ERROR_OUT_OF_MEMORY;
    *p = (fc_physical){ .magic = FC_MAGIC_PHYS, .device = dev, .size = size };
    fc_keep(&p->keep);
    atomic_fetch_add(&fc_dev_plain[dev], size);
    *handle = (CUmemGenericAllocationHandle)(uintptr_t)p;
    return CUDA_SUCCESS;
}
FC_ALIAS(cuMemCreate);

FC_EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle)
{
    FC_ENTRY(cuMemRelease, 10020);
    fc_physical *p = (fc_physical *)(uintptr_t)handle;
    if (!p || p->magic != FC_MAGIC_PHYS) return CUDA_ERROR_INVALID_VALUE;
    atomic_fetch_sub(&fc_dev_plain[p->device], p->size);
    p->magic = FC_MAGIC_DEAD;
    fc_unkeep(&p->keep);
    free(p);
    return CUDA_SUCCESS;
}
FC_ALIAS(cuMemRelease);
