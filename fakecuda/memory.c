/* memory.c: why it exists: managed allocations (host memory with a residency state per
 * FAKECUDA_PAGE page: unpopulated, host or device N), plain device allocations (pools.c's
 * memory too), their registry and what an address is; their pages move in migrate.c. */
#include "memory_pages.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

pthread_rwlock_t fc_reg_lock = PTHREAD_RWLOCK_INITIALIZER;
fc_alloc **fc_reg;
size_t fc_nreg;
static size_t fc_capreg;
static uint64_t fc_ordinals; /* allocations registered so far, under fc_reg_lock */

/* Index of the first allocation whose end is above p (fc_nreg if none). */
size_t fc_reg_first_end_above(uintptr_t p)
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
    size_t i = fc_reg_first_end_above(p);
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
    size_t i = fc_reg_first_end_above(a->base);
    memmove(&fc_reg[i + 1], &fc_reg[i], (fc_nreg - i) * sizeof *fc_reg);
    fc_reg[i] = a;
    fc_nreg++;
    a->ordinal = ++fc_ordinals;
    pthread_rwlock_unlock(&fc_reg_lock);
    return 0;
}

/* Removes the allocation that starts exactly at p; NULL if none. Its root chunks go back to
 * their devices here, under the write lock, so that no eviction (which holds the lock for
 * reading) can be holding one. */
static fc_alloc *reg_remove(uintptr_t p)
{
    pthread_rwlock_wrlock(&fc_reg_lock);
    fc_alloc *a = reg_find(p);
    if (a && a->base == p) {
        size_t i = fc_reg_first_end_above(p);
        memmove(&fc_reg[i], &fc_reg[i + 1], (fc_nreg - i - 1) * sizeof *fc_reg);
        fc_nreg--;
        size_t nchunks = a->managed ? (a->npages + PAGES_PER_BLOCK - 1) / PAGES_PER_BLOCK * (size_t)fc_cfg.ndevices : 0;
        for (size_t c = 0; c < nchunks; c++)
            if (a->chunks[c]) fc_chunk_release(a->chunks[c]);
    } else {
        a = NULL;
    }
    pthread_rwlock_unlock(&fc_reg_lock);
    return a;
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
            if (clear) /* not statistics */
                a->bits[p] &= FC_BIT_EVICTED | FC_BIT_FAULTED | FC_BIT_DRIVER_PF | FC_BIT_DUP | FC_BIT_READ_MOSTLY |
                              FC_BIT_DISCARD_STUCK;
        }
        pthread_mutex_unlock(&a->mu);
    }
    pthread_rwlock_unlock(&fc_reg_lock);
}

/* ---- allocation ---- */
CUresult fc_alloc_memory(CUdeviceptr *dptr, size_t size, int kind, int device, CUcontext ctx)
{
    int managed = kind != FC_ALLOC_DEVICE;
    if (!dptr || size == 0) return CUDA_ERROR_INVALID_VALUE;
    CUresult err = managed ? CUDA_SUCCESS : fc_reserve_device_memory(device, size);
    if (err != CUDA_SUCCESS) return err;
    fc_alloc *a = calloc(1, sizeof *a);
    if (!a) {
        if (!managed) fc_devmem_give(device, size);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    size_t align = managed ? FAKECUDA_MANAGED_ALIGN : 4096;
    size_t len = (size + align - 1) / align * align;
    size_t extra = managed ? align : 0;
    void *m = len < size || len + extra < len ? MAP_FAILED
              : mmap(NULL, len + extra, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) {
        if (!managed) fc_devmem_give(device, size);
        free(a);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
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
    a->from_pool = kind == FC_ALLOC_MANAGED_POOL;
    a->device = device;
    a->ctx = ctx;
    pthread_mutex_init(&a->mu, NULL);
    if (managed) {
        a->npages = (size + FAKECUDA_PAGE - 1) / FAKECUDA_PAGE;
        a->loc = calloc(a->npages, 1);
        a->bits = calloc(a->npages, 1);
        a->pref = calloc(a->npages, 1);
        a->lost = calloc(a->npages, 1);
        a->crossed = calloc(a->npages, 1);
        size_t nblocks = (a->npages + PAGES_PER_BLOCK - 1) / PAGES_PER_BLOCK;
        a->chunks = calloc(nblocks * (size_t)fc_cfg.ndevices, sizeof *a->chunks);
        a->pfi = calloc(nblocks, sizeof *a->pfi);
    }
    if ((managed && (!a->loc || !a->bits || !a->pref || !a->lost || !a->crossed || !a->chunks || !a->pfi)) || reg_insert(a) != 0) {
        if (!managed) fc_devmem_give(device, size);
        munmap(a->map, a->map_len);
        free(a->loc);
        free(a->bits);
        free(a->pref);
        free(a->lost);
        free(a->crossed);
        free(a->chunks);
        free(a->pfi);
        free(a);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *dptr = (CUdeviceptr)base;
    return CUDA_SUCCESS;
}

static void alloc_destroy(fc_alloc *a)
{
    if (a->mapped) {
        free(a);
        return;
    }
    if (a->managed) {
        for (size_t p = 0; p < a->npages; p++) {
            if (a->bits[p] & FC_BIT_PREFETCHED) FC_COUNT(bytes_prefetched_unused, FAKECUDA_PAGE);
            if (a->loc[p] >= FC_LOC_DEV0) atomic_fetch_sub(&fc_dev_resident[a->loc[p] - FC_LOC_DEV0], FAKECUDA_PAGE);
        }
    } else {
        fc_devmem_give(a->device, a->size);
    }
    munmap(a->map, a->map_len);
    pthread_mutex_destroy(&a->mu);
    free(a->loc);
    free(a->bits);
    free(a->pref);
    free(a->lost);
    free(a->crossed);
    free(a->chunks);
    free(a->pfi);
    free(a);
}

void fc_free_memory(uintptr_t p)
{
    fc_alloc *a = reg_remove(p);
    if (a) alloc_destroy(a);
}

/* A cuMemMap mapping as device memory of `device` in the registry (what an address is), its
 * bytes counted by its handle, its pages by its reservation (vmm.c). */
CUresult fc_register_mapping(uintptr_t base, size_t size, int device, CUcontext ctx)
{
    fc_alloc *a = calloc(1, sizeof *a);
    if (!a) return CUDA_ERROR_OUT_OF_MEMORY;
    *a = (fc_alloc){ .base = base, .size = size, .mapped = 1, .device = device, .ctx = ctx };
    if (reg_insert(a) != 0) {
        free(a);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    return CUDA_SUCCESS;
}

int fc_alloc_starts_at(uintptr_t p)
{
    pthread_rwlock_rdlock(&fc_reg_lock);
    fc_alloc *a = reg_find(p);
    int starts = a && a->base == p;
    pthread_rwlock_unlock(&fc_reg_lock);
    return starts;
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
    fc_va_write_lock(); /* an mmap of the UVM device file: uvm_mmap takes the va_space lock to write */
    err = fc_alloc_memory(dptr, bytesize, FC_ALLOC_MANAGED, fc_ctx_device(c), c);
    fc_va_write_unlock();
    return err;
}
FC_ALIAS(cuMemAllocManaged);

FC_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
    FC_ENTRY(cuMemAlloc_v2, 3020);
    CUresult err = CUDA_SUCCESS;
    CUcontext c = need_ctx(&err);
    if (!c) return err;
    /* Whether libcuda maps plain memory into UVM (UVM_CREATE_EXTERNAL_RANGE takes the va_space
     * lock to write, uvm_map_external.c) is not public: assumed, as the dearer answer. */
    fc_va_write_lock();
    err = fc_alloc_memory(dptr, bytesize, FC_ALLOC_DEVICE, fc_ctx_device(c), c);
    fc_va_write_unlock();
    return err;
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
    if (dev < 0 || fc_pool_forget_block((uintptr_t)dptr) != 0) return CUDA_ERROR_INVALID_VALUE;
    fc_sync_ctx_streams(NULL, dev);
    fc_va_write_lock(); /* an munmap: uvm_vm_close_managed takes the va_space lock to write */
    a = reg_remove((uintptr_t)dptr);
    fc_va_write_unlock();
    if (!a) return CUDA_ERROR_INVALID_VALUE;
    alloc_destroy(a);
    return CUDA_SUCCESS;
}
FC_ALIAS(cuMemFree_v2);

/* ---- what an address is, for pointers.c ---- */
int fc_alloc_lookup(uintptr_t p, fc_alloc_desc *out)
{
    pthread_rwlock_rdlock(&fc_reg_lock);
    fc_alloc *a = reg_find(p);
    if (a) *out = (fc_alloc_desc){ a->base, a->size, a->managed, a->device, a->ctx, a->ordinal };
    pthread_rwlock_unlock(&fc_reg_lock);
    return a != NULL;
}

FC_EXPORT int fakecuda_allocation_of(const void *ptr, uint64_t *ordinal, uint64_t *offset, uint64_t *size)
{
    fc_alloc_desc a;
    if (!fc_alloc_lookup((uintptr_t)ptr, &a)) return 0;
    if (ordinal) *ordinal = a.ordinal;
    if (offset) *offset = (uintptr_t)ptr - a.base;
    if (size) *size = a.size;
    return 1;
}

/* The live allocation made ordinal-th: its base and size, or 0. */
int fc_alloc_by_ordinal(uint64_t ordinal, uintptr_t *base, size_t *size)
{
    int found = 0;
    pthread_rwlock_rdlock(&fc_reg_lock);
    for (size_t i = 0; i < fc_nreg && !found; i++) {
        if (fc_reg[i]->ordinal != ordinal) continue;
        *base = fc_reg[i]->base;
        *size = fc_reg[i]->size;
        found = 1;
    }
    pthread_rwlock_unlock(&fc_reg_lock);
    return found;
}

/* ---- managed ranges, for prefetch.c ---- */
uint64_t fc_bytes_to_move(uintptr_t p, size_t n, int loc)
{
    uint64_t bytes = 0;
    pthread_rwlock_rdlock(&fc_reg_lock);
    fc_alloc *a = reg_find(p);
    if (a && a->managed && n) {
        size_t last = (p + n - 1 - a->base) / FAKECUDA_PAGE;
        pthread_mutex_lock(&a->mu);
        for (size_t q = (p - a->base) / FAKECUDA_PAGE; q <= last && q < a->npages; q++)
            if (loc == FC_LOC_HOST ? a->loc[q] >= FC_LOC_DEV0 : a->loc[q] != loc) bytes += FAKECUDA_PAGE;
        pthread_mutex_unlock(&a->mu);
    }
    pthread_rwlock_unlock(&fc_reg_lock);
    return bytes;
}

void fc_set_preferred_location(uintptr_t p, size_t n, int loc)
{
    pthread_rwlock_rdlock(&fc_reg_lock);
    fc_alloc *a = reg_find(p);
    if (a && a->managed && n) {
        pthread_mutex_lock(&a->mu);
        for (size_t q = (p - a->base) / FAKECUDA_PAGE; q <= (p + n - 1 - a->base) / FAKECUDA_PAGE && q < a->npages; q++)
            a->pref[q] = (uint8_t)loc;
        pthread_mutex_unlock(&a->mu);
    }
    pthread_rwlock_unlock(&fc_reg_lock);
}

/* cuda.h 13.0 says the range of cuMemPrefetchAsync, cuMemPrefetchBatchAsync,
 * cuMemDiscardBatchAsync, cuMemDiscardAndPrefetchBatchAsync and cuMemAdvise "must refer to
 * managed memory allocated via ::cuMemAllocManaged or declared via __managed__ variables";
 * memory of a managed pool (cuMemAllocFromPoolAsync) is neither, so it is refused with what
 * cuMemPrefetchAsync's documented returns give a range outside that contract,
 * CUDA_ERROR_INVALID_VALUE (its other, CUDA_ERROR_INVALID_DEVICE, is about the location).
 * The 580 driver accepts the prefetches and discards all the same (an H100, driver 580.159.04:
 * bench/results/gpu-20261124-nvidia-h100-80gb-hbm3, preflight.json, probes.managed), so that is
 * the default; FAKECUDA_POOL_PREFETCH=refuse keeps to the contract. */
CUresult fc_check_prefetch_range(uintptr_t p, size_t n)
{
    if (n == 0 || p + n < p) return CUDA_ERROR_INVALID_VALUE;
    pthread_rwlock_rdlock(&fc_reg_lock);
    fc_alloc *a = reg_find(p);
    int ok = a && a->managed && (!a->from_pool || fc_cfg.pool_prefetch) && p + n <= a->base + a->size;
    pthread_rwlock_unlock(&fc_reg_lock);
    return ok ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

int fc_is_pool_memory(uintptr_t p)
{
    pthread_rwlock_rdlock(&fc_reg_lock);
    fc_alloc *a = reg_find(p);
    int pool = a && a->from_pool;
    pthread_rwlock_unlock(&fc_reg_lock);
    return pool;
}

int fc_mem_kind(uintptr_t p, size_t n)
{
    pthread_rwlock_rdlock(&fc_reg_lock);
    size_t i = fc_reg_first_end_above(p);
    fc_alloc *a = i < fc_nreg ? fc_reg[i] : NULL;
    int kind = !a || a->base >= p + n ? FC_MEM_HOST
             : a->base > p || p + n > a->base + a->size ? -1
             : a->managed ? FC_MEM_MANAGED : FC_MEM_DEVICE;
    pthread_rwlock_unlock(&fc_reg_lock);
    return kind;
}
