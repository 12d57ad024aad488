/* prefetch.c: the migration engine (see prefetch.h).
 *
 * Per context, created on first need: a non-blocking prefetch stream, so
 * prefetches overlap the kernels already queued and never serialise with the
 * legacy default stream; and a non-blocking eviction stream, so evictions
 * that must wait for their block's last user hold back only the prefetches
 * that need the room they make. A batch (cuMemPrefetchBatchAsync, CUDA 13)
 * moves many ranges in one call; older drivers get one call per range. The
 * launching thread never waits: every ordering is an event on the GPU.
 *
 * The context is the launch stream's (cuStreamGetCtx, remembered per thread:
 * context_cache.h), pushed for the while when another is current: a prefetch
 * goes to the launch stream's device, and
 * pump never creates or retains a context, so none appears on a device the
 * program did not use.
 *
 * Use events. After each kernel that may own blocks pump could evict, an
 * event from a per-context ring is recorded on the kernel's stream, and
 * evictions wait on it. A ring slot is reused by a later launch; before it is
 * re-recorded, the eviction stream waits on its previous record (one thread
 * at a time: a slot is busy from its taking to its record, so a slot's
 * records come in order). An eviction that then
 * waits on a reused slot waits for a later point, never an earlier one: the
 * eviction stream was already made to wait for every earlier record of it.
 *
 * Discard marks, a second ring of events per context, are discard_marks.c's.
 *
 * A context that goes (hooks_context.c) takes pump's streams and events with
 * it: its slot is marked gone and set up again, in place, at the context's
 * next use. Tokens and marks made before count as done: everything of a
 * destroyed context has ended.
 *
 * No lock of pump's is held across a driver call (a driver call may block for
 * milliseconds, and a context's set-up makes 67 of them): a slot is claimed
 * under context_lock, set up outside it and published under it again; a ring's
 * events are made, a use recorded and a discard made the same way around
 * use_lock, which guards only their bookkeeping. A thread that finds the work
 * being done by another goes without it this once (its launch is not
 * prefetched, its token or discard not made) rather than wait. A context that
 * goes meanwhile (its `forgets` moved on) keeps nothing that was made.
 */
#include <pthread.h>
#include <stddef.h>

#include "capture_mode.h"
#include "captures.h"
#include "channel.h"
#include "context_cache.h"
#include "devices.h"
#include "link_rate.h"
#include "locks.h"
#include "prefetch.h"
#include "prefetch_context.h"
#include "prefetch_ranges.h"
#include "prefetch_worker.h"
#include "ranges.h"

PUMP_HIDDEN struct pump_context pump_contexts[PUMP_CONTEXTS_MAX];
PUMP_HIDDEN uint32_t pump_context_count; /* atomic */
static pthread_mutex_t context_lock = PTHREAD_MUTEX_INITIALIZER;
static _Atomic uint64_t use_sequence; /* orders tokens of all contexts */

/* Creates n events (timing off): false at the first that cannot be made. */
static bool create_events(CUevent *events, int n)
{
    for (int i = 0; i < n; i++)
        if (!pump_call_ok(pump_driver.event_create(&events[i], CU_EVENT_DISABLE_TIMING), "cuEventCreate"))
            return false;
    return true;
}

/* The driver calls of a slot's set-up, made with no lock held. */
static void setup_context(struct pump_context *c, CUcontext ctx)
{
    struct pump_capture_mode mode = pump_capture_relax();
    bool pushed;
    bool entered = pump_context_push(ctx, &pushed);
    bool have_device = entered && pump_call_ok(pump_driver.ctx_get_device(&c->device), "cuCtxGetDevice");
    c->usable = have_device &&
                pump_call_ok(pump_driver.stream_create(&c->stream, CU_STREAM_NON_BLOCKING), "cuStreamCreate") &&
                pump_call_ok(pump_driver.stream_create(&c->evict_stream, CU_STREAM_NON_BLOCKING), "cuStreamCreate") &&
                create_events(&c->evicted, 1) && create_events(c->events, PUMP_EVENTS_PER_CONTEXT);
    pump_context_pop(pushed);
    pump_capture_restore(&mode);
    if (have_device)
        pump_channel_device(c->device);  /* pumpd learns which GPU this is */
    if (!c->usable)
        pump_log_once("no prefetch stream for a context: its launches are not prefetched");
}

/* Under context_lock: ctx's slot, claimed for setting up (*forgets: its count at the claim),
 * or with *ready when it was set up meanwhile; NULL when another thread is setting it up or
 * no slot is left. */
static struct pump_context *claim(CUcontext ctx, bool *ready, uint32_t *forgets)
{
    uint32_t n = __atomic_load_n(&pump_context_count, __ATOMIC_RELAXED);
    for (uint32_t i = 0; i < n; i++) {
        struct pump_context *c = &pump_contexts[i];
        if (c->key != ctx)
            continue;
        if (c->setting_up)
            return NULL;
        *ready = !__atomic_load_n(&c->gone, __ATOMIC_RELAXED);
        c->setting_up = !*ready;
        *forgets = __atomic_load_n(&c->forgets, __ATOMIC_RELAXED);
        return c;
    }
    if (n == PUMP_CONTEXTS_MAX)
        return NULL;
    struct pump_context *c = &pump_contexts[n];
    pthread_mutex_init(&c->use_lock, NULL);
    c->key = ctx;
    c->index = n;
    c->setting_up = true;
    *forgets = 0;
    __atomic_store_n(&pump_context_count, n + 1, __ATOMIC_RELEASE);
    return c;
}

PUMP_HIDDEN struct pump_context *pump_context_of(CUstream stream)
{
    CUcontext ctx = pump_stream_context(stream);  /* no driver call while nothing changed it */
    if (ctx == NULL)
        return NULL;
    uint32_t n = __atomic_load_n(&pump_context_count, __ATOMIC_ACQUIRE);
    for (uint32_t i = 0; i < n; i++)
        if (__atomic_load_n(&pump_contexts[i].ctx, __ATOMIC_ACQUIRE) == ctx && !__atomic_load_n(&pump_contexts[i].gone, __ATOMIC_ACQUIRE))
            return pump_contexts[i].usable ? &pump_contexts[i] : NULL;

    bool ready = false;
    uint32_t forgets = 0;
    pump_mutex_lock(&context_lock);
    struct pump_context *c = claim(ctx, &ready, &forgets);
    pump_mutex_unlock(&context_lock);
    if (c == NULL || ready)
        return c != NULL && c->usable ? c : NULL;
    setup_context(c, ctx);
    pump_mutex_lock(&context_lock);
    /* A context that went while it was set up is set up again at its next use. */
    bool gone = __atomic_load_n(&c->forgets, __ATOMIC_RELAXED) != forgets;
    __atomic_store_n(&c->gone, gone, __ATOMIC_RELEASE);
    __atomic_store_n(&c->ctx, ctx, __ATOMIC_RELEASE);
    c->setting_up = false;
    pump_mutex_unlock(&context_lock);
    return !gone && c->usable ? c : NULL;
}

PUMP_HIDDEN void pump_context_forget(CUcontext ctx)
{
    pump_mutex_lock(&context_lock);
    uint32_t n = __atomic_load_n(&pump_context_count, __ATOMIC_RELAXED);
    for (uint32_t i = 0; i < n; i++) {
        struct pump_context *c = &pump_contexts[i];
        if (c->key != ctx || (__atomic_load_n(&c->gone, __ATOMIC_RELAXED) && !c->setting_up))
            continue;
        /* Its events went with it: the rings are made again at their next use. What a
         * thread makes there meanwhile is dropped (forgets moved on). The count moves on
         * before the base is read, each sequentially consistent (pump_use_record). */
        pump_mutex_lock(&c->use_lock);
        c->use_ring.ready = c->use_ring.broken = c->mark_ring.ready = c->mark_ring.broken = false;
        c->peer_ring.ready = c->peer_ring.broken = false;
        __atomic_fetch_add(&c->forgets, 1, __ATOMIC_SEQ_CST);
        __atomic_store_n(&c->use_base, atomic_load_explicit(&use_sequence, memory_order_seq_cst), __ATOMIC_RELEASE);
        __atomic_store_n(&c->mark_base, c->mark_count, __ATOMIC_RELEASE);
        pump_mutex_unlock(&c->use_lock);
        __atomic_store_n(&c->gone, true, __ATOMIC_RELEASE);
    }
    pump_mutex_unlock(&context_lock);
}

PUMP_HIDDEN int pump_context_device(const struct pump_context *c)
{
    return c->device;
}

PUMP_HIDDEN int pump_context_device_of(CUcontext ctx)
{
    uint32_t n = __atomic_load_n(&pump_context_count, __ATOMIC_ACQUIRE);
    for (uint32_t i = 0; i < n; i++)
        if (pump_contexts[i].key == ctx && __atomic_load_n(&pump_contexts[i].usable, __ATOMIC_ACQUIRE))
            return pump_contexts[i].device;
    return -1;
}

PUMP_HIDDEN bool pump_context_live_on(int device)
{
    uint32_t n = __atomic_load_n(&pump_context_count, __ATOMIC_ACQUIRE);
    for (uint32_t i = 0; i < n; i++) {
        const struct pump_context *c = &pump_contexts[i];
        if (c->device == device && __atomic_load_n(&c->ctx, __ATOMIC_ACQUIRE) != NULL &&
            !__atomic_load_n(&c->gone, __ATOMIC_ACQUIRE))
            return true;
    }
    return false;
}

PUMP_HIDDEN bool pump_context_memory(struct pump_context *c, size_t *free_bytes, size_t *total_bytes)
{
    return pump_memory_info(__atomic_load_n(&c->ctx, __ATOMIC_ACQUIRE), free_bytes, total_bytes);
}

PUMP_HIDDEN bool pump_stream_capturing(CUstream stream)
{
    if (pump_captures_none())
        return false;  /* no capture is open: no call (captures.h) */
    CUstreamCaptureStatus capture = CU_STREAM_CAPTURE_STATUS_NONE;
    return pump_driver.stream_is_capturing(stream, &capture) != CUDA_SUCCESS ||
           capture != CU_STREAM_CAPTURE_STATUS_NONE;
}

PUMP_HIDDEN bool pump_prefetch_to_device(struct pump_context *c, CUdeviceptr *ptrs, size_t *sizes, size_t n,
                                         bool timeable)
{
    CUmemLocation to = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = c->device};
    uint64_t bytes = 0;
    for (size_t i = 0; i < n && timeable; i++)
        bytes += sizes[i];
    bool timed = timeable && pump_link_probe_begin(&c->link, c->key, __atomic_load_n(&c->forgets, __ATOMIC_RELAXED), c->stream,
                                       c->device, bytes);
    bool ok = pump_move_ranges(c->stream, to, ptrs, sizes, n);
    if (timed)
        pump_link_probe_end(&c->link, c->stream, ok);
    return ok;
}

PUMP_HIDDEN bool pump_evict_to_host(struct pump_context *c, CUdeviceptr *ptrs, size_t *sizes, size_t n)
{
    CUmemLocation to = {.type = CU_MEM_LOCATION_TYPE_HOST, .id = 0};
    return pump_move_ranges(c->evict_stream, to, ptrs, sizes, n);
}

/* Makes `stream` wait (on the GPU) for the event's latest record. */
PUMP_HIDDEN void pump_stream_wait(CUstream stream, CUevent event)
{
    struct pump_capture_mode mode = pump_capture_relax();
    pump_call_ok(pump_driver.stream_wait_event(stream, event, 0), "cuStreamWaitEvent");
    pump_capture_restore(&mode);
}

/* Creates a ring's events in c's context: a ring's first user may be pump's worker, on which
 * no context is current, and cuEventCreate makes its event in the calling thread's current
 * context (CUDA_ERROR_INVALID_CONTEXT without one: the ring was then broken for good). */
PUMP_HIDDEN bool pump_events_create_in(struct pump_context *c, CUevent *events, int n)
{
    struct pump_capture_mode mode = pump_capture_relax();
    bool pushed, made = pump_context_push(c->key, &pushed) && create_events(events, n);
    pump_context_pop(pushed);
    pump_capture_restore(&mode);
    return made;
}

/* Whether a ring's objects are made, making them at its first use: false, for good, when
 * they cannot be made (logged once per context), and this once while another thread makes
 * them. Called, and returns, with use_lock held; lets it go while the driver makes them. */
PUMP_HIDDEN bool pump_ring_ready(struct pump_context *c, struct ring *r, pump_ring_maker make, const char *without)
{
    if (r->ready || r->broken || r->making)
        return r->ready;
    r->making = true;
    uint32_t forgets = __atomic_load_n(&c->forgets, __ATOMIC_RELAXED);
    pump_mutex_unlock(&c->use_lock);
    bool made = make(c);
    pump_mutex_lock(&c->use_lock);
    r->making = false;
    if (__atomic_load_n(&c->forgets, __ATOMIC_RELAXED) != forgets)
        return false;  /* made in a context that went: made again at the next use */
    r->ready = made;
    r->broken = !made;
    if (!made)
        pump_log(1, "cannot create %s", without);
    return made;
}

/* Events are recycled round-robin, recorded on the prefetch stream only; if a slot is
 * re-recorded by another thread before this wait is enqueued, the wait covers a later prefetch
 * instead, which only makes the kernel wait longer, never shorter than the prefetch stream's
 * order implies. */
PUMP_HIDDEN void pump_prefetch_wait(struct pump_context *c, CUstream stream)
{
    uint32_t slot = __atomic_fetch_add(&c->next_event, 1, __ATOMIC_RELAXED) % PUMP_EVENTS_PER_CONTEXT;
    struct pump_capture_mode mode = pump_capture_relax();
    if (pump_call_ok(pump_driver.event_record(c->events[slot], c->stream), "cuEventRecord") && pump_config.wait)
        pump_call_ok(pump_driver.stream_wait_event(stream, c->events[slot], 0), "cuStreamWaitEvent");
    pump_capture_restore(&mode);
}

/* Makes `stream` wait for everything enqueued so far on `pumps`, one of pump's streams whose own
 * event `event` is (recorded there and nowhere else): another thread's record meanwhile is a
 * later point of the same stream, so the wait is longer, never shorter. */
static void wait_for_stream(CUstream stream, CUstream pumps, CUevent event)
{
    struct pump_capture_mode mode = pump_capture_relax();
    if (pump_call_ok(pump_driver.event_record(event, pumps), "cuEventRecord"))
        pump_call_ok(pump_driver.stream_wait_event(stream, event, 0), "cuStreamWaitEvent");
    pump_capture_restore(&mode);
}

PUMP_HIDDEN void pump_populate_wait(struct pump_context *c, CUstream stream)
{
    if (pump_config.wait)
        wait_for_stream(stream, c->populate_stream, c->populated);
}

PUMP_HIDDEN void pump_evictions_wait(struct pump_context *c, CUstream stream)
{
    wait_for_stream(stream, c->evict_stream, c->evicted);
}

PUMP_HIDDEN void pump_prefetch_after_evictions(struct pump_context *c)
{
    pump_evictions_wait(c, c->stream);
}

/* Tokens: the sequence number (for "which use is later"), the ring slot and
 * the context's index + 1 (never 0). */
#define TOKEN_SLOT_SHIFT 8

static bool make_use_events(struct pump_context *c)
{
    return pump_events_create_in(c, c->use_events, PUMP_USE_EVENTS);
}

static bool use_events_ready(struct pump_context *c)
{
    return pump_ring_ready(c, &c->use_ring, make_use_events, "use events: evictions wait for the launching stream instead");
}

/* ---- use slots readied by pump's worker (prefetch_worker.h) ----
 * Before a use slot is recorded again, the eviction stream waits on its previous record
 * (pump_use_record). pump's worker makes those waits ahead, for the uses to come, so that the
 * launching thread records without one; a slot a launch takes first is left to it (it waits
 * itself, as without a worker). Nothing has to follow these waits: an unordered job. */
#define PREPARE_AHEAD 128  /* uses readied ahead of the count */
#define PREPARE_BATCH 32   /* waits per job: a job is short */

static struct pump_context *preparing(struct pump_job *job)
{
    return (struct pump_context *)((char *)job - offsetof(struct pump_context, use_prepare));
}

static void prepare_calls(struct pump_job *job)
{
    struct pump_context *c = preparing(job);
    for (int n = 0; n < PREPARE_BATCH; n++) {
        pump_mutex_lock(&c->use_lock);
        uint64_t count = c->use_prepared > c->use_count ? c->use_prepared : c->use_count;
        uint32_t slot = (uint32_t)(count % PUMP_USE_EVENTS);
        bool take = c->use_ring.ready && count < c->use_count + PREPARE_AHEAD &&
                    __atomic_load_n(&c->use_busy[slot], __ATOMIC_ACQUIRE) == USE_FREE;
        if (take && count < PUMP_USE_EVENTS) {  /* a first record needs no wait */
            c->use_prepared = count + 1;
            pump_mutex_unlock(&c->use_lock);
            continue;
        }
        if (take)
            __atomic_store_n(&c->use_busy[slot], USE_READYING, __ATOMIC_RELAXED);
        /* Read only from a ring made: while another thread makes it (pump_ring_ready, the lock
         * let go) its slots are being written. */
        CUevent event = take ? c->use_events[slot] : NULL;
        uint32_t forgets = __atomic_load_n(&c->forgets, __ATOMIC_RELAXED);
        pump_mutex_unlock(&c->use_lock);
        if (!take)
            return;
        struct pump_capture_mode mode = pump_capture_relax();
        bool waited = pump_call_ok(pump_driver.stream_wait_event(c->evict_stream, event, 0), "cuStreamWaitEvent");
        pump_capture_restore(&mode);
        pump_mutex_lock(&c->use_lock);
        /* A launch that took the use meanwhile waited itself (and owns the slot now). */
        bool untaken = c->use_count <= count;
        if (waited && untaken && __atomic_load_n(&c->forgets, __ATOMIC_RELAXED) == forgets && c->use_prepared <= count)
            c->use_prepared = count + 1;
        if (untaken)
            __atomic_store_n(&c->use_busy[slot], USE_FREE, __ATOMIC_RELEASE);
        pump_mutex_unlock(&c->use_lock);
        if (!waited)
            return;
    }
}

/* made false: dropped in a forked child, whose one thread takes no lock of the parent's. */
static void prepare_finish(struct pump_job *job, bool made)
{
    struct pump_context *c = preparing(job);
    if (made)
        pump_mutex_lock(&c->use_lock);
    c->use_preparing = false;
    if (made)
        pump_mutex_unlock(&c->use_lock);
}

/* Under use_lock, after use `count` was taken: whether to hand the worker a prepare job now
 * (claimed: make it with prepare_submit once the lock is left). */
static bool prepare_due(struct pump_context *c, uint64_t count)
{
    bool due = pump_config.worker && !c->use_preparing && !c->use_prepare_off &&
               count + PREPARE_AHEAD >= PUMP_USE_EVENTS && count + PREPARE_AHEAD / 2 >= c->use_prepared;
    c->use_preparing = c->use_preparing || due;
    return due;
}

static void prepare_submit(struct pump_context *c)
{
    c->use_prepare = (struct pump_job){.unordered = true, .calls = prepare_calls, .finish = prepare_finish};
    if (pump_worker_submit(c->device, &c->use_prepare))
        return;
    pump_mutex_lock(&c->use_lock);
    c->use_preparing = false;
    c->use_prepare_off = true;
    pump_mutex_unlock(&c->use_lock);
}

/* A slot is taken under use_lock and waited on (unless pump's worker did) and recorded
 * outside it. A slot still being recorded from its previous turn (1,024 uses ago) is not
 * taken: no token this once. A failed wait or
 * record leaves the slot's last record the one the eviction stream already waited on, or the
 * one the next taker waits on first. */
PUMP_HIDDEN uint64_t pump_use_record(struct pump_context *c, CUstream stream)
{
    pump_mutex_lock(&c->use_lock);
    bool ready = use_events_ready(c);  /* may let the lock go meanwhile */
    uint64_t count = c->use_count;
    uint32_t slot = (uint32_t)(count % PUMP_USE_EVENTS);
    /* A slot the worker is readying is taken all the same: a use without a token would let an
     * eviction pass its kernel. The worker's wait then lands on either record: never earlier. */
    bool taken = ready && __atomic_load_n(&c->use_busy[slot], __ATOMIC_ACQUIRE) != USE_RECORDING;
    if (taken) {
        __atomic_store_n(&c->use_busy[slot], USE_RECORDING, __ATOMIC_SEQ_CST);  /* pump_use_wait reads it */
        c->use_count = count + 1;
    }
    bool prepared = count < c->use_prepared, prepare = taken && prepare_due(c, count);
    CUevent event = taken ? c->use_events[slot] : NULL;  /* a ring being made is being written */
    uint32_t forgets = __atomic_load_n(&c->forgets, __ATOMIC_RELAXED);
    pump_mutex_unlock(&c->use_lock);
    if (prepare)
        prepare_submit(c);
    if (!taken)
        return 0;
    uint64_t token = 0;
    struct pump_capture_mode mode = pump_capture_relax();
    if (prepared && count >= PUMP_USE_EVENTS)
        PUMP_COUNT(use_waits_readied, 1);
    bool reusable = count < PUMP_USE_EVENTS || prepared ||
                    pump_call_ok(pump_driver.stream_wait_event(c->evict_stream, event, 0), "cuStreamWaitEvent");
    if (reusable && pump_call_ok(pump_driver.event_record(event, stream), "cuEventRecord")) {
        uint64_t sequence = atomic_fetch_add_explicit(&use_sequence, 1, memory_order_seq_cst) + 1;
        /* A context that went meanwhile: either its base covers this sequence, or this sees it. */
        if (__atomic_load_n(&c->forgets, __ATOMIC_SEQ_CST) == forgets)
            token = sequence << PUMP_USE_SEQUENCE_SHIFT | (uint64_t)slot << TOKEN_SLOT_SHIFT | (c->index + 1);
        __atomic_store_n(&c->use_recorded[slot], sequence, __ATOMIC_SEQ_CST);
    }
    pump_capture_restore(&mode);
    __atomic_store_n(&c->use_busy[slot], USE_FREE, __ATOMIC_SEQ_CST);
    return token;
}

/* Whether the slot's event still holds the record of `sequence`: not being recorded again, and
 * recorded last for it. */
static bool use_slot_holds(struct pump_context *c, uint32_t slot, uint64_t sequence)
{
    return __atomic_load_n(&c->use_busy[slot], __ATOMIC_SEQ_CST) != USE_RECORDING &&
           __atomic_load_n(&c->use_recorded[slot], __ATOMIC_SEQ_CST) == sequence;
}

/* A token's context, slot and sequence: true when it names a point still to be asked about;
 * false when it names none (*user NULL) or one from before its context went (done). */
static bool token_point(uint64_t token, struct pump_context **user, uint32_t *slot, uint64_t *sequence)
{
    uint32_t index = (uint32_t)(token & 0xff);
    *user = NULL;
    if (index == 0 || index > __atomic_load_n(&pump_context_count, __ATOMIC_ACQUIRE))
        return false;
    *user = &pump_contexts[index - 1];
    *sequence = token >> PUMP_USE_SEQUENCE_SHIFT;
    *slot = (uint32_t)(token >> TOKEN_SLOT_SHIFT) & (PUMP_USE_EVENTS - 1);
    return *sequence > __atomic_load_n(&(*user)->use_base, __ATOMIC_ACQUIRE);
}

PUMP_HIDDEN void pump_use_wait(CUstream stream, uint64_t token)
{
    struct pump_context *user;
    uint32_t slot;
    uint64_t sequence;
    if (!token_point(token, &user, &slot, &sequence))
        return; /* none, or from before its context went: done */
    if (use_slot_holds(user, slot, sequence)) {
        pump_stream_wait(stream, user->use_events[slot]);
        if (use_slot_holds(user, slot, sequence))
            return;  /* not recorded again before the wait: it named the token's point */
    }
    /* The slot was recorded again since the token (1,024 uses later), maybe on another stream:
     * its event names a point unrelated to the token's. Before that record the eviction stream
     * waited for the slot's previous one (pump_use_record), the token's or a later point of it,
     * so everything enqueued on the eviction stream from now on comes after the token's use. */
    PUMP_COUNT(use_waits_recycled, 1);
    pump_evictions_wait(user, stream);
}

PUMP_HIDDEN enum pump_use_state pump_use_passed(uint64_t token)
{
    struct pump_context *user;
    uint32_t slot;
    uint64_t sequence;
    if (!token_point(token, &user, &slot, &sequence))
        return user == NULL ? PUMP_USE_UNKNOWN : PUMP_USE_PASSED; /* passed: from before its context went */
    if (!use_slot_holds(user, slot, sequence) || pump_driver.event_query == NULL)
        return PUMP_USE_UNKNOWN;
    struct pump_capture_mode mode = pump_capture_relax();
    CUresult r = pump_driver.event_query(user->use_events[slot]);
    pump_capture_restore(&mode);
    if (!use_slot_holds(user, slot, sequence))
        return PUMP_USE_UNKNOWN;  /* recorded again meanwhile: the answer may be the new record's */
    return r == CUDA_SUCCESS ? PUMP_USE_PASSED : r == CUDA_ERROR_NOT_READY ? PUMP_USE_AHEAD : PUMP_USE_UNKNOWN;
}

PUMP_HIDDEN void pump_evict_after(struct pump_context *c, uint64_t token)
{
    pump_use_wait(c->evict_stream, token);
}

PUMP_HIDDEN uint64_t pump_prefetch_record(struct pump_context *c)
{
    return pump_use_record(c, c->stream);
}
