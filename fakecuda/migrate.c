/* migrate.c: why it exists: managed pages move here: by kernel touches (GPU faults) in
 * batches with the driver's fault-time prefetcher (fault_prefetch.c's rule), by host
 * touches (CPU faults), by prefetches and discards (prefetch.c's stream ops), and by the
 * driver's eviction of managed memory when a device needs room (devmem.c picks the victim). */
#include "memory_pages.h"

#include <string.h>

#define FC_NO_ROOM INT64_MIN
/* WHY_KERNEL: a kernel's access that may write (fakecuda_touch), WHY_KERNEL_READ: one that only
 * reads (fakecuda_touch_read); WHY_HOST: the host's access, taken as a write. */
/* WHY_PREFETCH_WAITED: a prefetch to the host whose caller already waited for its copies inside
 * the ioctl (prefetch.c): its pages move without taking the time again. */
enum { WHY_KERNEL, WHY_KERNEL_READ, WHY_HOST, WHY_PREFETCH, WHY_PREFETCH_WAITED, WHY_DISCARD, WHY_FAULT_PREFETCH };
#define IS_KERNEL(why) ((why) == WHY_KERNEL || (why) == WHY_KERNEL_READ)
#define IS_PREFETCH(why) ((why) == WHY_PREFETCH || (why) == WHY_PREFETCH_WAITED)

_Thread_local int fc_tls_kernel_device = -1;

_Thread_local uint64_t fc_tls_gpu_faults;

/* A GPU fault: counted for all, and for the thread whose kernel took it (kernels.c tells which
 * operand's touch took it). */
static void count_gpu_fault(void)
{
    FC_COUNT(gpu_faults, 1);
    fc_tls_gpu_faults++;
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

/* Page p of a leaves the device it is on (discarded: by a discard). */
static void leave_device(fc_alloc *a, size_t p, int discarded)
{
    int d = a->loc[p] - FC_LOC_DEV0;
    atomic_fetch_sub(&fc_dev_resident[d], FAKECUDA_PAGE);
    fc_chunk_page_out(*chunk_slot(a, p, d), discarded);
}

/* Page p's bytes are not carried where it goes: whoever reads them before writing sees poison,
 * and a kernel's or a copy's read of them counts (fc_pages_read). FAKECUDA_DISCARD_FILL=none
 * leaves the bytes and keeps the count: for a client whose kernels have no body (the real
 * client), where no value is computed and the fill is only host time spent on the stream's
 * worker, which keeps the stream busy as a GPU's discard (a fixed cost and a pass per block,
 * fc_discard_ioctl_ns) does not: 64 KiB of memset a page, 2.3 GB a step on GPT-2 small. */
static void lose_page(fc_alloc *a, size_t p)
{
    if (fc_cfg.discard_fill) memset((void *)(a->base + p * FAKECUDA_PAGE), FAKECUDA_DISCARD_POISON, FAKECUDA_PAGE);
    a->lost[p] = 1;
}

/* An access that may write page p (a kernel's, the host's) gives it bytes again: the lenient
 * side, since a write of part of a page clears all of it. */
static void written(fc_alloc *a, size_t p, int why)
{
    if (why == WHY_KERNEL || why == WHY_HOST) a->lost[p] = 0;
}

/* Read-mostly pages (cuMemAdvise CU_MEM_ADVISE_SET_READ_MOSTLY) as UVM keeps them
 * (open-gpu-kernel-modules 595.45.04): a read or a prefetch of a page that is elsewhere makes
 * a copy where it is wanted and leaves the other valid (uvm_va_block.c,
 * block_select_processor_residency: "Read/prefetch faults on a VA range with read
 * duplication enabled always create a copy of the page on the faulting processor's memory";
 * uvm_migrate.c takes uvm_va_block_make_resident_read_duplicate for a read-duplicate range);
 * a write faults (the duplicate is mapped read-only) and collapses the copies to the writer's
 * without moving a byte (break_read_duplication_in_region); an eviction copies only pages not
 * already resident on the CPU (block_copy_resident_pages: copy_page_mask = pages not resident
 * at the destination), so a duplicate goes for nothing. FC_BIT_DUP: the page is on loc (a
 * device) and its host copy is valid too. Here: a page going to the host from a device (a
 * prefetch there, or the host's write); -1 when the ordinary move applies. */
static int64_t read_mostly_to_host(fc_alloc *a, size_t p, int why)
{
    uint8_t *b = &a->bits[p];
    if ((*b & FC_BIT_DUP) && IS_PREFETCH(why)) return 0; /* a copy is on the host already: none moves */
    if ((*b & FC_BIT_DUP) && why == WHY_HOST) {            /* the host writes: the device's copy goes */
        FC_COUNT(cpu_faults, 1);
        leave_device(a, p, 0);
        a->loc[p] = FC_LOC_HOST;
        *b &= (uint8_t)~(FC_BIT_DUP | FC_BIT_PREFETCHED);
        return FAKECUDA_CPU_FAULT_US * 1000;
    }
    if ((*b & FC_BIT_READ_MOSTLY) && IS_PREFETCH(why)) { /* copied to the host; the device keeps its copy */
        FC_COUNT(bytes_d2h, FAKECUDA_PAGE);
        a->crossed[p] |= FC_CROSSED_OUT;
        *b |= FC_BIT_DUP;
        return why == WHY_PREFETCH_WAITED ? 0 : fc_prefetch_d2h_wait_ns(FAKECUDA_PAGE);
    }
    return -1;
}

/* The bytes the running kernel's current access overwrites without reading (fc_run_kernel). */
_Thread_local uintptr_t fc_tls_overwrite_lo, fc_tls_overwrite_hi;

/* Page p's value is dead (overwritten whole, or discarded): its crossings since its last use
 * carried nothing anyone reads. */
static void count_dead(fc_alloc *a, size_t p)
{
    if (a->crossed[p] & FC_CROSSED_IN) FC_COUNT(bytes_dead_h2d, FAKECUDA_PAGE);
    if (a->crossed[p] & FC_CROSSED_OUT) FC_COUNT(bytes_dead_d2h, FAKECUDA_PAGE);
    a->crossed[p] = 0;
}

/* Whether the running kernel's access overwrites all of page p without reading it. */
static int overwritten(const fc_alloc *a, size_t p)
{
    uintptr_t start = a->base + p * FAKECUDA_PAGE;
    uintptr_t stop = p + 1 < a->npages ? start + FAKECUDA_PAGE : a->base + a->size;
    return fc_tls_overwrite_lo <= start && stop <= fc_tls_overwrite_hi;
}

/* Moves page p of a to target for the given reason; counts and returns modelled ns, or
 * FC_NO_ROOM (nothing done) when its block has no chunk on the target device and the device
 * has no free memory for one. */
static int64_t page_move_to(fc_alloc *a, size_t p, uint8_t target, int why)
{
    uint8_t cur = a->loc[p];
    uint8_t *b = &a->bits[p];
    int64_t ns = 0;
    if (IS_KERNEL(why) && !(*b & FC_BIT_TOUCHED)) {
        *b |= FC_BIT_TOUCHED;
        FC_COUNT(pages_touched_by_kernels, 1);
    }
    if (IS_KERNEL(why) && overwritten(a, p))
        count_dead(a, p);
    else if (IS_KERNEL(why) || why == WHY_HOST)
        a->crossed[p] = 0; /* used: what crossed was needed */
    if (cur == target) {
        if (IS_KERNEL(why)) *b &= (uint8_t)~FC_BIT_PREFETCHED; /* the prefetch paid off */
        if (why == WHY_KERNEL && (*b & FC_BIT_DUP)) { /* a write to a duplicate: a fault, the copies collapse */
            count_gpu_fault();
            *b &= (uint8_t)~FC_BIT_DUP;
            return FAKECUDA_GPU_FAULT_US * 1000;
        }
        return 0;
    }
    if (*b & FC_BIT_DISCARD_STUCK) { /* a race left its discard status stuck (discard_races.c) */
        if (cur != FC_LOC_UNPOP) FC_COUNT(bytes_lost_to_discard_races, FAKECUDA_PAGE);
        lose_page(a, p);
        if (IS_PREFETCH(why) || why == WHY_DISCARD) *b &= (uint8_t)~FC_BIT_DISCARD_STUCK; /* an API call clears it */
    }
    if (target == FC_LOC_HOST && cur >= FC_LOC_DEV0 && (*b & (FC_BIT_DUP | FC_BIT_READ_MOSTLY))) {
        int64_t dup_ns = read_mostly_to_host(a, p, why);
        if (dup_ns >= 0) return dup_ns;
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
    case WHY_KERNEL_READ:
        count_gpu_fault();
        ns += FAKECUDA_GPU_FAULT_US * 1000;
        if (cur == FC_LOC_HOST) {
            FC_COUNT(bytes_faulted_h2d, FAKECUDA_PAGE);
            if (overwritten(a, p)) FC_COUNT(bytes_dead_h2d, FAKECUDA_PAGE); /* fetched to be overwritten */
        }
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
    case WHY_PREFETCH_WAITED:
        if (target >= FC_LOC_DEV0 && cur == FC_LOC_HOST) {
            FC_COUNT(bytes_prefetched_h2d, FAKECUDA_PAGE);
            a->crossed[p] |= FC_CROSSED_IN;
            *b |= FC_BIT_PREFETCHED;
            ns += xfer_ns(FAKECUDA_PAGE, FAKECUDA_H2D_BYTES_PER_US);
        } else if (target == FC_LOC_HOST && cur >= FC_LOC_DEV0) {
            FC_COUNT(bytes_d2h, FAKECUDA_PAGE);
            a->crossed[p] |= FC_CROSSED_OUT;
            if (why == WHY_PREFETCH) ns += fc_prefetch_d2h_wait_ns(FAKECUDA_PAGE);
        } else if (cur >= FC_LOC_DEV0) { /* peer to peer: costed, not counted */
            ns += xfer_ns(FAKECUDA_PAGE, FAKECUDA_H2D_BYTES_PER_US);
        } /* unpopulated: populated in place, nothing moves */
        break;
    case WHY_FAULT_PREFETCH: /* the driver's fault-time prefetcher: moved with the batch, no fault */
        if (cur == FC_LOC_HOST) {
            FC_COUNT(bytes_faulted_h2d, FAKECUDA_PAGE);
            FC_COUNT(bytes_fault_prefetched_h2d, FAKECUDA_PAGE);
            a->crossed[p] |= FC_CROSSED_IN;
        }
        if (cur != FC_LOC_UNPOP) ns += xfer_ns(FAKECUDA_PAGE, FAKECUDA_H2D_BYTES_PER_US);
        break;
    case WHY_DISCARD: /* dead: nothing moves */
        FC_COUNT(bytes_discarded, FAKECUDA_PAGE);
        count_dead(a, p);
        lose_page(a, p);
        break;
    }
    if (cur >= FC_LOC_DEV0) leave_device(a, p, why == WHY_DISCARD);
    if (slot) {
        fc_dev_resident_add(target - FC_LOC_DEV0, FAKECUDA_PAGE);
        fc_chunk_page_in(*slot);
    }
    a->loc[p] = target;
    /* A read-mostly page read or prefetched in from the host is a duplicate (its host copy stays
     * valid); one written in, or gone to the host or discarded, is not. Between devices a
     * duplicate moves (one copy per device is not modelled: the dearer side) and stays one. */
    if (target >= FC_LOC_DEV0 && cur == FC_LOC_HOST && (*b & FC_BIT_READ_MOSTLY) && why != WHY_KERNEL)
        *b |= FC_BIT_DUP;
    else if (target < FC_LOC_DEV0 || why == WHY_KERNEL)
        *b &= (uint8_t)~FC_BIT_DUP;
    return ns;
}

static int64_t page_move(fc_alloc *a, size_t p, uint8_t target, int why)
{
    int64_t ns = page_move_to(a, p, target, why);
    if (ns != FC_NO_ROOM) written(a, p, why);
    return ns;
}

/* No room on the device and nothing left to evict: the page stays (a prefetch moves less
 * than asked, as cuMemPrefetchAsync's documentation allows); a kernel's access still faults
 * and crosses the link (the driver maps the page remotely). */
static int64_t page_stays(fc_alloc *a, size_t p, int why)
{
    if (!IS_KERNEL(why)) return 0;
    written(a, p, why);
    count_gpu_fault();
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
        int duplicate = b->bits[p] & FC_BIT_DUP; /* its host copy is valid: nothing to copy */
        b->bits[p] = (uint8_t)((b->bits[p] & ~(FC_BIT_PREFETCHED | FC_BIT_DUP)) | FC_BIT_EVICTED);
        b->loc[p] = FC_LOC_HOST;
        atomic_fetch_sub(&fc_dev_resident[device], FAKECUDA_PAGE);
        if (duplicate) continue;
        if (b->bits[p] & FC_BIT_DISCARD_STUCK) { /* believed discarded: not copied, status kept (uvm.h) */
            FC_COUNT(bytes_lost_to_discard_races, FAKECUDA_PAGE);
            lose_page(b, p);
            continue;
        }
        FC_COUNT(bytes_evicted_d2h, FAKECUDA_PAGE);
        b->crossed[p] |= FC_CROSSED_OUT;
        ns += xfer_ns(FAKECUDA_PAGE, FAKECUDA_EVICT_D2H_BYTES_PER_US);
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
static int64_t fault_batch(fc_alloc *a, size_t *pp, size_t plast, uint8_t target, int why)
{
    size_t p = *pp, nf = 0, lo = SIZE_MAX, hi = 0;
    for (; p <= plast && nf < fc_cfg.fault_batch_count; p++) {
        if (a->loc[p] == target && !(why == WHY_KERNEL && (a->bits[p] & FC_BIT_DUP))) {
            page_move(a, p, target, why); /* touched, no fault */
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
        int page_why = bits & FC_BIT_FAULTED ? why : WHY_FAULT_PREFETCH;
        int64_t moved;
        while ((moved = page_move(a, q, target, page_why)) == FC_NO_ROOM) {
            int evicted = 0;
            pthread_mutex_unlock(&a->mu);
            ns += evict_one(target - FC_LOC_DEV0, &evicted);
            pthread_mutex_lock(&a->mu);
            if (!evicted) {
                moved = page_stays(a, q, page_why);
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
        size_t i = fc_reg_first_end_above(addr);
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
        if (IS_KERNEL(why)) {
            ns = fault_batch(a, &p, plast, target, why);
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
        if (IS_PREFETCH(why))
            fc_charge_copies(ns); /* a prefetch's copies (and evictions for their room) take turns: cost.c */
        else
            fc_charge_ns(ns);
    }
}

FC_EXPORT void fakecuda_touch(const void *ptr, size_t bytes)
{
    int dev = fc_tls_kernel_device;
    if (dev < 0) dev = fc_ctx_valid(fc_current_ctx()) ? fc_ctx_device(fc_current_ctx()) : 0;
    if (ptr && bytes) migrate_range((uintptr_t)ptr, bytes, (uint8_t)(FC_LOC_DEV0 + dev), WHY_KERNEL);
}

FC_EXPORT void fakecuda_touch_read(const void *ptr, size_t bytes)
{
    int dev = fc_tls_kernel_device;
    if (dev < 0) dev = fc_ctx_valid(fc_current_ctx()) ? fc_ctx_device(fc_current_ctx()) : 0;
    if (ptr && bytes) migrate_range((uintptr_t)ptr, bytes, (uint8_t)(FC_LOC_DEV0 + dev), WHY_KERNEL_READ);
}

FC_EXPORT void fakecuda_host_touch(const void *ptr, size_t bytes)
{
    if (ptr && bytes) migrate_range((uintptr_t)ptr, bytes, FC_LOC_HOST, WHY_HOST);
    fc_pay_debt(0);
}

void fc_pages_discard_stuck(uintptr_t p, size_t n)
{
    pthread_rwlock_rdlock(&fc_reg_lock);
    size_t i = fc_reg_first_end_above(p);
    fc_alloc *a = i < fc_nreg && fc_reg[i]->base <= p ? fc_reg[i] : NULL;
    if (a && a->managed && n) {
        pthread_mutex_lock(&a->mu);
        size_t last = (p + n - 1 - a->base) / FAKECUDA_PAGE;
        for (size_t q = (p - a->base) / FAKECUDA_PAGE; q <= last && q < a->npages; q++)
            a->bits[q] |= FC_BIT_DISCARD_STUCK;
        pthread_mutex_unlock(&a->mu);
    }
    pthread_rwlock_unlock(&fc_reg_lock);
}

void fc_pages_read(uintptr_t p, size_t n)
{
    uint64_t lost = 0;
    if (!n || p + n < p) return;
    pthread_rwlock_rdlock(&fc_reg_lock);
    for (size_t i = fc_reg_first_end_above(p); i < fc_nreg && fc_reg[i]->base < p + n; i++) {
        fc_alloc *a = fc_reg[i];
        if (!a->managed || a->mapped) continue;
        uintptr_t lo = p > a->base ? p : a->base, hi = p + n < a->base + a->size ? p + n : a->base + a->size;
        pthread_mutex_lock(&a->mu);
        for (size_t q = (lo - a->base) / FAKECUDA_PAGE; q <= (hi - 1 - a->base) / FAKECUDA_PAGE; q++) {
            lost += a->lost[q] ? FAKECUDA_PAGE : 0;
            a->crossed[q] = 0; /* read: what crossed was needed */
        }
        pthread_mutex_unlock(&a->mu);
    }
    pthread_rwlock_unlock(&fc_reg_lock);
    FC_COUNT(bytes_read_discarded, lost);
}

void fc_migrate_ranges(const fc_range *r, size_t n, int copies_waited)
{
    for (size_t i = 0; i < n; i++)
        migrate_range(r[i].ptr, r[i].size, (uint8_t)r[i].loc,
                      r[i].loc == FC_LOC_UNPOP ? WHY_DISCARD
                      : copies_waited && r[i].loc == FC_LOC_HOST ? WHY_PREFETCH_WAITED : WHY_PREFETCH);
}

/* CU_MEM_ADVISE_SET_READ_MOSTLY (on) and UNSET (off) on the pages [p, p+n) overlaps. Setting
 * it moves nothing: each page is a duplicate where it is (policy.c,
 * va_block_set_read_duplication_locked). Unsetting collapses each duplicate to one copy, none
 * moved: on the preferred location if it holds one, else on the first processor holding one,
 * the CPU (va_block_unset_read_duplication_locked iterates the resident mask from id 0,
 * UVM_ID_CPU): the device's copy goes. */
void fc_set_read_mostly(uintptr_t p, size_t n, int on)
{
    pthread_rwlock_rdlock(&fc_reg_lock);
    size_t i = fc_reg_first_end_above(p);
    fc_alloc *a = i < fc_nreg && fc_reg[i]->base <= p ? fc_reg[i] : NULL;
    if (a && a->managed && n) {
        pthread_mutex_lock(&a->mu);
        for (size_t q = (p - a->base) / FAKECUDA_PAGE; q <= (p + n - 1 - a->base) / FAKECUDA_PAGE && q < a->npages; q++) {
            uint8_t *b = &a->bits[q];
            if (on) {
                *b |= FC_BIT_READ_MOSTLY;
                continue;
            }
            if ((*b & FC_BIT_DUP) && a->pref[q] != a->loc[q]) {
                leave_device(a, q, 0);
                a->loc[q] = FC_LOC_HOST;
                *b &= (uint8_t)~FC_BIT_PREFETCHED;
            }
            *b &= (uint8_t)~(FC_BIT_READ_MOSTLY | FC_BIT_DUP);
        }
        pthread_mutex_unlock(&a->mu);
    }
    pthread_rwlock_unlock(&fc_reg_lock);
}
