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
 */
#include <pthread.h>

#include "prefetch.h"

#define PUMP_CONTEXTS_MAX 64
#define PUMP_EVENTS_PER_CONTEXT 64  /* recycled in turn; see record_and_wait */

struct prefetch_context {
    CUcontext ctx;       /* key: set (release) once the rest is ready */
    CUdevice device;
    bool usable;
    CUstream stream;
    CUevent events[PUMP_EVENTS_PER_CONTEXT];
    uint32_t next_event; /* atomic */
};

static struct prefetch_context contexts[PUMP_CONTEXTS_MAX];
static uint32_t context_count; /* atomic */
static pthread_mutex_t context_lock = PTHREAD_MUTEX_INITIALIZER;

PUMP_HIDDEN _Atomic uint32_t pump_epoch = 1;

PUMP_HIDDEN void pump_epoch_advance(void)
{
    atomic_fetch_add_explicit(&pump_epoch, 1, memory_order_relaxed);
    PUMP_COUNT(epochs, 1);
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

PUMP_HIDDEN void pump_prefetch_for_launch(CUstream stream, const struct pump_scan *scan)
{
    struct prefetch_context *c = current_context();
    if (c == NULL)
        return;
    uint32_t stamp = resident_stamp(c->device);
    CUdeviceptr ptrs[PUMP_SCAN_MAX_RANGES];
    size_t sizes[PUMP_SCAN_MAX_RANGES];
    struct pump_range *moving[PUMP_SCAN_MAX_RANGES];
    size_t n = 0;
    uint64_t bytes = 0;
    for (uint32_t i = 0; i < scan->found; i++) {
        struct pump_range *r = scan->range[i];
        if (stamp != 0 && __atomic_load_n(&r->resident_stamp, __ATOMIC_RELAXED) == stamp)
            continue;
        ptrs[n] = (CUdeviceptr)__atomic_load_n(&r->base, __ATOMIC_RELAXED);
        sizes[n] = (size_t)__atomic_load_n(&r->size, __ATOMIC_RELAXED);
        bytes += sizes[n];
        moving[n++] = r;
    }
    if (n < scan->found)
        PUMP_COUNT(resident_skips, scan->found - n);
    if (n == 0)
        return;

    /* Nothing is added to a stream being captured into a graph: it would
     * become part of the graph (or break the capture). */
    CUstreamCaptureStatus capture = CU_STREAM_CAPTURE_STATUS_NONE;
    if (pump_driver.stream_is_capturing(stream, &capture) != CUDA_SUCCESS ||
        capture != CU_STREAM_CAPTURE_STATUS_NONE) {
        PUMP_COUNT(launches_captured, 1);
        return;
    }
    CUstreamCaptureMode mode;
    bool relaxed = capture_mode_relax(&mode);
    bool ok = prefetch_ranges(c, ptrs, sizes, n);
    record_and_wait(c, stream);
    capture_mode_restore(relaxed, &mode);

    PUMP_COUNT(launches_prefetched, 1);
    PUMP_COUNT(prefetch_ranges, n);
    PUMP_COUNT(prefetch_bytes, bytes);
    if (ok)
        for (size_t i = 0; i < n; i++)
            __atomic_store_n(&moving[i]->resident_stamp, stamp, __ATOMIC_RELAXED);
}
