/* discard_marks.c: memory discarded when it dies, and the marks that order pump's moves of it
 * after the discard (see discard_marks.h).
 *
 * A discard is undefined behaviour if anything else touches the memory meanwhile ("any reads,
 * writes or prefetches ... that occur simultaneously with the discard operation result in
 * undefined behavior", cuda.h), and a stream-ordered pool hands the memory out again at once:
 * a prefetch of the new owner, on pump's own stream, would race the discard queued on the
 * freeing stream. So each discard is followed by a mark, an event from a per-context ring (the
 * context's slot: prefetch_context.h), that pump's moves of the memory wait for. A mark's slot
 * is recorded again only once its event is done (else the next dead tensor is not discarded),
 * so a mark names its discard until that has run, and a reused slot means it has. Marks from
 * before a context went count as done. No lock is held across a driver call: a discard's slot
 * is taken under use_lock, the driver asked outside it, the mark published under it again.
 * Which blocks are discarded, and that no move of pump's is under way on them, is the
 * residency's (pump_residency_discard).
 *
 * The discard is asked for only once its stream has drained (drained): the driver's discard is
 * not ordered before the work queued behind it on a busy stream. On the H200 (driver 580) a
 * discard asked for behind 200 kernels, then a memset and a move to the host on the same stream,
 * lost every element the memset wrote, in 5 rounds of 5; on a stream that waited for an event
 * recorded after it, nothing was lost (bench/gpu/probes/discard_late.py). Case c's launch rule
 * discarding on busy streams computed another loss in every run; waiting for the stream first, it
 * was bit-identical in 7 processes, and 1.49x faster than not discarding over 3 processes of 10
 * steps (bench/results/gpu-20261127-nvidia-h200/discard-variants). Work another thread queues on
 * the stream between the drain and the discard is not held off (PyTorch's main and autograd
 * threads take turns on a stream, and launch little at once: docs/limits.md).
 *
 * The legacy stream, where the driver refuses a discard, gets one on a stream of pump's made
 * to wait for the legacy stream's work so far and waited for by its work to come, both by
 * events: an order of its own making, not the legacy stream's implicit synchronisation, which
 * no documentation promises for a discard (the first H100 run that discarded there computed
 * another loss: bench/results/gpu-20261126-nvidia-h100-80gb-hbm3).
 */
#include "capture_mode.h"
#include "captures.h"
#include "channel.h"
#include "devices.h"
#include "discard_marks.h"
#include "locks.h"
#include "prefetch.h"
#include "prefetch_context.h"
#include "prefetch_ranges.h"
#include "ranges.h"

#include <time.h>

/* Marks: the mark's sequence number << 8 | the context's index + 1 (never 0). */
#define MARK_SEQUENCE_SHIFT 8

static bool make_marks(struct pump_context *c)
{
    return pump_events_create_in(c, c->marks, PUMP_DISCARD_MARKS);
}

static bool marks_ready(struct pump_context *c)
{
    return pump_ring_ready(c, &c->mark_ring, make_marks, "discard marks: dead tensors are not discarded");
}

/* The legacy peer is made in c's context: a stream belongs to the context current when it is
 * made, and the freeing thread may have none, or another. */
static bool make_legacy_peer(struct pump_context *c)
{
    struct pump_capture_mode mode = pump_capture_relax();
    bool pushed, made = pump_context_push(c->key, &pushed) &&
                        pump_call_ok(pump_driver.stream_create(&c->legacy_peer, CU_STREAM_NON_BLOCKING),
                                     "cuStreamCreate") &&
                        pump_call_ok(pump_driver.event_create(&c->legacy_reached, CU_EVENT_DISABLE_TIMING),
                                     "cuEventCreate") &&
                        pump_call_ok(pump_driver.stream_create(&c->populate_stream, CU_STREAM_NON_BLOCKING),
                                     "cuStreamCreate") &&
                        pump_call_ok(pump_driver.event_create(&c->populated, CU_EVENT_DISABLE_TIMING),
                                     "cuEventCreate");
    pump_context_pop(pushed);
    pump_capture_restore(&mode);
    return made;
}

/* c's legacy peer stream (prefetch_context.h), or NULL: not makeable, or being made. */
static CUstream legacy_peer(struct pump_context *c)
{
    pump_mutex_lock(&c->use_lock);
    bool ready = pump_ring_ready(c, &c->peer_ring, make_legacy_peer,
                                 "a stream in the legacy stream's order: tensors freed there are not discarded");
    CUstream peer = ready ? c->legacy_peer : NULL;
    pump_mutex_unlock(&c->use_lock);
    return peer;
}

/* The mark's context and event, or NULL (0, PUMP_DISCARD_UNORDERED). */
static struct pump_context *mark_context(uint64_t mark, CUevent *event)
{
    uint64_t index = mark & 0xff;
    if (index == 0 || index > __atomic_load_n(&pump_context_count, __ATOMIC_ACQUIRE))
        return NULL;
    struct pump_context *c = &pump_contexts[index - 1];
    if ((mark >> MARK_SEQUENCE_SHIFT) < __atomic_load_n(&c->mark_base, __ATOMIC_ACQUIRE))
        return NULL; /* from before its context went: done */
    *event = c->marks[(mark >> MARK_SEQUENCE_SHIFT) % PUMP_DISCARD_MARKS];
    return c;
}

/* The peer waits for the legacy stream's work so far (the calling thread's context is c's). */
static bool peer_after_legacy(struct pump_context *c)
{
    return pump_call_ok(pump_driver.event_record(c->legacy_reached, CU_STREAM_LEGACY), "cuEventRecord") &&
           pump_call_ok(pump_driver.stream_wait_event(c->legacy_peer, c->legacy_reached, 0), "cuStreamWaitEvent");
}

/* The legacy stream's work to come waits for the discard made on the peer, marked by `event`;
 * where that cannot be asked, the discard is waited for here, on the host: never a race. */
static void legacy_after_peer(struct pump_context *c, CUevent event, bool recorded)
{
    if (recorded &&
        pump_call_ok(pump_driver.stream_wait_event(CU_STREAM_LEGACY, event, 0), "cuStreamWaitEvent"))
        return;
    pump_log_once("cannot order the legacy stream after a discard: waiting for it on the host");
    (void)pump_call_ok(pump_driver.stream_synchronize(c->legacy_peer), "cuStreamSynchronize");
}

/* How long the freeing thread waits for its stream to drain before a discard (DRAIN_NS), and how
 * many such waits may run out in a row before discards stop for good (DRAIN_TIMEOUTS): a stream
 * held by a host function that needs what the freeing thread holds (the GIL, the caching
 * allocator's lock) never drains while it waits, and the wait must not become a deadlock. A
 * second is about one of case c's steps on the H200 (906 ms). */
#define DRAIN_NS 1000000000ull
#define DRAIN_TIMEOUTS 3
#define DRAIN_PAUSE_NS 20000

static uint32_t drain_timeouts;  /* in a row; DRAIN_TIMEOUTS: no more discards */

/* True once `stream` has no work left, waited for by polling (no pump lock is held here) up to
 * DRAIN_NS; false, and nothing discarded, when it is not drained by then or cannot be asked. */
static bool drained(CUstream stream)
{
    if (__atomic_load_n(&drain_timeouts, __ATOMIC_RELAXED) >= DRAIN_TIMEOUTS)
        return false;
    uint64_t deadline = pump_channel_now_ns() + DRAIN_NS;
    for (bool waited = false;; waited = true) {
        CUresult r = pump_driver.stream_query(stream);
        if (r == CUDA_SUCCESS) {
            __atomic_store_n(&drain_timeouts, 0, __ATOMIC_RELAXED);
            PUMP_COUNT(discard_drain_waits, waited);
            return true;
        }
        if (r != CUDA_ERROR_NOT_READY)
            return pump_call_ok(r, "cuStreamQuery");
        if (pump_channel_now_ns() > deadline)
            break;
        struct timespec pause = {0, DRAIN_PAUSE_NS};
        nanosleep(&pause, NULL);
    }
    PUMP_COUNT(discards_undrained, 1);
    if (__atomic_add_fetch(&drain_timeouts, 1, __ATOMIC_RELAXED) == DRAIN_TIMEOUTS)
        pump_notice_once("a freeing stream did not drain within a second %d times in a row: dead tensors are "
                         "no longer discarded", DRAIN_TIMEOUTS);
    return false;
}

/* The runs' contents dropped on `stream`: discarded, or, under PUMP_TORCH_DISCARDS=poison, written
 * with 0xFF bytes in the discard's place (shim.h's pump_discards: the diagnostic that tells pump's
 * choice of dead memory and its order apart from the driver's discard). */
static bool drop_runs(CUdeviceptr *ptrs, size_t *sizes, uint32_t n, CUstream stream)
{
    if (pump_config.torch_discards != PUMP_DISCARDS_POISON)
        return pump_call_ok(pump_driver.discard_batch(ptrs, sizes, n, 0, stream), "cuMemDiscardBatchAsync");
    for (uint32_t k = 0; k < n; k++)
        if (!pump_call_ok(pump_driver.memset_d32_async(ptrs[k], 0xffffffffu, sizes[k] / 4, stream), "cuMemsetD32Async"))
            return false;  /* the runs before it poisoned: dead memory, whatever it holds */
    return true;
}

/* Discards the runs on `stream`, c's, or on its legacy peer in the legacy stream's order
 * (on_peer), and marks it. One discard at a time in a context: its slot is taken under
 * use_lock, the driver is asked outside it, and the mark is published under it again. */
static uint64_t discard_marked(struct pump_context *c, CUstream stream, bool on_peer, CUdeviceptr *ptrs,
                               size_t *sizes, uint32_t n)
{
    CUdeviceptr first = ptrs[0], end = ptrs[n - 1] + sizes[n - 1];  /* runs in address order */
    uint64_t bytes = 0;
    for (uint32_t k = 0; k < n; k++)
        bytes += sizes[k];
    pump_mutex_lock(&c->use_lock);
    bool ready = marks_ready(c);  /* no discard without a mark */
    bool taken = ready && !c->discarding;
    c->discarding = c->discarding || taken;
    uint64_t sequence = c->mark_count;
    uint32_t slot = (uint32_t)(sequence % PUMP_DISCARD_MARKS);
    CUevent event = c->marks[slot];
    uint32_t forgets = __atomic_load_n(&c->forgets, __ATOMIC_RELAXED);
    pump_mutex_unlock(&c->use_lock);
    if (!taken) {
        if (ready)
            PUMP_COUNT(discards_skipped, 1);  /* another thread's discard here is being made */
        return 0;
    }
    struct pump_capture_mode mode = pump_capture_relax();
    bool discarded = false, recorded = false;
    if (sequence >= PUMP_DISCARD_MARKS && pump_driver.event_query(event) != CUDA_SUCCESS) {
        PUMP_COUNT(discards_skipped, 1);  /* the slot's discard is still running */
    } else if ((!on_peer || peer_after_legacy(c)) && drained(stream) && drop_runs(ptrs, sizes, n, stream)) {
        PUMP_COUNT(bytes_discarded, bytes);
        discarded = true;
        recorded = pump_call_ok(pump_driver.event_record(event, stream), "cuEventRecord");
        if (on_peer)
            legacy_after_peer(c, event, recorded);
    }
    pump_capture_restore(&mode);
    uint64_t mark = 0;
    pump_mutex_lock(&c->use_lock);
    c->discarding = false;
    if (discarded && __atomic_load_n(&c->forgets, __ATOMIC_RELAXED) == forgets) {
        c->marked[slot].first = first;
        c->marked[slot].end = end;
        __atomic_store_n(&c->marked[slot].on_peer, on_peer, __ATOMIC_RELAXED);
        if (recorded) {
            mark = sequence << MARK_SEQUENCE_SHIFT | (c->index + 1);
        } else {
            /* The slot stays this discard's for good: nothing can be ordered after it. */
            c->mark_ring.broken = true;
            c->mark_ring.ready = false;
            mark = PUMP_DISCARD_UNORDERED;
            pump_log_once("cannot mark a discard: no more discards, and its memory is never prefetched");
        }
        __atomic_store_n(&c->mark_count, sequence + 1, __ATOMIC_RELEASE);
    }
    pump_mutex_unlock(&c->use_lock);
    return mark;
}

PUMP_HIDDEN bool pump_discard_possible(CUstream stream)
{
    bool legacy = stream == NULL || stream == CU_STREAM_LEGACY;
    /* A per-thread stream names the calling thread's, maybe not the block's; while a capture is
     * open, work on the legacy stream could join it. */
    bool droppable = pump_config.torch_discards == PUMP_DISCARDS_POISON ? pump_driver.memset_d32_async != NULL
                                                                         : pump_driver.discard_batch != NULL;
    return stream != CU_STREAM_PER_THREAD && droppable && pump_driver.event_query != NULL &&
           pump_driver.stream_query != NULL &&
           (legacy ? pump_driver.stream_synchronize != NULL && pump_captures_none() : !pump_stream_capturing(stream));
}

PUMP_HIDDEN uint64_t pump_discard_freed(struct pump_context *c, CUdeviceptr *ptrs, size_t *sizes, uint32_t n,
                                        CUstream stream)
{
    bool legacy = stream == NULL || stream == CU_STREAM_LEGACY;
    CUstream on = legacy ? legacy_peer(c) : stream;
    if (n == 0 || on == NULL)
        return 0;
    /* The legacy stream's context is the calling thread's, c (pump_context_of): only another
     * stream's may need making current. */
    bool pushed = false;
    uint64_t start = pump_channel_now_ns();
    uint64_t mark = legacy || pump_context_push(c->key, &pushed) ? discard_marked(c, on, legacy, ptrs, sizes, n) : 0;
    pump_context_pop(pushed);
    /* The drain's wait and the calls are pump's, not the program's: pumpd must not read them
     * as kernel time between this thread's launches (LAUNCH stamps). */
    pump_channel_own_time(pump_channel_now_ns() - start);
    return mark;
}

PUMP_HIDDEN uint64_t pump_discard_held(struct pump_context *c, CUdeviceptr *ptrs, size_t *sizes, uint32_t n)
{
    CUstream on = n != 0 ? legacy_peer(c) : NULL;
    if (on == NULL)
        return 0;
    bool pushed = false;
    uint64_t start = pump_channel_now_ns();
    uint64_t mark = pump_context_push(c->key, &pushed) ? discard_marked(c, on, false, ptrs, sizes, n) : 0;
    /* A mark nothing can wait for: the discard is waited for here, on the host. */
    if (mark == PUMP_DISCARD_UNORDERED)
        (void)pump_call_ok(pump_driver.stream_synchronize(on), "cuStreamSynchronize");
    pump_context_pop(pushed);
    pump_channel_own_time(pump_channel_now_ns() - start);
    return mark;
}

PUMP_HIDDEN bool pump_discard_peer_idle(struct pump_context *c)
{
    CUstream peer = legacy_peer(c);
    return peer != NULL && pump_driver.stream_query(peer) == CUDA_SUCCESS;
}

PUMP_HIDDEN bool pump_discard_on_peer(uint64_t mark, const struct pump_context *c)
{
    CUevent event;
    return mark_context(mark, &event) == c &&
           __atomic_load_n(&c->marked[(mark >> MARK_SEQUENCE_SHIFT) % PUMP_DISCARD_MARKS].on_peer, __ATOMIC_RELAXED);
}

PUMP_HIDDEN uint64_t pump_discard_over(uint64_t start, uint64_t bytes)
{
    uint64_t found = 0;
    uint32_t n = __atomic_load_n(&pump_context_count, __ATOMIC_ACQUIRE);
    for (uint32_t i = 0; i < n; i++) {
        struct pump_context *c = &pump_contexts[i];
        if (__atomic_load_n(&c->ctx, __ATOMIC_ACQUIRE) == NULL || !c->usable)
            continue;  /* not set up yet: no discard made there */
        pump_mutex_lock(&c->use_lock);
        uint64_t count = c->mark_count, base = __atomic_load_n(&c->mark_base, __ATOMIC_RELAXED);
        uint64_t from = count > PUMP_DISCARD_MARKS ? count - PUMP_DISCARD_MARKS : 0;
        for (uint64_t s = from > base ? from : base; s < count; s++) {
            uint32_t slot = (uint32_t)(s % PUMP_DISCARD_MARKS);
            if (c->marked[slot].first >= start + bytes || c->marked[slot].end <= start)
                continue;
            uint64_t mark = c->mark_ring.broken && s + 1 == count ? PUMP_DISCARD_UNORDERED
                                                                : s << MARK_SEQUENCE_SHIFT | (c->index + 1);
            /* One context's later discard of the memory comes after its earlier
             * ones there (through the owners in between); two contexts' cannot
             * be ordered by one mark. */
            found = found == 0 || (found & 0xff) == (mark & 0xff) ? mark : PUMP_DISCARD_UNORDERED;
        }
        pump_mutex_unlock(&c->use_lock);
    }
    return found;
}

PUMP_HIDDEN bool pump_discard_done(uint64_t mark)
{
    CUevent event;
    struct pump_context *c = mark_context(mark, &event);
    if (c == NULL) /* an unordered mark; or one from before its context went, done */
        return mark != PUMP_DISCARD_UNORDERED && (mark & 0xff) != 0 &&
               (mark & 0xff) <= __atomic_load_n(&pump_context_count, __ATOMIC_ACQUIRE);
    /* a slot is marked again only once its discard has run */
    if (__atomic_load_n(&c->mark_count, __ATOMIC_ACQUIRE) > (mark >> MARK_SEQUENCE_SHIFT) + PUMP_DISCARD_MARKS)
        return true;
    struct pump_capture_mode mode = pump_capture_relax();
    bool done = pump_driver.event_query(event) == CUDA_SUCCESS;
    pump_capture_restore(&mode);
    return done;
}

/* A slot marked again meanwhile makes the stream wait for a later discard:
 * longer, never shorter than needed. */
static void discard_wait(CUstream stream, uint64_t mark)
{
    CUevent event;
    if (mark_context(mark, &event) != NULL)
        pump_stream_wait(stream, event);
}

PUMP_HIDDEN void pump_discard_wait_host(uint64_t mark)
{
    CUevent event;
    struct pump_context *c = mark_context(mark, &event);
    if (c == NULL || pump_discard_done(mark))
        return;
    bool pushed;
    struct pump_capture_mode mode = pump_capture_relax();
    if (pump_context_push(c->key, &pushed)) {
        (void)pump_call_ok(pump_driver.stream_synchronize(c->legacy_peer), "cuStreamSynchronize");
        pump_context_pop(pushed);
    }
    pump_capture_restore(&mode);
}

PUMP_HIDDEN void pump_stream_after_discard(CUstream stream, uint64_t mark)
{
    discard_wait(stream, mark);
}

PUMP_HIDDEN void pump_prefetch_after_discard(struct pump_context *c, uint64_t mark)
{
    discard_wait(c->stream, mark);
}

PUMP_HIDDEN void pump_evict_after_discard(struct pump_context *c, uint64_t mark)
{
    discard_wait(c->evict_stream, mark);
}

PUMP_HIDDEN void pump_populate_after_discard(struct pump_context *c, uint64_t mark)
{
    discard_wait(c->populate_stream, mark);
}

PUMP_HIDDEN bool pump_populate(struct pump_context *c, CUdeviceptr *ptrs, size_t *sizes, size_t n)
{
    pump_evictions_wait(c, c->populate_stream);
    CUmemLocation to = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = c->device};
    return pump_move_ranges(c->populate_stream, to, ptrs, sizes, n);
}
