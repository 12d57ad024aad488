/* memory.c: why it exists: managed allocations (host memory with a residency state per
 * FAKECUDA_PAGE page: unpopulated, host or device N), plain device allocations (pools.c's
 * memory too), page migration by kernel touches (GPU faults), host touches (CPU faults)
 * in batches with the driver's fault-time prefetcher (fault_prefetch.c's rule) and
 * prefetches (prefetch.c's stream ops), and the driver's eviction of managed memory when a
 * device needs room (devmem.c picks the victim). */
#include "fakecuda_internal.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

enum { FC_BIT_PREFETCHED = 1, FC_BIT_TOUCHED = 2, FC_BIT_EVICTED = 4 }; /* and fault_prefetch.c's FC_BIT_* */
#define PAGES_PER_BLOCK (FAKECUDA_VA_BLOCK / FAKECUDA_PAGE)
#define FC_NO_ROOM INT64_MIN
enum { WHY_KERNEL, WHY_HOST, WHY_PREFETCH, WHY_DISCARD, WHY_FAULT_PREFETCH };

typedef struct fc_alloc {
    uintptr_t base;
    size_t size;
    void *map;
    size_t map_len;
    int managed;
    int from_pool;   /* managed memory of a managed pool (FC_ALLOC_MANAGED_POOL) */
    int device;      /* plain: owning device; managed: device of the allocating context */
    CUcontext ctx;
    size_t npages;
    pthread_mutex_t mu; /* guards loc[] and bits[] */
    uint8_t *loc;       /* FC_LOC_UNPOP, FC_LOC_HOST, FC_LOC_DEV0 + d */
    uint8_t *bits;      /* FC_BIT_* */
    uint8_t *pref;      /* preferred location (cuMemAdvise), FC_LOC_*; FC_LOC_UNPOP: none */
    fc_chunk **chunks;  /* [block * ndevices + d]: the block's root chunk on device d, or NULL */
    fc_prefetch_info *pfi; /* per VA block */
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

/* Removes the allocation that starts exactly at p; NULL if none. Its root chunks go back to
 * their devices here, under the write lock, so that no eviction (which holds the lock for
 * reading) can be holding one. */
static fc_alloc *reg_remove(uintptr_t p)
{
    pthread_rwlock_wrlock(&fc_reg_lock);
    fc_alloc *a = reg_find(p);
    if (a && a->base == p) {
        size_t i = reg_first_end_above(p);
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

static int64_t xfer_ns(uint64_t bytes, uint64_t bytes_per_us) { return (int64_t)(bytes * 1000u / bytes_per_us); }

static fc_chunk **chunk_slot(fc_alloc *a, size_t page, int device)
{
    return &a->chunks[page / PAGES_PER_BLOCK * (size_t)fc_cfg.ndevices + (size_t)device];
}

/* The root chunk a block takes on a device: 2 MiB, or what is left of the allocation. */
static uint64_t chunk_bytes(const fc_alloc *a, size_t block)
{
    uint64_t left = (uint64_t)(a->npages - block * PAGES_PER_BLOCK) * FAKECUDA_PAGE;
    return left < FAKECUDA_VA_BLOCK ? left : FAKECUDA_VA_BLOCK;
}

/* Moves page p of a to target for the given reason; counts and returns modelled ns, or
 * FC_NO_ROOM (nothing done) when its block has no chunk on the target device and the device
 * has no free memory for one. */
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
    fc_chunk **slot = target >= FC_LOC_DEV0 ? chunk_slot(a, p, target - FC_LOC_DEV0) : NULL;
    if (slot && !*slot &&
        !(*slot = fc_chunk_new(a, p / PAGES_PER_BLOCK, target - FC_LOC_DEV0, chunk_bytes(a, p / PAGES_PER_BLOCK))))
        return FC_NO_ROOM;
    if (target >= FC_LOC_DEV0 && (*b & FC_BIT_EVICTED)) { /* the driver's eviction, undone */
        FC_COUNT(bytes_evicted_h2d, FAKECUDA_PAGE);
        *b &= (uint8_t)~FC_BIT_EVICTED;
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
    case WHY_FAULT_PREFETCH: /* the driver's fault-time prefetcher: moved with the batch, no fault */
        if (cur == FC_LOC_HOST) {
            FC_COUNT(bytes_faulted_h2d, FAKECUDA_PAGE);
            FC_COUNT(bytes_fault_prefetched_h2d, FAKECUDA_PAGE);
        }
        if (cur != FC_LOC_UNPOP) ns += xfer_ns(FAKECUDA_PAGE, FAKECUDA_H2D_BYTES_PER_US);
        break;
    case WHY_DISCARD: /* dead: nothing moves, and whoever reads it before writing sees poison */
        FC_COUNT(bytes_discarded, FAKECUDA_PAGE);
        memset((void *)(a->base + p * FAKECUDA_PAGE), FAKECUDA_DISCARD_POISON, FAKECUDA_PAGE);
        break;
    }
    if (cur >= FC_LOC_DEV0) {
        atomic_fetch_sub(&fc_dev_resident[cur - FC_LOC_DEV0], FAKECUDA_PAGE);
        fc_chunk_page_out(*chunk_slot(a, p, cur - FC_LOC_DEV0), why == WHY_DISCARD);
    }
    if (slot) {
        fc_dev_resident_add(target - FC_LOC_DEV0, FAKECUDA_PAGE);
        fc_chunk_page_in(*slot);
    }
    a->loc[p] = target;
    return ns;
}

/* No room on the device and nothing left to evict: the page stays (a prefetch moves less
 * than asked, as cuMemPrefetchAsync's documentation allows); a kernel's access still faults
 * and crosses the link (the driver maps the page remotely). */
static int64_t page_stays(fc_alloc *a, size_t p, int why)
{
    if (why != WHY_KERNEL) return 0;
    FC_COUNT(gpu_faults, 1);
    if (a->loc[p] == FC_LOC_UNPOP) a->loc[p] = FC_LOC_HOST;
    return FAKECUDA_GPU_FAULT_US * 1000 + xfer_ns(FAKECUDA_PAGE, FAKECUDA_H2D_BYTES_PER_US);
}

/* Evicts one root chunk of the device, in the driver's order (devmem.c): its block's pages
 * there are copied to the host at the link's rate (uvm_pmm_gpu.c, evict_root_chunk: "all
 * resident pages backed by it are moved to the CPU"; discarded and unused ones are dropped,
 * not copied). The caller holds fc_reg_lock for reading (no allocation goes meanwhile) and no
 * allocation's mu; it pays the returned ns once it has let go of fc_reg_lock. 0 ns and
 * *evicted = 0 when nothing is left to evict. */
static int64_t evict_one(int device, int *evicted)
{
    fc_chunk *c = fc_chunk_pick_victim(device);
    *evicted = c != NULL;
    if (!c) return 0;
    fc_alloc *b = c->owner;
    int64_t ns = 0;
    size_t first = c->block * PAGES_PER_BLOCK, end = first + PAGES_PER_BLOCK < b->npages ? first + PAGES_PER_BLOCK
                                                                                        : b->npages;
    pthread_mutex_lock(&b->mu);
    for (size_t p = first; p < end; p++) {
        if (b->loc[p] != FC_LOC_DEV0 + device) continue;
        if (b->bits[p] & FC_BIT_PREFETCHED) FC_COUNT(bytes_prefetched_unused, FAKECUDA_PAGE);
        b->bits[p] = (uint8_t)((b->bits[p] & ~FC_BIT_PREFETCHED) | FC_BIT_EVICTED);
        b->loc[p] = FC_LOC_HOST;
        atomic_fetch_sub(&fc_dev_resident[device], FAKECUDA_PAGE);
        FC_COUNT(bytes_evicted_d2h, FAKECUDA_PAGE);
        ns += xfer_ns(FAKECUDA_PAGE, FAKECUDA_D2H_BYTES_PER_US);
    }
    *chunk_slot(b, first, device) = NULL;
    pthread_mutex_unlock(&b->mu);
    fc_chunk_release(c);
    FC_COUNT(driver_evictions, 1);
    return ns;
}

/* One batch of a kernel's burst of accesses to [*pp, plast] of a: the driver fetches up to
 * uvm_perf_fault_batch_count faults (the pages not on target, in address order; pages
 * already there are touched, no fault), then services them VA block by VA block with the
 * prefetcher's pages (service_fault_batch, service_fault_batch_block), a page at a time: a
 * page whose block has no chunk on the device first evicts one, then is filled (evict, then
 * fill: the kernel waits for both, one after the other, as block_populate_pages ->
 * uvm_pmm_gpu_alloc -> pick_and_evict_root_chunk does it before the copy in). *pp moves past
 * the pages fetched. Returns the modelled ns. Caller holds fc_reg_lock for reading and a->mu
 * (let go of during evictions). */
static int64_t fault_batch(fc_alloc *a, size_t *pp, size_t plast, uint8_t target)
{
    size_t p = *pp, nf = 0, lo = SIZE_MAX, hi = 0;
    for (; p <= plast && nf < fc_cfg.fault_batch_count; p++) {
        if (a->loc[p] == target) {
            page_move(a, p, target, WHY_KERNEL); /* touched, no fault */
            continue;
        }
        a->bits[p] |= FC_BIT_FAULTED;
        nf++;
        if (lo == SIZE_MAX) lo = p;
        hi = p;
    }
    *pp = p;
    if (nf == 0) return 0;
    FC_COUNT(gpu_fault_batches, 1);
    size_t b0 = lo / PAGES_PER_BLOCK, b1 = hi / PAGES_PER_BLOCK;
    for (size_t b = b0; b <= b1; b++) {
        size_t first = b * PAGES_PER_BLOCK, n = a->npages - first < PAGES_PER_BLOCK ? a->npages - first : PAGES_PER_BLOCK;
        fc_prefetch_plan(n, &a->loc[first], &a->pref[first], &a->bits[first], target, &a->pfi[b]);
    }
    size_t end = (b1 + 1) * PAGES_PER_BLOCK < a->npages ? (b1 + 1) * PAGES_PER_BLOCK : a->npages;
    int64_t ns = 0;
    for (size_t q = b0 * PAGES_PER_BLOCK; q < end; q++) {
        uint8_t bits = a->bits[q] & (FC_BIT_FAULTED | FC_BIT_DRIVER_PF);
        if (!bits) continue;
        int why = bits & FC_BIT_FAULTED ? WHY_KERNEL : WHY_FAULT_PREFETCH;
        int64_t moved;
        while ((moved = page_move(a, q, target, why)) == FC_NO_ROOM) {
            int evicted = 0;
            pthread_mutex_unlock(&a->mu);
            ns += evict_one(target - FC_LOC_DEV0, &evicted);
            pthread_mutex_lock(&a->mu);
            if (!evicted) {
                moved = page_stays(a, q, why);
                break;
            }
        }
        ns += moved;
        a->bits[q] &= (uint8_t)~(FC_BIT_FAULTED | FC_BIT_DRIVER_PF);
    }
    return ns;
}

/* A plain allocation that needs room gets it by evicting managed chunks (UVM registers
 * uvm_pmm_gpu_pma_evict_pages / _range with PMA for RM's allocations); out of memory only
 * when nothing evictable remains. The copies are paid by the allocating thread. */
CUresult fc_reserve_device_memory(int device, uint64_t bytes)
{
    int64_t ns = 0;
    int evicted = 1;
    while (fc_devmem_take(device, bytes) != 0 && evicted) {
        pthread_rwlock_rdlock(&fc_reg_lock);
        ns += evict_one(device, &evicted);
        pthread_rwlock_unlock(&fc_reg_lock);
    }
    fc_charge_ns(ns);
    return evicted ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

/* Walks [addr, addr+len) page by page, releasing the locks and sleeping off the modelled
 * time every FAKECUDA_SLEEP_CHUNK_US, so that a racing stream sees pages move one by one; a
 * kernel's access a fault batch at a time (fault_batch). Memory that is not managed is
 * skipped; a burst that spans allocations is batched per allocation. */
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
        int64_t moved = 0;
        pthread_mutex_lock(&a->mu);
        if (why == WHY_KERNEL) {
            ns = fault_batch(a, &p, plast, target);
            FC_COUNT(gpu_fault_stall_ns, ns);
        } else {
            for (; p <= plast && ns < chunk && (moved = page_move(a, p, target, why)) != FC_NO_ROOM; p++) ns += moved;
        }
        pthread_mutex_unlock(&a->mu);
        if (moved == FC_NO_ROOM) { /* evict (a's mu let go), then this page again; or it stays */
            int evicted = 0;
            ns += evict_one(target - FC_LOC_DEV0, &evicted);
            if (!evicted) {
                pthread_mutex_lock(&a->mu);
                ns += page_stays(a, p++, why);
                pthread_mutex_unlock(&a->mu);
            }
        }
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
            if (clear) a->bits[p] &= FC_BIT_EVICTED | FC_BIT_FAULTED | FC_BIT_DRIVER_PF; /* not statistics */
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
        size_t nblocks = (a->npages + PAGES_PER_BLOCK - 1) / PAGES_PER_BLOCK;
        a->chunks = calloc(nblocks * (size_t)fc_cfg.ndevices, sizeof *a->chunks);
        a->pfi = calloc(nblocks, sizeof *a->pfi);
    }
    if ((managed && (!a->loc || !a->bits || !a->pref || !a->chunks || !a->pfi)) || reg_insert(a) != 0) {
        if (!managed) fc_devmem_give(device, size);
        munmap(a->map, a->map_len);
        free(a->loc);
        free(a->bits);
        free(a->pref);
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
    free(a->chunks);
    free(a->pfi);
    free(a);
}

void fc_free_memory(uintptr_t p)
{
    fc_alloc *a = reg_remove(p);
    if (a) alloc_destroy(a);
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
    if (a) *out = (fc_alloc_desc){ a->base, a->size, a->managed, a->device, a->ctx };
    pthread_rwlock_unlock(&fc_reg_lock);
    return a != NULL;
}

/* ---- managed ranges, for prefetch.c ---- */
uint64_t fc_device_resident_bytes(uintptr_t p, size_t n)
{
    uint64_t bytes = 0;
    pthread_rwlock_rdlock(&fc_reg_lock);
    fc_alloc *a = reg_find(p);
    if (a && a->managed && n) {
        size_t last = (p + n - 1 - a->base) / FAKECUDA_PAGE;
        pthread_mutex_lock(&a->mu);
        for (size_t q = (p - a->base) / FAKECUDA_PAGE; q <= last && q < a->npages; q++)
            if (a->loc[q] >= FC_LOC_DEV0) bytes += FAKECUDA_PAGE;
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
 * Whether the 580 driver does refuse it is not known (issue 27): FAKECUDA_POOL_PREFETCH=accept
 * accepts it, for when a GPU shows that it does. */
CUresult fc_check_prefetch_range(uintptr_t p, size_t n)
{
    if (n == 0 || p + n < p) return CUDA_ERROR_INVALID_VALUE;
    pthread_rwlock_rdlock(&fc_reg_lock);
    fc_alloc *a = reg_find(p);
    int ok = a && a->managed && (!a->from_pool || fc_cfg.pool_prefetch) && p + n <= a->base + a->size;
    pthread_rwlock_unlock(&fc_reg_lock);
    return ok ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

int fc_mem_kind(uintptr_t p, size_t n)
{
    pthread_rwlock_rdlock(&fc_reg_lock);
    size_t i = reg_first_end_above(p);
    fc_alloc *a = i < fc_nreg ? fc_reg[i] : NULL;
    int kind = !a || a->base >= p + n ? FC_MEM_HOST
             : a->base > p || p + n > a->base + a->size ? -1
             : a->managed ? FC_MEM_MANAGED : FC_MEM_DEVICE;
    pthread_rwlock_unlock(&fc_reg_lock);
    return kind;
}

void fc_migrate_ranges(const fc_range *r, size_t n)
{
    for (size_t i = 0; i < n; i++)
        migrate_range(r[i].ptr, r[i].size, (uint8_t)r[i].loc, r[i].loc == FC_LOC_UNPOP ? WHY_DISCARD : WHY_PREFETCH);
}
