/* prefetch.c: the prefetch engine (see prefetch.h).
 *
 * One non-blocking prefetch stream per context, created on first need, so
 * prefetches overlap the kernels already queued and never serialise with the
 * legacy default stream. A batch (cuMemPrefetchBatchAsync, CUDA 13) moves all
 * of a launch's allocations in one call; older drivers get one call per
 * range. The kernel's stream waits on an event recorded after the batch, so
 * the kernel starts once its data is there; the launching thread never waits.
 *
 * Residency cannot be asked of the driver and the driver evicts silently, so
 * pump keeps a belief per allocation: "prefetched to device d in epoch e".
 * It expires when the epoch moves (any synchronisation, after which the host
 * may touch memory; and every PUMP_EPOCH_LAUNCHES managed launches), so a
 * CPU touch or an eviction costs at most one epoch of faults, and a resident
 * allocation is not prefetched again on every launch.
 *
 * The budget (the daemon's plan's budget_bytes, else PUMP_BUDGET) caps the
 * bytes prefetched to one device per epoch: each device has an accumulator
 * of the bytes sent to it, tagged with the epoch it counts for; ranges that
 * would take it past the budget are not prefetched (the kernel faults them
 * in, as without pump). The same accumulators are what `resident_bytes`
 * reports. Frees do not lower them: the belief only ever over-counts, and
 * only until the epoch ends.
 */
#include <pthread.h>

#include "channel.h"
#include "prefetch.h"

#define PUMP_CONTEXTS_MAX 64
#define PUMP_EVENTS_PER_CONTEXT 64  /* recycled in turn; see record_and_wait */

struct prefetch_context {
    CUcontext ctx;       /* key: set (release) once the rest is ready */
    CUdevice device;
    bool usable;
    CUstream stream;
    uint64_t budget;     /* PUMP_BUDGET for this device, in bytes; 0: none */
    CUevent events[PUMP_EVENTS_PER_CONTEXT];
    uint32_t next_event; /* atomic */
};

static struct prefetch_context contexts[PUMP_CONTEXTS_MAX];
static uint32_t context_count; /* atomic */
static pthread_mutex_t context_lock = PTHREAD_MUTEX_INITIALIZER;

PUMP_HIDDEN _Atomic uint32_t pump_epoch = 1;

/* Per device: (epoch & 0xffff) << 48 | bytes prefetched to it in that epoch. */
#define PUMP_BUDGET_DEVICES 64
#define USAGE_BYTES ((1ull << 48) - 1)
static uint64_t device_usage[PUMP_BUDGET_DEVICES];
static uint32_t devices_seen; /* atomic: 1 + the highest device ordinal prefetched to */

PUMP_HIDDEN uint32_t pump_epoch_advance(void)
{
    uint32_t epoch = atomic_fetch_add_explicit(&pump_epoch, 1, memory_order_relaxed) + 1;
    PUMP_COUNT(epochs, 1);
    PUMP_SET(resident_bytes, 0);
    return epoch;
}

/* The belief stamp of "resident on device in the current epoch"; 0 (never
 * believed) for devices past what the stamp can name. */
static uint32_t resident_stamp(CUdevice device)
{
    if (device < 0 || device >= 15)
        return 0;
    return (atomic_load_explicit(&pump_epoch, memory_order_relaxed) << 4) | (uint32_t)(device + 1);
}

static bool call_ok(CUresult r, const char *what)
{
    if (PUMP_LIKELY(r == CUDA_SUCCESS))
        return true;
    PUMP_COUNT(errors, 1);
    pump_log(1, "%s failed (CUresult %d)", what, (int)r);
    return false;
}

/* pump's own driver calls must not trip a global-mode capture elsewhere:
 * they run in relaxed capture mode (restore with capture_mode_restore). */
static bool capture_mode_relax(CUstreamCaptureMode *mode)
{
    *mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    return pump_driver.exchange_capture_mode != NULL && pump_driver.exchange_capture_mode(mode) == CUDA_SUCCESS;
}

static void capture_mode_restore(bool relaxed, CUstreamCaptureMode *mode)
{
    if (relaxed)
        pump_driver.exchange_capture_mode(mode);
}

static void setup_context(struct prefetch_context *c, CUcontext ctx)
{
    CUstreamCaptureMode mode;
    bool relaxed = capture_mode_relax(&mode);
    c->usable = call_ok(pump_driver.ctx_get_device(&c->device), "cuCtxGetDevice") &&
                call_ok(pump_driver.stream_create(&c->stream, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
    for (int i = 0; c->usable && i < PUMP_EVENTS_PER_CONTEXT; i++)
        c->usable = call_ok(pump_driver.event_create(&c->events[i], CU_EVENT_DISABLE_TIMING), "cuEventCreate");
    capture_mode_restore(relaxed, &mode);
    c->budget = 0;
    size_t free_bytes = 0, total_bytes = 0;
    if (pump_config.budget_kind == PUMP_CAP_BYTES)
        c->budget = pump_config.budget_value;
    else if (pump_config.budget_kind == PUMP_CAP_PERCENT && pump_driver.mem_get_info != NULL &&
             pump_driver.mem_get_info(&free_bytes, &total_bytes) == CUDA_SUCCESS)
        c->budget = (uint64_t)total_bytes / 100 * pump_config.budget_value +
                    (uint64_t)total_bytes % 100 * pump_config.budget_value / 100;
    else if (pump_config.budget_kind == PUMP_CAP_PERCENT)
        pump_log_once("cannot read the device's memory: no budget");
    if (c->budget != 0 && pump_channel_plan_budget() == 0)
        PUMP_SET(budget_bytes, c->budget);
    if (!c->usable)
        pump_log_once("no prefetch stream for a context: its launches are not prefetched");
    __atomic_store_n(&c->ctx, ctx, __ATOMIC_RELEASE);
}

/* The calling thread's current context's prefetch state, or NULL. */
static struct prefetch_context *current_context(void)
{
    CUcontext ctx = NULL;
    if (pump_driver.ctx_get_current(&ctx) != CUDA_SUCCESS || ctx == NULL)
        return NULL;
    uint32_t n = __atomic_load_n(&context_count, __ATOMIC_ACQUIRE);
    for (uint32_t i = 0; i < n; i++)
        if (__atomic_load_n(&contexts[i].ctx, __ATOMIC_ACQUIRE) == ctx)
            return contexts[i].usable ? &contexts[i] : NULL;

    struct prefetch_context *found = NULL;
    pthread_mutex_lock(&context_lock);
    n = __atomic_load_n(&context_count, __ATOMIC_RELAXED);
    for (uint32_t i = 0; i < n && found == NULL; i++)
        if (__atomic_load_n(&contexts[i].ctx, __ATOMIC_RELAXED) == ctx)
            found = &contexts[i];
    if (found == NULL && n < PUMP_CONTEXTS_MAX) {
        found = &contexts[n];
        setup_context(found, ctx);
        __atomic_store_n(&context_count, n + 1, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&context_lock);
    return found != NULL && found->usable ? found : NULL;
}

static bool batch_broken; /* atomic: the driver refused a batch once */

static bool prefetch_ranges(struct prefetch_context *c, CUdeviceptr *ptrs, size_t *sizes, size_t n)
{
    CUmemLocation to = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = c->device};
    if (pump_driver.prefetch_batch != NULL && !__atomic_load_n(&batch_broken, __ATOMIC_RELAXED)) {
        size_t first = 0;
        CUresult r = pump_driver.prefetch_batch(ptrs, sizes, n, &to, &first, 1, 0, c->stream);
        if (r == CUDA_SUCCESS) {
            PUMP_COUNT(prefetch_calls, 1);
            return true;
        }
        __atomic_store_n(&batch_broken, true, __ATOMIC_RELAXED);
        PUMP_COUNT(errors, 1);
        pump_log_once("cuMemPrefetchBatchAsync failed (CUresult %d): one call per range from now on", (int)r);
    }
    bool ok = true;
    for (size_t i = 0; i < n; i++) {
        CUresult r = pump_driver.prefetch_v2 != NULL
                         ? pump_driver.prefetch_v2(ptrs[i], sizes[i], to, 0, c->stream)
                         : pump_driver.prefetch_v1(ptrs[i], sizes[i], c->device, c->stream);
        ok = call_ok(r, "cuMemPrefetchAsync") && ok;
        PUMP_COUNT(prefetch_calls, 1);
    }
    return ok;
}

/* Orders `stream` after everything enqueued so far on the prefetch stream.
 * Events are recycled round-robin; if a slot is re-recorded by another
 * thread before this wait is enqueued, the wait covers a later prefetch
 * instead, which only makes the kernel wait longer, never shorter than the
 * prefetch stream's order implies. */
static void record_and_wait(struct prefetch_context *c, CUstream stream)
{
    uint32_t slot = __atomic_fetch_add(&c->next_event, 1, __ATOMIC_RELAXED) % PUMP_EVENTS_PER_CONTEXT;
    if (call_ok(pump_driver.event_record(c->events[slot], c->stream), "cuEventRecord") && pump_config.wait)
        call_ok(pump_driver.stream_wait_event(stream, c->events[slot], 0), "cuStreamWaitEvent");
}

/* The budget in force for c's device: the plan's, else PUMP_BUDGET's. */
static uint64_t budget_for(const struct prefetch_context *c)
{
    uint64_t budget = pump_channel_plan_budget();
    if (budget == 0)
        budget = c->budget;
    struct pump_stats *record = atomic_load_explicit(&pump_stats_record, memory_order_relaxed);
    if (__atomic_load_n(&record->budget_bytes, __ATOMIC_RELAXED) != budget)
        PUMP_SET(budget_bytes, budget);
    return budget;
}

/* Takes the ranges that fit the device's budget this epoch: returns a mask
 * of the kept ones (n <= 64) and counts their bytes in the accumulator. */
static uint64_t within_budget(const struct prefetch_context *c, uint32_t epoch, const size_t *sizes, size_t n)
{
    uint64_t all = n == 64 ? ~0ull : (1ull << n) - 1;
    if (c->device < 0 || c->device >= PUMP_BUDGET_DEVICES)
        return all;
    uint64_t budget = budget_for(c);
    uint64_t *usage = &device_usage[c->device];
    uint64_t tag = (uint64_t)(epoch & 0xffff) << 48;
    uint64_t old = __atomic_load_n(usage, __ATOMIC_RELAXED), keep, used;
    do {
        used = (old & ~USAGE_BYTES) == tag ? old & USAGE_BYTES : 0;
        keep = 0;
        for (size_t i = 0; i < n; i++) {
            if (budget != 0 && (sizes[i] > budget || used + sizes[i] > budget))
                continue;
            used += sizes[i];
            keep |= 1ull << i;
        }
        if (used > USAGE_BYTES)
            used = USAGE_BYTES;
    } while (!__atomic_compare_exchange_n(usage, &old, tag | used, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED));

    uint32_t seen = __atomic_load_n(&devices_seen, __ATOMIC_RELAXED);
    while ((uint32_t)c->device >= seen &&
           !__atomic_compare_exchange_n(&devices_seen, &seen, (uint32_t)c->device + 1, true, __ATOMIC_RELAXED,
                                        __ATOMIC_RELAXED)) {
    }
    uint64_t resident = 0;
    for (uint32_t d = 0; d < __atomic_load_n(&devices_seen, __ATOMIC_RELAXED); d++) {
        uint64_t u = __atomic_load_n(&device_usage[d], __ATOMIC_RELAXED);
        if ((u & ~USAGE_BYTES) == tag)
            resident += u & USAGE_BYTES;
    }
    PUMP_SET(resident_bytes, resident);
    if (keep != all)
        PUMP_COUNT(budget_skips, (uint64_t)(n - (size_t)__builtin_popcountll(keep)));
    return keep;
}

PUMP_HIDDEN int pump_prefetch_for_launch(CUstream stream, const struct pump_scan *scan)
{
    struct prefetch_context *c = current_context();
    if (c == NULL)
        return -1;
    uint32_t epoch = atomic_load_explicit(&pump_epoch, memory_order_relaxed);
    uint32_t stamp = resident_stamp(c->device);
    CUdeviceptr ptrs[PUMP_SCAN_MAX_RANGES];
    size_t sizes[PUMP_SCAN_MAX_RANGES];
    struct pump_range *moving[PUMP_SCAN_MAX_RANGES];
    bool planned[PUMP_SCAN_MAX_RANGES];
    size_t n = 0;
    for (uint32_t i = 0; i < scan->found; i++) {
        struct pump_range *r = scan->range[i];
        if (stamp != 0 && __atomic_load_n(&r->resident_stamp, __ATOMIC_RELAXED) == stamp)
            continue;
        ptrs[n] = (CUdeviceptr)__atomic_load_n(&r->base, __ATOMIC_RELAXED);
        sizes[n] = (size_t)__atomic_load_n(&r->size, __ATOMIC_RELAXED);
        planned[n] = i >= scan->own;
        moving[n++] = r;
    }
    if (n < scan->found)
        PUMP_COUNT(resident_skips, scan->found - n);
    if (n == 0)
        return c->device;

    /* Nothing is added to a stream being captured into a graph: it would
     * become part of the graph (or break the capture). */
    CUstreamCaptureStatus capture = CU_STREAM_CAPTURE_STATUS_NONE;
    if (pump_driver.stream_is_capturing(stream, &capture) != CUDA_SUCCESS ||
        capture != CU_STREAM_CAPTURE_STATUS_NONE) {
        PUMP_COUNT(launches_captured, 1);
        return c->device;
    }

    uint64_t keep = within_budget(c, epoch, sizes, n);
    size_t kept = 0, from_plan = 0;
    uint64_t bytes = 0;
    for (size_t i = 0; i < n; i++) {
        if (!(keep & (1ull << i)))
            continue;
        ptrs[kept] = ptrs[i];
        sizes[kept] = sizes[i];
        moving[kept++] = moving[i];
        bytes += sizes[i];
        from_plan += planned[i];
    }
    n = kept;
    if (n == 0)
        return c->device;

    CUstreamCaptureMode mode;
    bool relaxed = capture_mode_relax(&mode);
    bool ok = prefetch_ranges(c, ptrs, sizes, n);
    record_and_wait(c, stream);
    capture_mode_restore(relaxed, &mode);

    PUMP_COUNT(launches_prefetched, 1);
    PUMP_COUNT(prefetch_ranges, n);
    PUMP_COUNT(prefetch_bytes, bytes);
    if (from_plan > 0)
        PUMP_COUNT(plan_prefetch_ranges, from_plan);
    if (ok)
        for (size_t i = 0; i < n; i++)
            __atomic_store_n(&moving[i]->resident_stamp, stamp, __ATOMIC_RELAXED);
    return c->device;
}
