/* passed_discards.c: PyTorch's caching allocator's dead tensors, discarded once the GPU has passed
 * their frees, where the job's memory is beyond its device (issue 41, item 2).
 *
 * On a full card the launch rule evicts freed tensors' blocks first (residency_evict.c; kept by
 * their last use once these discards take more dead memory than evictions copy out,
 * residency_rank.h): each is copied to the host, and the next tensor there is brought back in from it, both for bytes no one
 * reads (GPT-2 small on the real-client tier: 1.5 of 3.5 GB evicted a step were dead). The
 * discard at the free (torch_trace.c) does not fit there: the driver's discard is not ordered
 * before the work queued behind it on a busy stream (discard_marks.c), so it waits for the
 * freeing stream to drain, and on a full card the launching thread then waits for the GPU at every
 * free. Here the free only records a mark on its stream (a use token, prefetch.h), after every use
 * of the tensor on that stream; the caching allocator tells a free only once the other streams
 * record_stream named are done with it. At a later hook of the allocator, a dead tensor whose mark
 * the GPU has passed, and which no tensor has taken over since, is discarded on pump's
 * discard-only stream (pump_discard_held: nothing queued before it there), and its freeing stream,
 * where the allocator hands the memory out again (it keeps free blocks per stream), waits for the
 * discard's event: the order bench/gpu/probes/discard_late.py found to lose nothing on the H200.
 * Both happen inside the allocator's hook, under its lock: no tensor is handed out meanwhile.
 * pump's own later moves of the memory wait for the discard's mark (residency_discard.c).
 *
 * Frees wait in a queue per device, oldest first; the first whose mark the GPU has not passed ends
 * a search. Only where pump's budget presses on the device (torch_trace.c's gate): where nothing is
 * evicted, the next tensor finds dead memory resident, where a discarded one is populated again.
 */
#include <pthread.h>

#include "discard_marks.h"
#include "locks.h"
#include "passed_discards.h"
#include "prefetch.h"
#include "residency.h"

/* Frees waiting per device; past it the oldest is dropped (kept, it is evicted as before). */
#define WAITING_MAX 1024
/* Runs of whole 2 MiB blocks one tensor's discard takes at most. */
#define RUNS_MAX 16

struct waiting_free {
    uint64_t addr, life, token;
    CUstream stream;
};

struct queue {
    struct waiting_free free[WAITING_MAX];
    uint32_t head, count; /* count: atomic, read without the lock */
};

static struct queue queues[PUMP_DEVICES_MAX];
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

PUMP_HIDDEN void pump_passed_discards_note(struct pump_range *range, CUstream stream)
{
    int device = __atomic_load_n(&range->device, __ATOMIC_RELAXED);
    struct pump_context *c = pump_context_of(stream);
    if (device < 0 || device >= PUMP_DEVICES_MAX || c == NULL || pump_context_device(c) != device ||
        !pump_discard_possible(stream))
        return;
    uint64_t base = __atomic_load_n(&range->base, __ATOMIC_RELAXED);
    if ((base + __atomic_load_n(&range->size, __ATOMIC_RELAXED)) / PUMP_BLOCK_SIZE <=
        (base + PUMP_BLOCK_SIZE - 1) / PUMP_BLOCK_SIZE)
        return;  /* no whole 2 MiB block: nothing to discard */
    uint64_t token = pump_use_record(c, stream);
    if (token == 0)
        return;  /* when the free runs is not known */
    struct waiting_free w = {.addr = base, .life = __atomic_load_n(&range->life, __ATOMIC_RELAXED),
                             .token = token, .stream = stream};
    struct queue *q = &queues[device];
    pump_mutex_lock(&lock);
    bool full = q->count == WAITING_MAX;
    if (full) {
        q->head = (q->head + 1) % WAITING_MAX;
        __atomic_store_n(&q->count, q->count - 1, __ATOMIC_RELAXED);
    }
    q->free[(q->head + q->count) % WAITING_MAX] = w;
    __atomic_store_n(&q->count, q->count + 1, __ATOMIC_RELAXED);
    pump_mutex_unlock(&lock);
    if (full)
        pump_log_once("more than %d freed tensors wait for the GPU to pass their frees: the oldest are not "
                      "discarded, and evictions copy them out", WAITING_MAX);
}

/* The oldest waiting free of q, copied to *w; false when none waits. */
static bool oldest(struct queue *q, struct waiting_free *w)
{
    pump_mutex_lock(&lock);
    bool any = q->count != 0;
    if (any)
        *w = q->free[q->head];
    pump_mutex_unlock(&lock);
    return any;
}

/* Takes q's oldest free off the queue where it is still w (another thread may have). */
static bool take_oldest(struct queue *q, const struct waiting_free *w)
{
    pump_mutex_lock(&lock);
    const struct waiting_free *first = &q->free[q->head];
    bool same = q->count != 0 && first->addr == w->addr && first->life == w->life && first->token == w->token;
    if (same) {
        q->head = (q->head + 1) % WAITING_MAX;
        __atomic_store_n(&q->count, q->count - 1, __ATOMIC_RELAXED);
    }
    pump_mutex_unlock(&lock);
    return same;
}

/* Discards what of the dead tensor w names is still dead and believed resident on `device`, in c,
 * its stream's context (NULL: none). */
static void discard_passed(const struct waiting_free *w, struct pump_context *c, int device)
{
    CUdeviceptr ptrs[RUNS_MAX];
    size_t sizes[RUNS_MAX];
    if (c == NULL || pump_context_device(c) != device || !pump_discard_possible(w->stream))
        return;  /* a capture opened meanwhile, or its context went */
    struct pump_range *range = pump_ranges_find_freed(w->addr);
    if (range == NULL || __atomic_load_n(&range->life, __ATOMIC_RELAXED) != w->life)
        return;  /* taken over by a tensor since, or gone */
    uint32_t n = pump_residency_discard_take(range, device, ptrs, sizes, RUNS_MAX);
    if (n == 0)
        return;
    uint64_t mark = pump_discard_held(c, ptrs, sizes, n);
    if (mark != 0) {
        pump_stream_after_discard(w->stream, mark);  /* before the allocator hands it out again */
        /* pump's next prefetches take the room the discard makes: before it has run on the GPU the
         * device is still full, and the driver would evict to make it (its victims fault later) */
        pump_prefetch_after_discard(c, mark);
    }
    pump_residency_discard_settle(range, ptrs, sizes, n, mark, device);
    PUMP_COUNT(torch_tensor_discards, mark != 0);
}

PUMP_HIDDEN void pump_passed_discards_make(int device)
{
    if (device < 0 || device >= PUMP_DEVICES_MAX)
        return;
    struct queue *q = &queues[device];
    struct waiting_free w;
    while (__atomic_load_n(&q->count, __ATOMIC_RELAXED) != 0 && oldest(q, &w)) {
        enum pump_use_state ran = pump_use_passed(w.token);
        if (ran == PUMP_USE_AHEAD)
            return;
        struct pump_context *c = ran == PUMP_USE_PASSED ? pump_context_of(w.stream) : NULL;
        if (c != NULL && !pump_discard_peer_idle(c))
            return;  /* an earlier discard still runs: this one waits for a later hook, not the GPU */
        if (take_oldest(q, &w) && ran == PUMP_USE_PASSED)
            discard_passed(&w, c, device);
    }
}

PUMP_HIDDEN void pump_passed_discards_forget(CUstream stream)
{
    pump_mutex_lock(&lock);
    for (int d = 0; d < PUMP_DEVICES_MAX; d++) {
        struct queue *q = &queues[d];
        uint32_t kept = 0;
        for (uint32_t k = 0; k < q->count; k++) {
            struct waiting_free w = q->free[(q->head + k) % WAITING_MAX];
            if (w.stream != stream)
                q->free[(q->head + kept++) % WAITING_MAX] = w;
        }
        __atomic_store_n(&q->count, kept, __ATOMIC_RELAXED);
    }
    pump_mutex_unlock(&lock);
}

PUMP_HIDDEN void pump_passed_discards_before_fork(void)
{
    pump_mutex_lock(&lock);
}

PUMP_HIDDEN void pump_passed_discards_after_fork(bool child)
{
    if (child)
        for (int d = 0; d < PUMP_DEVICES_MAX; d++)
            queues[d].count = queues[d].head = 0;
    pump_mutex_unlock(&lock);
}
