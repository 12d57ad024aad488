/* prefetch.c: why it exists: the prefetch, discard and advice entry points: their checks (at
 * call time, as cuda.h documents them), their host cost (one UVM_MIGRATE or UVM_DISCARD ioctl
 * per range, paid by the caller, or with FAKECUDA_IOCTL_THREAD=worker by the stream's worker
 * standing for the driver's thread; a migration to the host also waits for its copies inside
 * the ioctl, holding the va_space lock), and their stream operation (pages move when the
 * stream reaches it, at the link's rate: memory.c). */
#include "fakecuda_internal.h"

#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* The ioctl time of a prefetch (a migration per range, with the CPU time of the pages it will
 * move as they lie now) or a discard. A migration to the host also waits for its copies of what
 * is on a device now: "Creating CPU mappings must wait for the migration to complete"
 * (uvm_ioctl.h, UVM_MIGRATE_FLAG_SKIP_CPU_MAP, a test-only flag; block_map_cpu_page_to waits
 * for the block's tracker), all under the va_space read lock that uvm_api_migrate holds until
 * it returns. */
static int64_t ioctl_ns(const fc_range *r, size_t n, int discard, int with_copies, int64_t *turn_ns)
{
    int64_t ns = 0;
    for (size_t i = 0; i < n; i++) {
        if (discard) {
            ns += fc_discard_ioctl_ns(r[i].ptr, r[i].size);
            continue;
        }
        uint64_t moving = fc_bytes_to_move(r[i].ptr, r[i].size, r[i].loc);
        ns += fc_migrate_ioctl_ns(r[i].ptr, r[i].size);
        /* Moving its pages takes its turn with other prefetches' copies (cost.c, fc_charge_copies),
         * as its copies do: a move to the host waits for them, its pages' CPU time inside that wait */
        *turn_ns += fc_move_ns(moving);
        if (with_copies && r[i].loc == FC_LOC_HOST)
            *turn_ns += fc_prefetch_d2h_wait_ns(moving);
    }
    return ns;
}

/* Reached in its stream: with FAKECUDA_IOCTL_THREAD=worker the ioctl runs now, on this
 * worker (the driver's thread), and a migration to the host holds the va_space lock while
 * its pages move; then the pages move. */
void fc_run_prefetch(const fc_op *op)
{
    fc_wait_until(op->u.pf.not_before);
    int discard = op->u.pf.entry == FC_E_DISCARD;
    if (discard) fc_discard_runs(op->u.pf.stream, op->u.pf.race_number, op->u.pf.r, op->u.pf.n);
    if (op->u.pf.ioctl_ns) fc_ioctl(op->u.pf.entry, op->u.pf.ioctl_ns, op->u.pf.turn_ns, 1); /* copy waits: below */
    for (size_t i = 0; i < op->u.pf.n; i++) {
        int hold = op->u.pf.ioctl_ns && op->u.pf.r[i].loc == FC_LOC_HOST;
        if (hold) fc_va_read_lock();
        fc_migrate_ranges(&op->u.pf.r[i], 1, !op->u.pf.ioctl_ns);
        if (hold) {
            fc_pay_debt(0);
            fc_va_read_unlock();
        }
    }
    fc_pay_debt(0); /* the stream is busy until the last byte has moved */
    if (op->u.pf.late) fc_discard_late(op->u.pf.r, op->u.pf.n);
    if (!discard) fc_migration_completed(op->u.pf.race_number);
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

/* FAKECUDA_POOL_PREFETCH_REFUSE_AFTER=N: a driver that prefetches a managed pool's memory, then
 * refuses it. An H200's driver 580 took a prefetch of a block of the device's managed pool, then
 * refused (CUDA_ERROR_INVALID_VALUE) 151 of the pool's allocations in a GPT-2 run
 * (bench/results/gpu-20261126-nvidia-h200, direct-c/look-stats.json); why, and which, is not
 * known. Here the first N ranges of managed pools' memory asked to be prefetched (each range of a
 * batch counts) are taken, and every later one is refused, as FAKECUDA_POOL_PREFETCH=refuse
 * refuses them. Discards and advice are left as FAKECUDA_POOL_PREFETCH says. */
static CUresult pool_prefetch_still_taken(uintptr_t p)
{
    static _Atomic uint64_t asked;
    if (fc_cfg.pool_prefetch_refuse_after == UINT_MAX || !fc_is_pool_memory(p)) return CUDA_SUCCESS;
    return atomic_fetch_add_explicit(&asked, 1, memory_order_relaxed) < fc_cfg.pool_prefetch_refuse_after
               ? CUDA_SUCCESS
               : CUDA_ERROR_INVALID_VALUE;
}

/* FAKECUDA_HOLD_PREFETCH=PATH, a test's hand on the driver (tests/c/fork_turn.c): every prefetch
 * call, on entry, makes PATH.entered and stays in the driver until PATH exists, as a real call
 * that waits for the GPU or the kernel's page tables would, for as long as the test wants.
 * FAKECUDA_HOLD_PREFETCH_THREAD=NAME holds only the calls made by threads of that name
 * (tests/c/worker_stall.c: pump's worker, "pump-worker"). */
static void hold_for_test(void)
{
    const char *path = getenv("FAKECUDA_HOLD_PREFETCH"), *thread = getenv("FAKECUDA_HOLD_PREFETCH_THREAD");
    char entered[PATH_MAX], name[16];
    if (path == NULL || *path == '\0' || snprintf(entered, sizeof entered, "%s.entered", path) >= (int)sizeof entered)
        return;
    if (thread != NULL && *thread != '\0' &&
        (pthread_getname_np(pthread_self(), name, sizeof name) != 0 || strcmp(name, thread) != 0))
        return;
    int fd = open(entered, O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
    if (fd >= 0) close(fd);
    struct timespec tick = {0, 1000000};
    while (access(path, F_OK) != 0) nanosleep(&tick, NULL);
}

/* One stream op for the whole call (a batch is one op), counted in `calls` (if any), its
 * ioctls paid now by the caller, or by the stream's worker when it reaches them (the caller
 * then pays what putting work on a stream costs: a launch's host time). */
static CUresult prefetch_enqueue(const CUdeviceptr *ptrs, const size_t *sizes, const int *locs, size_t n,
                                 CUstream hStream, _Atomic uint64_t *calls, int entry)
{
    CUresult err = CUDA_SUCCESS;
    if (entry == FC_E_PREFETCH) hold_for_test();
    CUstream s = fc_resolve_stream(hStream, &err);
    if (!s) return err;
    for (size_t i = 0; i < n; i++)
        if ((err = fc_check_prefetch_range((uintptr_t)ptrs[i], sizes[i])) != CUDA_SUCCESS ||
            (entry == FC_E_PREFETCH && (err = pool_prefetch_still_taken((uintptr_t)ptrs[i])) != CUDA_SUCCESS))
            return err;
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
    op->u.pf.entry = entry;
    op->u.pf.late = entry == FC_E_DISCARD && fc_stream_busy(s);
    if (fc_ioctl_on_worker()) {
        fc_cost(entry, FAKECUDA_LAUNCH_HOST_NS);
        op->u.pf.ioctl_ns = ioctl_ns(op->u.pf.r, n, entry == FC_E_DISCARD, 0, &op->u.pf.turn_ns);
    } else {
        fc_cost_call(entry);
        int64_t turn_ns = 0, ns = ioctl_ns(op->u.pf.r, n, entry == FC_E_DISCARD, 1, &turn_ns);
        fc_ioctl(entry, ns, turn_ns, 0);
    }
    op->u.pf.not_before = fc_host_clock_ns();
    op->u.pf.stream = s;
    op->u.pf.race_number = entry == FC_E_DISCARD ? fc_race_number() : fc_migration_enqueued(s, op->u.pf.r, n);
    fc_enqueue(s, op);
    return CUDA_SUCCESS;
}

static CUresult prefetch_v1(CUdeviceptr p, size_t n, CUdevice dst, CUstream s)
{
    int loc;
    if (dst == CU_DEVICE_CPU) loc = FC_LOC_HOST;
    else if (dst >= 0 && dst < fc_cfg.ndevices) loc = FC_LOC_DEV0 + dst;
    else return CUDA_ERROR_INVALID_DEVICE;
    return prefetch_enqueue(&p, &n, &loc, 1, s, &fc_ctr.prefetch_calls, FC_E_PREFETCH);
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
    return prefetch_enqueue(&p, &n, &loc, 1, s, &fc_ctr.prefetch_calls, FC_E_PREFETCH);
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
    if (err == CUDA_SUCCESS) err = prefetch_enqueue(dptrs, sizes, loc, count, s, &fc_ctr.batch_prefetch_calls, FC_E_PREFETCH);
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
        if ((err = fc_check_prefetch_range((uintptr_t)dptrs[i], sizes[i])) != CUDA_SUCCESS) break;
        CUdeviceptr first = (dptrs[i] + FAKECUDA_PAGE - 1) / FAKECUDA_PAGE * FAKECUDA_PAGE;
        CUdeviceptr end = (dptrs[i] + sizes[i]) / FAKECUDA_PAGE * FAKECUDA_PAGE;
        if (end > first) {
            pages[n] = first;
            lens[n] = end - first;
            unpopulated[n++] = FC_LOC_UNPOP;
        }
    }
    if (err == CUDA_SUCCESS && n > 0) err = prefetch_enqueue(pages, lens, unpopulated, n, s, NULL, FC_E_DISCARD);
    free(pages);
    return err;
}
FC_DEF(cuMemDiscardBatchAsync, 13000, (CUdeviceptr *dptrs, size_t *sizes, size_t count, unsigned long long flags,
        CUstream hStream),
       discard_batch(dptrs, sizes, count, flags, hStream, 0));
FC_DEF(cuMemDiscardBatchAsync_ptsz, 13000, (CUdeviceptr *dptrs, size_t *sizes, size_t count,
        unsigned long long flags, CUstream hStream),
       discard_batch(dptrs, sizes, count, flags, hStream, 1));

/* Advice is validated and accepted; of it the preferred location and read-mostly change the
 * model: the driver's fault-time prefetcher is off where a preferred location other than the
 * faulting device is set (migrate.c, block_prefetch_plan), and read-mostly pages are
 * duplicated on reads (migrate.c; cuda.h: the device argument is ignored for it). loc: the
 * advice's device or host. */
static CUresult advise(CUdeviceptr p, size_t n, CUmem_advise advice, int loc)
{
    if (advice < CU_MEM_ADVISE_SET_READ_MOSTLY || advice > CU_MEM_ADVISE_UNSET_ACCESSED_BY)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult err = fc_check_prefetch_range((uintptr_t)p, n);
    if (err == CUDA_SUCCESS && fc_is_pool_memory((uintptr_t)p))
        return CUDA_ERROR_NOT_SUPPORTED; /* the H100's driver 580 on a managed pool's memory (probes.managed) */
    if (err == CUDA_SUCCESS && advice == CU_MEM_ADVISE_SET_PREFERRED_LOCATION)
        fc_set_preferred_location((uintptr_t)p, n, loc);
    else if (err == CUDA_SUCCESS && advice == CU_MEM_ADVISE_UNSET_PREFERRED_LOCATION)
        fc_set_preferred_location((uintptr_t)p, n, FC_LOC_UNPOP);
    else if (err == CUDA_SUCCESS && (advice == CU_MEM_ADVISE_SET_READ_MOSTLY || advice == CU_MEM_ADVISE_UNSET_READ_MOSTLY))
        fc_set_read_mostly((uintptr_t)p, n, advice == CU_MEM_ADVISE_SET_READ_MOSTLY);
    return err;
}
FC_EXPORT CUresult cuMemAdvise(CUdeviceptr devPtr, size_t count, CUmem_advise advice, CUdevice device)
{
    FC_ENTRY(cuMemAdvise, 8000);
    if (device != CU_DEVICE_CPU && (device < 0 || device >= fc_cfg.ndevices)) return CUDA_ERROR_INVALID_DEVICE;
    return advise(devPtr, count, advice, device == CU_DEVICE_CPU ? FC_LOC_HOST : FC_LOC_DEV0 + device);
}
FC_ALIAS(cuMemAdvise);
FC_EXPORT CUresult cuMemAdvise_v2(CUdeviceptr devPtr, size_t count, CUmem_advise advice, CUmemLocation location)
{
    FC_ENTRY(cuMemAdvise_v2, 12020);
    CUresult err = CUDA_SUCCESS;
    int loc = loc_from_location(location, &err);
    if (loc < 0) return err;
    return advise(devPtr, count, advice, loc);
}
FC_ALIAS(cuMemAdvise_v2);
