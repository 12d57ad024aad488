/* prefetch_ranges.c: the driver calls that move ranges of managed memory
 * (see prefetch_ranges.h): one batch, or one call per range, and the ranges
 * the driver refused, never asked again.
 */
#include "capture_mode.h"
#include "prefetch_ranges.h"
#include "ranges.h"

PUMP_HIDDEN bool pump_call_ok(CUresult r, const char *what)
{
    if (PUMP_LIKELY(r == CUDA_SUCCESS))
        return true;
    PUMP_COUNT(errors, 1);
    pump_log(1, "%s failed (CUresult %d)", what, (int)r);
    return false;
}

/* ---- refused ranges ----
 * cuda.h 13.0 says a prefetched range "must refer to managed memory allocated via
 * cuMemAllocManaged or declared via __managed__": a managed pool's memory (the program's own,
 * from cuMemAllocFromPoolAsync, or the pool managed_all takes from) may be refused, and one such
 * range fails its whole batch. So does a range freed between pump's decision and its call. A
 * refused batch is therefore asked again range by range, once: each range the driver refuses
 * marks its allocation (ranges.h), which is never asked again, and batching goes on for the rest.
 * Only a batch that fails while every range of it is taken alone (the batch entry point itself
 * broken) counts towards turning batching off, after BATCH_FAILURES_MAX such batches in a row.
 *
 * A driver that prefetched a managed pool's memory may still refuse some of it later: an H200's
 * 580 driver took the probe managed_all makes of a device's pool, then refused 151 of the pool's
 * allocations in a GPT-2 run (bench/results/gpu-20261126-nvidia-h200), whose pages then reached
 * the GPU by faults, outside pump's budget. So a refusal of managed_all's pool memory is also
 * recorded for its device (pool_refusals): from then on managed_all makes that device's
 * stream-ordered allocations with cuMemAllocManaged instead (managed_all_cache.c reads it). */
#define BATCH_FAILURES_MAX 8
static uint32_t batch_failures; /* atomic: unexplained batch failures in a row */
static bool any_refused;        /* atomic: some allocation is marked; moves look for them */
/* Per device, atomic: the CUresult of the first refusal of managed_all's pool memory there
 * (CUDA_SUCCESS: none yet). */
static int pool_refusals[PUMP_DEVICES_MAX];

PUMP_HIDDEN CUresult pump_pool_refusal_of(int device)
{
    if (device < 0 || device >= PUMP_DEVICES_MAX)
        return CUDA_SUCCESS;
    return (CUresult)__atomic_load_n(&pool_refusals[device], __ATOMIC_ACQUIRE);
}

/* A refused allocation that is memory managed_all took from a device's managed pool tells that
 * device's pool apart from cuMemAllocManaged's memory from now on. */
static void note_pool_refusal(const struct pump_range *range, CUresult r)
{
    int device = __atomic_load_n(&range->device, __ATOMIC_RELAXED), none = CUDA_SUCCESS;
    if (pump_range_is_converted_pool(range) && device >= 0 && device < PUMP_DEVICES_MAX)
        __atomic_compare_exchange_n(&pool_refusals[device], &none, (int)r, false, __ATOMIC_RELEASE,
                                    __ATOMIC_RELAXED);
}

static CUresult move_one(CUstream stream, CUmemLocation to, CUdeviceptr ptr, size_t size)
{
    CUdevice device = to.type == CU_MEM_LOCATION_TYPE_DEVICE ? to.id : CU_DEVICE_CPU;
    PUMP_COUNT(prefetch_calls, 1);
    return pump_driver.prefetch_v2 != NULL ? pump_driver.prefetch_v2(ptr, size, to, 0, stream)
                                           : pump_driver.prefetch_v1(ptr, size, device, stream);
}

/* The allocation at ptr, if the table still has it there (lock-free: may be stale, which costs
 * at worst another allocation's prefetches, never a value). */
static struct pump_range *allocation_at(CUdeviceptr ptr)
{
    struct pump_range *range = pump_ranges_find(ptr);
    if (range == NULL)
        return NULL;
    uint64_t base = __atomic_load_n(&range->base, __ATOMIC_RELAXED);
    return ptr >= base && ptr - base < __atomic_load_n(&range->size, __ATOMIC_RELAXED) ? range : NULL;
}

/* Drops the ranges of allocations the driver refused before (counted): n left. */
static size_t without_refused(CUdeviceptr *ptrs, size_t *sizes, size_t n)
{
    if (!__atomic_load_n(&any_refused, __ATOMIC_RELAXED))
        return n;
    size_t kept = 0;
    for (size_t i = 0; i < n; i++) {
        struct pump_range *range = allocation_at(ptrs[i]);
        if (range != NULL && __atomic_load_n(&range->unprefetchable, __ATOMIC_RELAXED)) {
            PUMP_COUNT(prefetch_refused_skips, 1);
            continue;
        }
        ptrs[kept] = ptrs[i];
        sizes[kept++] = sizes[i];
    }
    return kept;
}

/* One call per range: false if any failed; each one refused marks its allocation. Refused is
 * CUDA_ERROR_INVALID_VALUE, what cuMemPrefetchAsync documents for a bad range; any other error
 * may be an earlier asynchronous one the call reports (cuda.h's \notefnerr), which says
 * nothing of the range. */
static bool move_each(CUstream stream, CUmemLocation to, const CUdeviceptr *ptrs, const size_t *sizes, size_t n,
                      size_t *refused)
{
    bool ok = true;
    for (size_t i = 0; i < n; i++) {
        /* The allocation asked about: one freed before the driver answers is refused for that,
         * and the memory may be another's by the time the answer is read (issue 42, risk 7). */
        struct pump_range *asked = allocation_at(ptrs[i]);
        uint64_t life = asked != NULL ? __atomic_load_n(&asked->life, __ATOMIC_RELAXED) : 0;
        CUresult r = move_one(stream, to, ptrs[i], sizes[i]);
        if (r == CUDA_SUCCESS)
            continue;
        ok = false;
        struct pump_range *range = r == CUDA_ERROR_INVALID_VALUE ? allocation_at(ptrs[i]) : NULL;
        if (range != asked || (range != NULL && __atomic_load_n(&range->life, __ATOMIC_RELAXED) != life))
            range = NULL;
        if (range == NULL) {  /* freed since the decision, or not about the range */
            if (r != CUDA_ERROR_INVALID_VALUE)
                pump_call_ok(r, "cuMemPrefetchAsync");
            continue;
        }
        (*refused)++;
        if (!__atomic_exchange_n(&range->unprefetchable, 1, __ATOMIC_RELAXED)) {
            PUMP_COUNT(prefetch_refusals, 1);
            note_pool_refusal(range, r);
        }
        __atomic_store_n(&any_refused, true, __ATOMIC_RELAXED);
        pump_log_once("the driver refused to prefetch an allocation (CUresult %d): pump no longer prefetches it, "
                      "and batches the rest (memory from a managed pool: see docs/limits.md)",
                      (int)r);
    }
    return ok;
}

/* ptrs and sizes are the move's own: compacted in place. */
PUMP_HIDDEN bool pump_move_ranges(CUstream stream, CUmemLocation to, CUdeviceptr *ptrs, size_t *sizes, size_t n)
{
    n = without_refused(ptrs, sizes, n);
    if (n == 0)
        return true;
    struct pump_capture_mode mode = pump_capture_relax();
    bool ok;
    if (pump_driver.prefetch_batch != NULL && __atomic_load_n(&batch_failures, __ATOMIC_RELAXED) < BATCH_FAILURES_MAX) {
        size_t first = 0, refused = 0;
        CUresult r = pump_driver.prefetch_batch(ptrs, sizes, n, &to, &first, 1, 0, stream);
        PUMP_COUNT(prefetch_calls, 1);
        ok = r == CUDA_SUCCESS || move_each(stream, to, ptrs, sizes, n, &refused);
        if (r == CUDA_SUCCESS || refused > 0) {
            __atomic_store_n(&batch_failures, 0, __ATOMIC_RELAXED);
        } else if (ok && __atomic_add_fetch(&batch_failures, 1, __ATOMIC_RELAXED) == BATCH_FAILURES_MAX) {
            PUMP_COUNT(errors, 1);
            pump_log_once("cuMemPrefetchBatchAsync failed %d times (CUresult %d) where each of its ranges alone was "
                          "taken: one call per range from now on",
                          BATCH_FAILURES_MAX, (int)r);
        }
    } else {
        size_t refused = 0;
        ok = move_each(stream, to, ptrs, sizes, n, &refused);
    }
    pump_capture_restore(&mode);
    return ok;
}
