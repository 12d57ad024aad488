/* pools.c: why it exists: memory pools and stream-ordered allocation. Each device's default
 * pinned and managed pools, created pools, the current pool; cuMemAllocAsync and
 * cuMemFreeAsync; and what a pool keeps: memory freed into it stays reserved (mapped, and for a
 * pinned pool counted against the device) and is handed out again, until the pool releases it
 * at a synchronisation (above its release threshold) or a cuMemPoolTrimTo. Released memory
 * that is allocated again is a new physical allocation: reserved again at a cost, and for a
 * managed pool unpopulated, so its pages fault or are prefetched in again. Attributes as
 * cuda.h documents them (CUmemPool_attribute, cuMemPoolSetAttribute, cuMemPoolGetAttribute). */
#include "fakecuda_internal.h"

#include <stdlib.h>

/* A pool: a device's default pinned or managed pool, or one cuMemPoolCreate made. Its
 * figures are under fc_pools_mu. */
struct CUmemPoolHandle_st {
    uint32_t magic;
    int device;
    int managed; /* CU_MEM_ALLOCATION_TYPE_MANAGED: its allocations are managed memory */
    int is_default;
    int destroyed;  /* cuMemPoolDestroy'ed: freed once its last block goes */
    size_t nblocks; /* blocks that name it (in use, freed, or kept) */
    uint64_t release_threshold, reserved, reserved_high, used, used_high;
    int reuse_follow_events, reuse_opportunistic, reuse_internal_deps;
    fc_link keep; /* created pools only */
};

/* One allocation a pool handed out: in use, freed in stream order (its free not run yet), or
 * kept by the pool (its free ran; reserved, not released). */
enum { BLOCK_IN_USE, BLOCK_FREE_PENDING, BLOCK_KEPT };
typedef struct fc_block {
    uintptr_t base;
    size_t size;
    CUmemoryPool pool;
    int state;
    const struct fc_op *pending_free; /* BLOCK_FREE_PENDING: its free, not yet run */
    unsigned long long free_stream;   /* the stream it was freed on */
    uint64_t kept_since;              /* order of BLOCK_KEPT blocks: oldest released first */
    uint64_t freed_at;                /* order of frees (FAKECUDA_POOL_REUSE=freed: the last freed goes first) */
    struct fc_block *next;
} fc_block;

static pthread_mutex_t fc_pools_mu = PTHREAD_MUTEX_INITIALIZER;
static fc_block *fc_blocks; /* every pool's blocks, newest first */
static uint64_t fc_kept_clock, fc_free_clock;

/* Each device's two default pools (pinned, managed), made on first use; a device's current
 * pool (what cuMemAllocAsync uses) is its default pinned pool until cuDeviceSetMemPool names
 * another. */
static struct CUmemPoolHandle_st fc_default_pools[FAKECUDA_MAX_DEVICES][2];
static _Atomic(CUmemoryPool) fc_current_pools[FAKECUDA_MAX_DEVICES];
static pthread_once_t fc_pools_once = PTHREAD_ONCE_INIT;

/* A new pool's attributes: cuda.h's defaults (release threshold 0, every reuse enabled). */
static struct CUmemPoolHandle_st pool_new(int device, int managed, int is_default)
{
    return (struct CUmemPoolHandle_st){ .magic = FC_MAGIC_POOL, .device = device, .managed = managed,
                                        .is_default = is_default, .reuse_follow_events = 1,
                                        .reuse_opportunistic = 1, .reuse_internal_deps = 1 };
}

static void pools_init(void)
{
    for (int d = 0; d < FAKECUDA_MAX_DEVICES; d++)
        for (int managed = 0; managed < 2; managed++) fc_default_pools[d][managed] = pool_new(d, managed, 1);
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
    fc_cost(FC_E_POOL_QUERY, FAKECUDA_POOL_QUERY_HOST_NS);
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
    fc_cost(FC_E_POOL_QUERY, FAKECUDA_POOL_QUERY_HOST_NS);
    if (!pool_out) return CUDA_ERROR_INVALID_VALUE;
    if (dev < 0 || dev >= fc_cfg.ndevices) return CUDA_ERROR_INVALID_DEVICE;
    *pool_out = default_pool(dev, 0);
    return CUDA_SUCCESS;
}
FC_ALIAS(cuDeviceGetDefaultMemPool);

FC_EXPORT CUresult cuDeviceGetMemPool(CUmemoryPool *pool, CUdevice dev)
{
    FC_ENTRY(cuDeviceGetMemPool, 11020);
    fc_cost(FC_E_POOL_QUERY, FAKECUDA_POOL_QUERY_HOST_NS);
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
    *p = pool_new(device, managed, 0);
    fc_keep(&p->keep);
    *pool = p;
    return CUDA_SUCCESS;
}
FC_ALIAS(cuMemPoolCreate);

/* ---- what a pool keeps ---- */

/* Under fc_pools_mu: a block gone from its pool; a destroyed pool goes with its last block. */
static void block_unlink(fc_block *b)
{
    fc_block **link = &fc_blocks;
    while (*link != b) link = &(*link)->next;
    *link = b->next;
    CUmemoryPool pool = b->pool;
    pool->reserved -= b->size;
    if (b->state == BLOCK_IN_USE) pool->used -= b->size;
    if (--pool->nblocks == 0 && pool->destroyed) {
        pool->magic = FC_MAGIC_DEAD;
        fc_unkeep(&pool->keep);
        free(pool);
    }
    free(b);
}

static fc_block *block_at(uintptr_t base)
{
    fc_block *b = fc_blocks;
    while (b && b->base != base) b = b->next;
    return b;
}

/* Gives the kept blocks of pool (all pools: NULL) back to the OS, oldest first, while the pool
 * keeps more than `keep` bytes and releasing leaves it at least `keep` (cuMemPoolTrimTo: "the
 * pool will be guaranteed to have at least minBytesToKeep bytes reserved"). keep < 0: each
 * pool's own release threshold, released past while above it (the driver releases at its own
 * granularity, "When more than the release threshold bytes of memory are held by the memory
 * pool, the allocator will try to release memory"; a block is released whole here, the dearer
 * side). Blocks whose free has not run are outstanding, never released. The unmap is made
 * outside fc_pools_mu; its cost is charged to the calling thread. */
static void release_kept(CUmemoryPool only, int64_t keep)
{
    size_t n = 0;
    uintptr_t bases[64];
    do {
        n = 0;
        pthread_mutex_lock(&fc_pools_mu);
        for (;;) {
            fc_block *oldest = NULL;
            for (fc_block *b = fc_blocks; b; b = b->next) {
                uint64_t hold = keep < 0 ? b->pool->release_threshold : (uint64_t)keep;
                if (b->state == BLOCK_KEPT && (!only || b->pool == only) && b->pool->reserved > hold &&
                    (keep < 0 || b->pool->reserved - b->size >= hold) &&
                    (!oldest || b->kept_since < oldest->kept_since))
                    oldest = b;
            }
            if (!oldest || n == sizeof bases / sizeof *bases) break;
            bases[n++] = oldest->base;
            FC_COUNT(pool_bytes_released, oldest->size);
            block_unlink(oldest);
        }
        pthread_mutex_unlock(&fc_pools_mu);
        for (size_t i = 0; i < n; i++) {
            fc_free_memory(bases[i]);
            fc_cost(FC_E_POOL_RELEASE, FAKECUDA_POOL_RELEASE_NS);
        }
    } while (n == sizeof bases / sizeof *bases);
}

/* "the allocator will try to release memory back to the OS on the next call to stream, event
 * or context synchronize" (cuda.h, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD): every pool, at every
 * synchronisation (which pools the driver trims at which one is not public: all of them, the
 * dearer answer). */
void fc_pools_synchronized(void) { release_kept(NULL, -1); }

/* cuMemFree of a pool's allocation: it leaves its pool. -1 if it is a pool's and already
 * freed (a double free). */
int fc_pool_forget_block(uintptr_t base)
{
    pthread_mutex_lock(&fc_pools_mu);
    fc_block *b = block_at(base);
    int refused = b && b->state != BLOCK_IN_USE;
    if (b && !refused) block_unlink(b);
    pthread_mutex_unlock(&fc_pools_mu);
    return refused ? -1 : 0;
}

/* Destroying a device's current pool makes its default pool current again (cuda.h). Its kept
 * memory is released now; "the resources associated with the pool will be released
 * automatically once there are no more outstanding allocations" (cuda.h, cuMemPoolDestroy). */
FC_EXPORT CUresult cuMemPoolDestroy(CUmemoryPool pool)
{
    FC_ENTRY(cuMemPoolDestroy, 11020);
    if (!pool_valid(pool) || pool->is_default) return CUDA_ERROR_INVALID_VALUE;
    CUmemoryPool expected = pool;
    atomic_compare_exchange_strong(&fc_current_pools[pool->device], &expected, NULL);
    release_kept(pool, 0);
    pthread_mutex_lock(&fc_pools_mu);
    int now = pool->nblocks == 0;
    pool->destroyed = 1;
    pool->magic = FC_MAGIC_DEAD; /* no longer a valid handle; its blocks still name it */
    pthread_mutex_unlock(&fc_pools_mu);
    if (now) {
        fc_unkeep(&pool->keep);
        free(pool);
    }
    return CUDA_SUCCESS;
}
FC_ALIAS(cuMemPoolDestroy);

FC_EXPORT CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t minBytesToKeep)
{
    FC_ENTRY(cuMemPoolTrimTo, 11020);
    if (!pool_valid(pool)) return CUDA_ERROR_INVALID_VALUE;
    release_kept(pool, minBytesToKeep > INT64_MAX ? INT64_MAX : (int64_t)minBytesToKeep);
    return CUDA_SUCCESS;
}
FC_ALIAS(cuMemPoolTrimTo);

/* ---- attributes ---- */
static int *reuse_flag(CUmemoryPool p, CUmemPool_attribute attr)
{
    switch (attr) {
    case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES: return &p->reuse_follow_events;
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC: return &p->reuse_opportunistic;
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES: return &p->reuse_internal_deps;
    default: return NULL;
    }
}

/* What cuda.h lists as settable. A high watermark can "only be reset to zero" (it then restarts
 * from the current figure, as PyTorch's CudaMallocAsync::resetPeakStats relies on); cuda.h says
 * setting RESERVED_MEM_HIGH non-zero is illegal and is silent for USED_MEM_HIGH: refused for
 * both, the strict side. The current figures are read-only. */
FC_EXPORT CUresult cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value)
{
    FC_ENTRY(cuMemPoolSetAttribute, 11020);
    if (!pool_valid(pool) || !value) return CUDA_ERROR_INVALID_VALUE;
    CUresult r = CUDA_SUCCESS;
    pthread_mutex_lock(&fc_pools_mu);
    int *flag = reuse_flag(pool, attr);
    if (flag) *flag = *(int *)value != 0;
    else if (attr == CU_MEMPOOL_ATTR_RELEASE_THRESHOLD) pool->release_threshold = *(cuuint64_t *)value;
    else if (attr == CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH && *(cuuint64_t *)value == 0) pool->reserved_high = pool->reserved;
    else if (attr == CU_MEMPOOL_ATTR_USED_MEM_HIGH && *(cuuint64_t *)value == 0) pool->used_high = pool->used;
    else r = CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_unlock(&fc_pools_mu);
    return r;
}
FC_ALIAS(cuMemPoolSetAttribute);

/* MAX_POOL_SIZE 0 ("no maximum size"), no export handle types, no hardware decompression, not
 * localized: what a pool made without those properties reports. */
FC_EXPORT CUresult cuMemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value)
{
    FC_ENTRY(cuMemPoolGetAttribute, 11020);
    fc_cost(FC_E_POOL_QUERY, FAKECUDA_POOL_QUERY_HOST_NS);
    if (!pool_valid(pool) || !value) return CUDA_ERROR_INVALID_VALUE;
    CUresult r = CUDA_SUCCESS;
    pthread_mutex_lock(&fc_pools_mu);
    int *flag = reuse_flag(pool, attr);
    switch ((int)attr) { /* int: cuda_compat.h adds 13.1's attributes to 13.0's enum */
    case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD: *(cuuint64_t *)value = pool->release_threshold; break;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT: *(cuuint64_t *)value = pool->reserved; break;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH: *(cuuint64_t *)value = pool->reserved_high; break;
    case CU_MEMPOOL_ATTR_USED_MEM_CURRENT: *(cuuint64_t *)value = pool->used; break;
    case CU_MEMPOOL_ATTR_USED_MEM_HIGH: *(cuuint64_t *)value = pool->used_high; break;
    case CU_MEMPOOL_ATTR_MAX_POOL_SIZE: *(cuuint64_t *)value = 0; break;
    case CU_MEMPOOL_ATTR_ALLOCATION_TYPE:
        *(CUmemAllocationType *)value = pool->managed ? CU_MEM_ALLOCATION_TYPE_MANAGED : CU_MEM_ALLOCATION_TYPE_PINNED;
        break;
    case CU_MEMPOOL_ATTR_EXPORT_HANDLE_TYPES: *(CUmemAllocationHandleType *)value = CU_MEM_HANDLE_TYPE_NONE; break;
    case CU_MEMPOOL_ATTR_LOCATION_ID: *(int *)value = pool->device; break;
    case CU_MEMPOOL_ATTR_LOCATION_TYPE: *(CUmemLocationType *)value = CU_MEM_LOCATION_TYPE_DEVICE; break;
    case CU_MEMPOOL_ATTR_HW_DECOMPRESS_ENABLED: *(int *)value = 0; break;
    case CU_MEMPOOL_ATTR_LOCALITY_DOMAIN_ID: *(int *)value = -1; break;
    default:
        if (flag) *(int *)value = *flag;
        else r = CUDA_ERROR_INVALID_VALUE;
    }
    pthread_mutex_unlock(&fc_pools_mu);
    return r;
}
FC_ALIAS(cuMemPoolGetAttribute);

/* ---- stream-ordered allocation ---- */

/* Under fc_pools_mu: a block of this size the pool can hand out on this stream. As the
 * driver's pools do, memory freed on the same stream goes again at once, before that free
 * has run (stream order makes it safe: the new owner's work comes after the old owner's on
 * that stream), its pages where they were; memory whose free ran goes to any stream
 * (REUSE_ALLOW_OPPORTUNISTIC, default on), else only to the stream that freed it. Only the
 * same size is reused (the driver suballocates; the stricter side: more memory reserved).
 * Which of several such blocks goes is not documented: by default the one the pool reserved
 * last, so that a program repeating its allocations and frees gets the same addresses each
 * time; FAKECUDA_POOL_REUSE=freed hands out the one freed last, under which a block freed in
 * one order and allocated in another changes hands from one repetition to the next. */
static fc_block *take_block(CUmemoryPool pool, size_t size, unsigned long long stream)
{
    fc_block *taken = NULL;
    for (fc_block *b = fc_blocks; b; b = b->next)
        if (b->pool == pool && b->size == size && b->state != BLOCK_IN_USE &&
            (b->free_stream == stream || (b->state == BLOCK_KEPT && pool->reuse_opportunistic)) &&
            (taken == NULL || b->freed_at > taken->freed_at)) {
            taken = b;
            if (!fc_cfg.pool_reuse_freed) break;
        }
    if (taken) {
        taken->state = BLOCK_IN_USE;
        taken->pending_free = NULL;
    }
    return taken;
}

static void count_used(CUmemoryPool pool, size_t size)
{
    pool->used += size;
    if (pool->used > pool->used_high) pool->used_high = pool->used;
}

/* New memory for a pool: a physical allocation (its cost, counted; a pinned pool's bytes taken
 * from the device, evicting managed memory if need be; a managed pool's pages unpopulated). A
 * pinned pool short of device memory first releases what it keeps (whether the driver trims
 * a pool before failing is not documented; without it, reuse by exact size alone would fail
 * allocations the driver's suballocation serves). */
static CUresult reserve_block(CUdeviceptr *dptr, size_t size, CUmemoryPool pool, CUstream s)
{
    fc_block *b = calloc(1, sizeof *b);
    if (!b) return CUDA_ERROR_OUT_OF_MEMORY;
    int kind = pool->managed ? FC_ALLOC_MANAGED_POOL : FC_ALLOC_DEVICE;
    CUresult err = fc_alloc_memory(dptr, size, kind, pool->device, s->ctx);
    if (err == CUDA_ERROR_OUT_OF_MEMORY && !pool->managed) {
        release_kept(pool, 0);
        err = fc_alloc_memory(dptr, size, kind, pool->device, s->ctx);
    }
    if (err != CUDA_SUCCESS) {
        free(b);
        return err;
    }
    fc_cost(FC_E_POOL_RESERVE, FAKECUDA_POOL_RESERVE_NS);
    FC_COUNT(pool_bytes_reserved, size);
    *b = (fc_block){ .base = (uintptr_t)*dptr, .size = size, .pool = pool, .state = BLOCK_IN_USE };
    pthread_mutex_lock(&fc_pools_mu);
    b->next = fc_blocks;
    fc_blocks = b;
    pool->nblocks++;
    pool->reserved += size;
    if (pool->reserved > pool->reserved_high) pool->reserved_high = pool->reserved;
    count_used(pool, size);
    pthread_mutex_unlock(&fc_pools_mu);
    return CUDA_SUCCESS;
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
    if (!dptr || size == 0) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&fc_pools_mu);
    fc_block *reused = take_block(pool, size, s->id);
    if (reused) {
        count_used(pool, size);
        *dptr = (CUdeviceptr)reused->base;
    }
    pthread_mutex_unlock(&fc_pools_mu);
    if (!reused) return reserve_block(dptr, size, pool, s);
    FC_COUNT(allocations_reused, 1);
    return CUDA_SUCCESS;
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

/* A pool's block goes back to its pool (reusable on this stream at once); other memory
 * (cuMemAlloc's) is freed when the free runs. A block freed already is refused. */
static CUresult free_async(CUdeviceptr dptr, CUstream hStream)
{
    CUresult err = CUDA_SUCCESS;
    CUstream s = fc_resolve_stream(hStream, &err);
    if (!s) return err;
    if (!fc_alloc_starts_at((uintptr_t)dptr)) return CUDA_ERROR_INVALID_VALUE;
    fc_op *op = calloc(1, sizeof *op);
    if (!op) return CUDA_ERROR_OUT_OF_MEMORY;
    op->kind = FC_OP_FREE;
    op->u.free.ptr = (uintptr_t)dptr;
    pthread_mutex_lock(&fc_pools_mu);
    fc_block *b = block_at((uintptr_t)dptr);
    int refused = b && b->state != BLOCK_IN_USE, capturing = fc_stream_capturing(s);
    if (b && !refused && !capturing) {
        op->u.free.pooled = 1;
        b->state = BLOCK_FREE_PENDING;
        b->pending_free = op;
        b->free_stream = s->id;
        b->freed_at = ++fc_free_clock;
        b->pool->used -= b->size;
    }
    pthread_mutex_unlock(&fc_pools_mu);
    if (refused || capturing) { /* in a capture: a free node, the graph's memory is kept */
        free(op);
        return refused ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
    }
    fc_enqueue(s, op);
    return CUDA_SUCCESS;
}
FC_DEF(cuMemFreeAsync, 11020, (CUdeviceptr dptr, CUstream hStream), free_async(dptr, hStream));
FC_DEF(cuMemFreeAsync_ptsz, 11020, (CUdeviceptr dptr, CUstream hStream), free_async(dptr, hStream));

/* A free reached in its stream: a pool's block is kept by the pool (if no allocation took it
 * again meanwhile: then its entry is no longer this free's), until a synchronisation or a trim
 * releases it; other memory goes now. */
void fc_run_free(const fc_op *op)
{
    if (!op->u.free.pooled) {
        fc_free_memory(op->u.free.ptr);
        return;
    }
    pthread_mutex_lock(&fc_pools_mu);
    fc_block *b = block_at(op->u.free.ptr);
    if (b && b->state == BLOCK_FREE_PENDING && b->pending_free == op) {
        b->state = BLOCK_KEPT;
        b->pending_free = NULL;
        b->kept_since = ++fc_kept_clock;
    }
    pthread_mutex_unlock(&fc_pools_mu);
}
