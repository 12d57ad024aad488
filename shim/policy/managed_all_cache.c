/* managed_all_cache.c: stream-ordered managed memory that pump keeps once it is freed.
 *
 * Two uses:
 * - cuda.h 13.0 says the ranges of cuMemPrefetchAsync, cuMemPrefetchBatchAsync and
 *   cuMemDiscardBatchAsync "must refer to managed memory allocated via cuMemAllocManaged or
 *   declared via __managed__"; a managed pool's memory (what managed_all takes cuMemAllocAsync
 *   from) is neither. Whether the driver refuses it is asked once per device (hooks_memory.c);
 *   where it does, converted stream-ordered allocations come from cuMemAllocManaged, and this
 *   cache gives them what the pool gave: a free in stream order, with no wait on the host. A
 *   driver that took the probe may refuse the pool's memory later (an H200, driver 580:
 *   bench/results/gpu-20261126-nvidia-h200): the first refusal of it (prefetch_ranges.c) turns
 *   the device's answer to refused, and the pool's blocks kept here go back to it.
 * - pump's allocator for PyTorch places each tensor where the same allocation went a step before
 *   (placement.h): once the optimizer marked a step, the blocks it frees are kept here, a
 *   managed pool's included, so that the place is free when the allocation comes again. A pool
 *   block not taken again for PLACED_STEPS_KEPT steps goes back to its pool (a shape that
 *   changed: the pool could hand its memory out at other sizes).
 *
 * - A free keeps the block, with a use token (prefetch.h) recorded on the freeing stream: the
 *   point after which nothing may touch it.
 * - An allocation of the same size on the same device takes a kept block (the one its place
 *   names, where it has one): on the stream that freed it at once (stream order), on another
 *   after that stream waits, on the GPU, for the token (a pool's
 *   REUSE_ALLOW_INTERNAL_DEPENDENCIES, on by default). Only the same size is taken: no block is
 *   split. A block freed on a stream since destroyed waits for its token on every stream (the
 *   handle may name a new stream).
 * - A synchronisation of the freeing stream, or of its context, shows the free ran. Then, as a
 *   pool does "on the next call to stream, event or context synchronize", a device keeping
 *   more than the release threshold the program set on its default pool (followed as for the
 *   managed pool, managed_all.c; PyTorch's UINT64_MAX keeps everything) gives its oldest such
 *   blocks back (cuMemFree, in the block's context); so does a trim of that pool, down to
 *   what it asks to keep. A block whose free is not known to have run stays (a pool counts it
 *   as outstanding too).
 *
 * Kept blocks are outside the capacity count, as a pool's kept memory is, but for those
 * placement keeps: they stay in the range table as freed tensors of segments of their own
 * (hooks_memory.c), counted as a caching allocator's segments are, until given back. A context
 * that goes takes its blocks with it. One lock guards the table, never held across a driver call; kept
 * blocks are found by address through an index (open addressing), by size by a search.
 */
#include <pthread.h>
#include <stdlib.h>
#include <time.h>

#include "capacity.h"
#include "capture_mode.h"
#include "locks.h"
#include "context_cache.h"
#include "devices.h"
#include "discard_marks.h"
#include "managed_all.h"
#include "managed_all_cache.h"
#include "placement.h"
#include "prefetch.h"
#include "prefetch_ranges.h"
#include "ranges.h"

/* Steps a managed pool's block kept for placement stays untaken before it goes back to its
 * pool: the step after its free, and one more (an evaluation pass between two training steps). */
#define PLACED_STEPS_KEPT 3

static _Atomic int answers[PUMP_DEVICES_MAX];

/* Live allocations of a device's managed pool that managed_all handed out (tensors carry their
 * segment's flags: ranges.h). */
struct pool_in_use {
    int device;
    size_t allocations;
};

static void count_in_use(struct pump_range *range, void *arg)
{
    struct pool_in_use *in_use = arg;
    in_use->allocations += pump_range_is_converted_pool(range) &&
                           __atomic_load_n(&range->device, __ATOMIC_RELAXED) == in_use->device;
}

/* The driver refused to prefetch memory of `device`'s managed pool (`refusal`) after the probe
 * had been taken: the answer turns from PREFETCHED to REFUSED, said once. What the pool handed
 * out stays there (no live memory is moved or freed); blocks freed from now on go back to it. */
static enum pump_pool_prefetch pool_prefetch_withdrawn(int device, CUresult refusal)
{
    int prefetched = PUMP_POOL_PREFETCHED;
    if (!atomic_compare_exchange_strong_explicit(&answers[device], &prefetched, PUMP_POOL_REFUSED,
                                                 memory_order_acq_rel, memory_order_acquire))
        return (enum pump_pool_prefetch)prefetched;  /* another thread turned it */
    struct pool_in_use in_use = {.device = device};
    pump_ranges_each(count_in_use, &in_use);
    pump_log(1, "managed_all: device %d's driver refused to prefetch managed pool memory it had prefetched before "
                "(CUresult %d): from now on its stream-ordered allocations come from cuMemAllocManaged, freed in "
                "stream order by pump; the pool's %zu allocations in use stay as they are (those refused fault in) "
                "and go back to the pool when freed, as do the pool's blocks pump kept",
             device, (int)refusal, in_use.allocations);
    return PUMP_POOL_REFUSED;
}

PUMP_HIDDEN enum pump_pool_prefetch pump_pool_prefetch_of(int device)
{
    if (device < 0 || device >= PUMP_DEVICES_MAX)
        return PUMP_POOL_PREFETCHED;
    enum pump_pool_prefetch answer = atomic_load_explicit(&answers[device], memory_order_acquire);
    CUresult refusal = answer == PUMP_POOL_PREFETCHED ? pump_pool_refusal_of(device) : CUDA_SUCCESS;
    return refusal != CUDA_SUCCESS ? pool_prefetch_withdrawn(device, refusal) : answer;
}

/* The devices whose pool memory is refused now, one bit each (asked outside the cache's lock:
 * the answer may turn as it is read). */
_Static_assert(PUMP_DEVICES_MAX <= 64, "one bit a device");
static uint64_t refused_pools(void)
{
    uint64_t refused = 0;
    for (int device = 0; device < PUMP_DEVICES_MAX; device++)
        if (pump_pool_prefetch_of(device) == PUMP_POOL_REFUSED)
            refused |= 1ull << device;
    return refused;
}

PUMP_HIDDEN void pump_pool_prefetch_decided(int device, enum pump_pool_prefetch answer)
{
    int unasked = PUMP_POOL_UNASKED;
    if (device < 0 || device >= PUMP_DEVICES_MAX ||
        !atomic_compare_exchange_strong_explicit(&answers[device], &unasked, (int)answer, memory_order_acq_rel,
                                                 memory_order_acquire))
        return;
    if (answer == PUMP_POOL_REFUSED)
        pump_log(1, "managed_all: device %d's driver refuses to prefetch managed pool memory: its stream-ordered "
                    "allocations come from cuMemAllocManaged, freed in stream order by pump",
                 device);
    else
        pump_log(1, "managed_all: device %d's driver prefetches managed pool memory: stream-ordered allocations "
                    "come from its managed pool",
                 device);
}

struct kept {
    CUdeviceptr ptr;
    size_t size;
    int device;
    CUstream stream;  /* freed on (legacy-ABI handle) */
    CUcontext ctx;    /* the stream's */
    uint64_t token;   /* the free's point on its stream (0: none could be recorded) */
    uint64_t order;   /* the oldest goes back first */
    uint64_t step;    /* placement's steps marked when it was kept */
    bool done;        /* a synchronisation since showed the free ran */
    bool pooled;      /* a managed pool's block (else cuMemAllocManaged's) */
    bool stream_gone; /* its stream was destroyed since: the handle may name another stream now */
    bool dead;        /* its tensor's blocks are to be discarded once the GPU passed its free */
    bool claimed;     /* ... being discarded now: neither handed out nor given back meanwhile */
    uint64_t mark;    /* its discard's (discard_marks.h; 0: none): whoever uses the memory next waits */
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t claim_ended = PTHREAD_COND_INITIALIZER;
static struct kept *kept;
static size_t kept_count, kept_room;
static uint64_t kept_bytes[PUMP_DEVICES_MAX];
static uint64_t kept_order;

/* kept[] by address: slot -> index + 1 (0: empty); at most half full. */
static uint32_t *slot_index;
static size_t slots;

static size_t home(CUdeviceptr ptr)
{
    return (size_t)((ptr * 0x9E3779B97F4A7C15ull) >> 32) & (slots - 1);
}

/* Under the lock: the slot holding ptr, or the empty one where it would go. */
static size_t slot_of(CUdeviceptr ptr)
{
    size_t i = home(ptr);
    while (slot_index[i] != 0 && kept[slot_index[i] - 1].ptr != ptr)
        i = (i + 1) & (slots - 1);
    return i;
}

/* Under the lock: the block kept at ptr, or NULL. */
static struct kept *kept_at(CUdeviceptr ptr)
{
    if (kept_count == 0)
        return NULL;
    uint32_t at = slot_index[slot_of(ptr)];
    return at != 0 ? &kept[at - 1] : NULL;
}

/* Under the lock: empties slot i, moving back the entries after it that could not sit at
 * their home. */
static void unindex(size_t i)
{
    for (size_t j = (i + 1) & (slots - 1); slot_index[j] != 0; j = (j + 1) & (slots - 1)) {
        size_t h = home(kept[slot_index[j] - 1].ptr);
        bool movable = i <= j ? (h <= i || h > j) : (h <= i && h > j);
        if (movable) {
            slot_index[i] = slot_index[j];
            i = j;
        }
    }
    slot_index[i] = 0;
}

/* The per-thread default stream is one handle for as many streams as threads. */
static bool same_stream(const struct kept *k, CUstream stream)
{
    return k->stream == stream && stream != CU_STREAM_PER_THREAD && !k->stream_gone;
}

/* Under the lock. */
static void drop(size_t i)
{
    kept_bytes[kept[i].device] -= kept[i].size;
    unindex(slot_of(kept[i].ptr));
    if (i != --kept_count) {
        kept[i] = kept[kept_count];
        slot_index[slot_of(kept[i].ptr)] = (uint32_t)i + 1;
    }
}

/* Under the lock: whether k may go to an allocation on `stream` now. */
static bool takeable(const struct kept *k, size_t size, int device, CUstream stream, bool pooled_too)
{
    return k->size == size && k->device == device && (pooled_too || !k->pooled) && !k->claimed &&
           (k->done || k->token != 0 || same_stream(k, stream));
}

/* How long an allocation waits at most for the discard of the block its place names (its claim,
 * held_discards.c) before it takes another: a discard is one ioctl once the worker makes it. */
#define CLAIM_WAIT_NS 10000000

/* Under the lock: the block `place` prefers, if claimed, settled first (a while at most), so that
 * a discard made meanwhile does not move the tensor from its place (pumpd's plans follow it). */
static void wait_unclaimed(const struct pump_place *place)
{
    const struct kept *k = place != NULL && place->preferred != 0 ? kept_at(place->preferred) : NULL;
    if (k == NULL || !k->claimed)
        return;
    PUMP_COUNT(placement_claim_waits, 1);
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_nsec += CLAIM_WAIT_NS;
    until.tv_sec += until.tv_nsec / 1000000000;
    until.tv_nsec %= 1000000000;
    do {
        if (pthread_cond_timedwait(&claim_ended, &lock, &until) != 0)
            return;
    } while ((k = kept_at(place->preferred)) != NULL && k->claimed);
}

PUMP_HIDDEN CUdeviceptr pump_kept_take(size_t size, int device, CUstream stream, const struct pump_place *place,
                                       bool *pooled)
{
    struct kept block = {.ptr = 0};
    bool placed = false;
    /* A pool whose memory the driver refused hands out no block again: pump could not move it. */
    bool pooled_too = place != NULL && pump_pool_prefetch_of(device) != PUMP_POOL_REFUSED;
    pump_mutex_lock(&lock);
    wait_unclaimed(place);
    size_t at = kept_count;
    if (place != NULL && place->preferred != 0 && kept_count > 0) {
        size_t i = slot_of(place->preferred);
        if (slot_index[i] != 0 && takeable(&kept[slot_index[i] - 1], size, device, stream, pooled_too))
            at = slot_index[i] - 1;
        placed = at != kept_count;
    }
    for (size_t i = 0; i < kept_count && at == kept_count; i++)
        if (takeable(&kept[i], size, device, stream, pooled_too) &&
            (place == NULL || !pump_placement_reserved(place, kept[i].ptr)))
            at = i;
    if (at != kept_count) {
        block = kept[at];
        drop(at);
    }
    pump_mutex_unlock(&lock);
    if (place != NULL && place->preferred != 0) {
        PUMP_COUNT(placement_wanted, 1);
        PUMP_COUNT(placement_hits, placed);
    }
    if (block.ptr == 0)
        return 0;
    if (!block.done && !same_stream(&block, stream))
        pump_use_wait(stream, block.token);
    if (block.mark != 0 && !pump_discard_done(block.mark))
        pump_stream_after_discard(stream, block.mark);
    PUMP_COUNT(unpooled_reuses, !block.pooled);
    PUMP_COUNT(placement_reuses, block.pooled);
    *pooled = block.pooled;
    return block.ptr;
}

/* Under the lock: room for one more block, in kept[] and its index. */
static bool make_room(void)
{
    if (kept_count == kept_room) {
        size_t room = kept_room != 0 ? 2 * kept_room : 256;
        struct kept *more = realloc(kept, room * sizeof *kept);
        if (more == NULL)
            return false;
        kept = more;
        kept_room = room;
    }
    if (2 * (kept_count + 1) <= slots)
        return true;
    size_t grown = slots != 0 ? 2 * slots : 512;
    uint32_t *index = calloc(grown, sizeof *index);
    if (index == NULL)
        return false;
    free(slot_index);
    slot_index = index;
    slots = grown;
    for (size_t i = 0; i < kept_count; i++)
        slot_index[slot_of(kept[i].ptr)] = (uint32_t)i + 1;
    return true;
}

PUMP_HIDDEN bool pump_kept_keep(CUdeviceptr ptr, size_t size, int device, CUstream stream, bool pooled)
{
    if (device < 0 || device >= PUMP_DEVICES_MAX || pump_stream_capturing(stream))
        return false;
    struct pump_context *c = pump_context_of(stream);
    uint64_t token = c != NULL ? pump_use_record(c, stream) : 0;
    CUcontext ctx = pump_stream_context(stream);
    pump_mutex_lock(&lock);
    bool room = make_room();
    if (room) {
        kept[kept_count] = (struct kept){.ptr = ptr, .size = size, .device = device, .stream = stream, .ctx = ctx,
                                         .token = token, .order = ++kept_order, .step = pump_placement_steps(),
                                         .pooled = pooled};
        slot_index[slot_of(ptr)] = (uint32_t)++kept_count;
        kept_bytes[device] += size;
    }
    pump_mutex_unlock(&lock);
    if (!room)
        pump_log_once("no memory to keep a freed block: the driver frees it");
    return room;
}

PUMP_HIDDEN void pump_kept_dead(CUdeviceptr ptr)
{
    pump_mutex_lock(&lock);
    struct kept *k = kept_at(ptr);
    if (k != NULL)
        k->dead = k->token != 0;  /* without a token, when the free runs is not known */
    pump_mutex_unlock(&lock);
}

PUMP_HIDDEN bool pump_kept_dead_claim(int device, struct pump_kept_claim *claim)
{
    pump_mutex_lock(&lock);
    size_t oldest = kept_count;
    for (size_t i = 0; i < kept_count; i++)
        if (kept[i].dead && !kept[i].claimed && kept[i].device == device && !kept[i].stream_gone &&
            (oldest == kept_count || kept[i].order < kept[oldest].order))
            oldest = i;
    if (oldest != kept_count) {
        kept[oldest].claimed = true;
        *claim = (struct pump_kept_claim){.ptr = kept[oldest].ptr, .token = kept[oldest].token,
                                          .stream = kept[oldest].stream};
    }
    pump_mutex_unlock(&lock);
    return oldest != kept_count;
}

PUMP_HIDDEN void pump_kept_dead_settle(const struct pump_kept_claim *claim, bool again, uint64_t mark)
{
    pump_mutex_lock(&lock);
    struct kept *k = kept_at(claim->ptr);
    if (k != NULL) {
        k->claimed = false;
        k->dead = again;
        k->mark = mark != 0 ? mark : k->mark;
        pthread_cond_broadcast(&claim_ended);
    }
    pump_mutex_unlock(&lock);
}

PUMP_HIDDEN bool pump_unpooled_holds(CUdeviceptr ptr)
{
    pump_mutex_lock(&lock);
    bool held = kept_at(ptr) != NULL;
    pump_mutex_unlock(&lock);
    return held;
}

PUMP_HIDDEN void pump_kept_stream_gone(CUstream stream)
{
    pump_mutex_lock(&lock);
    for (size_t i = 0; i < kept_count; i++)
        if (kept[i].stream == stream)
            kept[i].stream_gone = true;
    pump_mutex_unlock(&lock);
}

#define RELEASE_BATCH 64

/* Blocks leaving the cache: each given back with cuMemFree in its context where its free is
 * known to have run, else (a pool's block) with cuMemFreeAsync on the stream that freed it. */
struct release {
    CUdeviceptr ptr[RELEASE_BATCH];
    CUcontext ctx[RELEASE_BATCH];
    CUstream stream[RELEASE_BATCH];
    uint64_t mark[RELEASE_BATCH];
    bool in_order[RELEASE_BATCH], pooled[RELEASE_BATCH];
    size_t n;
};

/* Under the lock: kept[i] leaves the cache, into out. */
static void take_out(size_t i, struct release *out)
{
    out->ptr[out->n] = kept[i].ptr;
    out->ctx[out->n] = kept[i].ctx;
    out->stream[out->n] = kept[i].stream;
    out->mark[out->n] = kept[i].mark;
    out->in_order[out->n] = !kept[i].done;
    out->pooled[out->n++] = kept[i].pooled;
    drop(i);
}

/* Under the lock: the device's oldest done blocks, while it keeps more than `above` (and,
 * unless `past`, the block's going leaves at least that much). */
static void pick(int device, uint64_t above, bool past, struct release *out)
{
    while (out->n < RELEASE_BATCH && kept_bytes[device] > above) {
        size_t oldest = kept_count;
        for (size_t i = 0; i < kept_count; i++)
            if (kept[i].device == device && kept[i].done && !kept[i].claimed &&
                (past || kept_bytes[device] - kept[i].size >= above) &&
                (oldest == kept_count || kept[i].order < kept[oldest].order))
                oldest = i;
        if (oldest == kept_count)
            return;
        take_out(oldest, out);
    }
}

static void release(const struct release *out, pump_unpooled_free_fn free_fn, pump_kept_free_async_fn free_async_fn)
{
    struct pump_capture_mode mode = pump_capture_relax();
    for (size_t i = 0; i < out->n; i++) {
        /* A block placement kept is a freed tensor of a segment of its own (hooks_memory.c):
         * the segment goes, and its bytes leave the capacity. */
        uint64_t size;
        int device;
        if (pump_ranges_remove(out->ptr[i], &size, &device) != PUMP_REMOVED_NOTHING)
            pump_capacity_release(device, size);
        if (out->mark[i] != 0)
            pump_discard_wait_host(out->mark[i]);  /* the memory's next owner is the driver's */
        bool pushed;
        CUresult r = CUDA_ERROR_INVALID_CONTEXT;
        if (pump_context_push(out->ctx[i], &pushed)) {
            r = out->in_order[i] ? free_async_fn(out->ptr[i], out->stream[i]) : free_fn(out->ptr[i]);
            pump_context_pop(pushed);
        }
        if (r == CUDA_SUCCESS && out->pooled[i])
            PUMP_COUNT(placement_releases, 1);
        else if (r == CUDA_SUCCESS)
            PUMP_COUNT(unpooled_releases, 1);
        else
            pump_log_once("a kept block could not be given back (CUresult %d)", (int)r);
    }
    pump_capture_restore(&mode);
}

/* Under the lock: whether kept[i] is a block of a pool whose memory is refused now (refused_pools). */
static bool of_refused_pool(size_t i, uint64_t refused)
{
    return kept[i].pooled && (refused >> kept[i].device & 1);
}

PUMP_HIDDEN void pump_kept_release_unplaced(uint64_t steps, pump_unpooled_free_fn free_fn,
                                            pump_kept_free_async_fn free_async_fn)
{
    uint64_t refused = refused_pools();
    struct release out;
    do {
        out.n = 0;
        pump_mutex_lock(&lock);
        for (size_t i = kept_count; i-- > 0 && out.n < RELEASE_BATCH;)
            if (kept[i].pooled && (kept[i].step + PLACED_STEPS_KEPT <= steps || of_refused_pool(i, refused)) &&
                (kept[i].done || !kept[i].stream_gone) && !kept[i].claimed)
                take_out(i, &out);
        pump_mutex_unlock(&lock);
        release(&out, free_fn, free_async_fn);
    } while (out.n == RELEASE_BATCH);
}

static bool any_kept(void)
{
    pump_mutex_lock(&lock);
    bool any = kept_count > 0;
    pump_mutex_unlock(&lock);
    return any;
}

PUMP_HIDDEN void pump_unpooled_synchronised(CUcontext ctx, CUstream stream, bool stream_only,
                                            pump_unpooled_free_fn free_fn)
{
    if (!any_kept())
        return;
    if (!stream_only && ctx == NULL && pump_driver.ctx_get_current(&ctx) != CUDA_SUCCESS)
        ctx = NULL;
    if (!stream_only && ctx == NULL)
        return;  /* no context: nothing was synchronised */
    uint64_t refused = refused_pools();
    struct release out;
    do {
        out.n = 0;
        pump_mutex_lock(&lock);
        for (size_t i = 0; i < kept_count; i++)
            if (stream_only ? same_stream(&kept[i], stream) : kept[i].ctx == ctx)
                kept[i].done = true;
        for (size_t i = kept_count; i-- > 0 && out.n < RELEASE_BATCH;)
            if (of_refused_pool(i, refused) && kept[i].done && !kept[i].claimed)
                take_out(i, &out);
        for (int device = 0; device < PUMP_DEVICES_MAX && out.n < RELEASE_BATCH; device++)
            if (kept_bytes[device] > 0)
                pick(device, pump_managed_pool_threshold(device), true, &out);
        pump_mutex_unlock(&lock);
        release(&out, free_fn, NULL);
    } while (out.n == RELEASE_BATCH);
}

PUMP_HIDDEN void pump_unpooled_trim(CUmemoryPool program_pool, size_t keep, pump_unpooled_free_fn free_fn)
{
    int device = pump_managed_pool_device(program_pool);
    if (device < 0 || !any_kept())
        return;
    struct release out;
    do {
        out.n = 0;
        pump_mutex_lock(&lock);
        pick(device, keep, false, &out);
        pump_mutex_unlock(&lock);
        release(&out, free_fn, NULL);
    } while (out.n == RELEASE_BATCH);
}

PUMP_HIDDEN void pump_unpooled_forget_context(CUcontext ctx)
{
    pump_mutex_lock(&lock);
    for (size_t i = kept_count; i-- > 0;)
        if (kept[i].ctx == ctx)
            drop(i);
    pump_mutex_unlock(&lock);
}
