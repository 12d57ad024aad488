/* residency.c: pump's belief of what is on each GPU, block by block, and the
 * budget it is held to (see residency.h).
 *
 * Each managed allocation gets, when it is made, a state per 2 MiB block
 * (address >> 21; the last block may be partial): the device it is believed
 * resident on, its place in that device's migration order (a list, oldest
 * first: the order blocks became believed resident; using a resident block
 * again does not move it), and a stamp of the epoch it was last prefetched
 * in. Each allocation's range record summarises its blocks for the launch
 * path, which reads only those summaries (without a lock): resident_stamp
 * (every block prefetched in this epoch: skip it) and accounted_on (every
 * block counted on that device: nothing for policy off to count).
 *
 * Everything else runs under one lock, only when a launch actually changes
 * the belief: counting blocks in, choosing victims (least recently migrated,
 * or for a plan with PUMP_ORDER_USED least recently used by a launch, ties
 * broken by migration order), and enqueueing the moves. A block taken for a
 * launch is never its victim, nor is a block its trigger prefetches.
 *
 * A launch that wants more blocks than fit takes them in order (the scan's
 * allocations in argument order, blocks by address; a trigger's need ranges
 * in plan order) up to the first that does not fit, and none after it. A
 * trigger's prefetches for later launches evict nothing: each comes in if it
 * fits beside what the plan's evictions left, else it is skipped (the launch
 * that needs it takes it then).
 * Plan ranges are widened to the blocks they touch.
 *
 * Memory allocated again over a dead tensor's discard (prefetch.h) is moved
 * only after the discard: its prefetch makes the prefetch stream wait for it
 * on the GPU, its eviction the eviction stream. That wait holds up the
 * prefetches queued behind it only until the freeing stream reaches the free,
 * which on that stream comes before any launch that needs them.
 */
#include <pthread.h>
#include <stdlib.h>

#include "context_cache.h"
#include "residency.h"

#define DEVICES_MAX 64
#define BATCH 64 /* ranges per driver call, and waits per eviction batch */

struct pump_block {
    struct pump_block *older, *newer; /* the device's migration order (NULL: not resident) */
    struct pump_blocks *owner;
    uint64_t migrated;                /* its place in that order */
    uint64_t mark;                    /* the decision whose trigger prefetches it */
    uint64_t ready;                   /* token of the planned prefetch that brought it; 0: none */
    uint64_t planned_for;             /* the launch tick whose trigger last named it for prefetch (brought
                                         in or already resident): for PUMP_ORDER_USED it counts as used
                                         then (not as old as its allocation's last use) */
    uint64_t evicted_in;              /* its device's `awaited` + 1 when last evicted: a prefetch of it
                                         while that is still the case must wait for the evictions */
    uint64_t discarded;               /* the mark of an earlier owner's discard of its memory that may
                                         still be running: pump moves it only after that (0: none) */
    uint64_t stamp;                   /* its kind's stamp (resident_stamps) when last prefetched; 0: none */
    int32_t device;                   /* believed resident there; -1: nowhere */
};

struct pump_blocks {
    struct pump_range *range;
    uint64_t base, size;
    uint64_t mark;                    /* the decision whose launch uses it */
    uint32_t count;
    struct pump_block block[];
};

struct device_state {
    struct pump_block order;          /* sentinel: order.newer is the least recently migrated */
    uint64_t resident;                /* bytes believed resident (written under the lock, read anywhere) */
    uint64_t migrations;
    uint64_t evicted_unawaited;       /* evicted since the prefetch stream last waited for the evictions */
    uint64_t awaited;                 /* times the prefetch stream waited for the evictions */
};

struct victim {
    uint64_t used, migrated;
    struct pump_block *block;
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct device_state devices[DEVICES_MAX];
static uint64_t resident_total, resident_peak, decisions, blocks_total;
static struct victim *scratch; /* room for every block: victims sorted by use */
static uint64_t scratch_size;

/* The epochs (residency.h): `synced` moves at synchronisations and with `launched`, the
 * safety net's, which alone expires the beliefs of memory the host never touches. */
static _Atomic uint32_t synced = 1, launched = 1;

PUMP_HIDDEN uint32_t pump_epoch_synchronised(void)
{
    PUMP_COUNT(epochs, 1);
    return atomic_fetch_add_explicit(&synced, 1, memory_order_relaxed) + 1;
}

PUMP_HIDDEN uint32_t pump_epoch_advance(void)
{
    /* Also a safety net for a context change pump cannot see (the driver's private tables). */
    pump_context_change_begin();
    pump_context_change_end();
    atomic_fetch_add_explicit(&launched, 1, memory_order_relaxed);
    return pump_epoch_synchronised();
}

/* "Prefetched to device in the current epoch": the whole epoch, a bit for its kind (the
 * synchronisation epoch's, for host-touchable memory), then the device + 1 (1 .. DEVICES_MAX)
 * in the low bits, so no epoch wraps into another's stamp early. */
#define STAMP_DEVICE_BITS 7
_Static_assert(DEVICES_MAX < 1 << STAMP_DEVICE_BITS, "a stamp names every device");

/* A launch's stamps for memory of each kind on its device; 0: none (no such device). */
struct stamps {
    uint64_t host, device;
};

static uint64_t stamp_of(uint32_t epoch, bool host, int device)
{
    return ((uint64_t)epoch << 1 | host) << STAMP_DEVICE_BITS | (uint64_t)(device + 1);
}

static struct stamps resident_stamps(int device)
{
    if (device < 0 || device >= DEVICES_MAX)
        return (struct stamps){0, 0};
    return (struct stamps){stamp_of(atomic_load_explicit(&synced, memory_order_relaxed), true, device),
                           stamp_of(atomic_load_explicit(&launched, memory_order_relaxed), false, device)};
}

static uint64_t stamp_for(const struct pump_range *range, struct stamps s)
{
    return __atomic_load_n(&range->host_touchable, __ATOMIC_RELAXED) ? s.host : s.device;
}

static uint64_t block_start(const struct pump_blocks *a, uint32_t i)
{
    uint64_t start = (a->base / PUMP_BLOCK_SIZE + i) * PUMP_BLOCK_SIZE;
    return start < a->base ? a->base : start;
}

static uint64_t block_bytes(const struct pump_blocks *a, uint32_t i)
{
    uint64_t end = (a->base / PUMP_BLOCK_SIZE + i + 1) * PUMP_BLOCK_SIZE, last = a->base + a->size;
    return (end > last ? last : end) - block_start(a, i);
}

static uint32_t index_of(const struct pump_block *b)
{
    return (uint32_t)(b - b->owner->block);
}

static struct device_state *device_state(int device)
{
    struct device_state *d = &devices[device];
    if (d->order.newer == NULL)
        d->order.newer = d->order.older = &d->order;
    return d;
}

static void publish_resident(void)
{
    PUMP_SET(resident_bytes, resident_total);
    if (resident_total > resident_peak) {
        resident_peak = resident_total;
        PUMP_SET(resident_bytes_peak, resident_peak);
    }
}

static void count_out(struct pump_blocks *a, uint32_t i)
{
    struct pump_block *b = &a->block[i];
    if (b->device < 0)
        return;
    struct device_state *d = &devices[b->device];
    uint64_t bytes = block_bytes(a, i);
    b->older->newer = b->newer;
    b->newer->older = b->older;
    b->older = b->newer = NULL;
    __atomic_store_n(&d->resident, d->resident - bytes, __ATOMIC_RELAXED);
    resident_total -= bytes;
    b->device = -1;
    b->stamp = 0;
    b->ready = 0;
    b->planned_for = 0;
    __atomic_store_n(&a->range->resident_stamp, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&a->range->accounted_on, 0, __ATOMIC_RELAXED);
}

static void count_in(struct pump_blocks *a, uint32_t i, int device)
{
    struct pump_block *b = &a->block[i];
    if (b->device == device)
        return;
    count_out(a, i);
    struct device_state *d = device_state(device);
    b->older = d->order.older;
    b->newer = &d->order;
    d->order.older->newer = b;
    d->order.older = b;
    b->migrated = ++d->migrations;
    b->device = device;
    uint64_t bytes = block_bytes(a, i);
    __atomic_store_n(&d->resident, d->resident + bytes, __ATOMIC_RELAXED);
    resident_total += bytes;
}

/* Brings the range record's summaries in line with its blocks. */
static void refresh(struct pump_blocks *a, int device, uint64_t stamp)
{
    bool counted = true, stamped = stamp != 0;
    for (uint32_t i = 0; i < a->count; i++) {
        counted = counted && a->block[i].device == device;
        stamped = stamped && a->block[i].device == device && a->block[i].stamp == stamp;
    }
    __atomic_store_n(&a->range->accounted_on, counted ? (uint32_t)device + 1 : 0, __ATOMIC_RELAXED);
    __atomic_store_n(&a->range->resident_stamp, stamped ? stamp : 0, __ATOMIC_RELAXED);
}

/* ---- allocations ---- */

/* Moves block b to the newest end of its device's migration order (newest) or to its oldest
 * end, where the next eviction finds it first. */
static void reorder(struct pump_block *b, bool newest)
{
    struct device_state *d = &devices[b->device];
    b->older->newer = b->newer;
    b->newer->older = b->older;
    struct pump_block *after = newest ? d->order.older : &d->order;
    b->older = after;
    b->newer = after->newer;
    after->newer->older = b;
    after->newer = b;
    if (newest)
        b->migrated = ++d->migrations;
}

/* reorder() for every block of range believed resident; false when it has no blocks. */
static bool reorder_range(struct pump_range *range, bool newest)
{
    pthread_mutex_lock(&lock);
    struct pump_blocks *a = range->blocks;
    for (uint32_t i = 0; a != NULL && i < a->count; i++)
        if (a->block[i].device >= 0)
            reorder(&a->block[i], newest);
    pthread_mutex_unlock(&lock);
    return a != NULL;
}

PUMP_HIDDEN bool pump_residency_attach(struct pump_range *range)
{
    /* A tensor that took over a freed one's record (ranges.h): the same memory, which the
     * caching allocator kept on the GPU and pump never discards (torch_trace.c). What of it is
     * still believed resident is a new tensor's now: the newest in the migration order. */
    if (reorder_range(range, true))
        return true;
    uint64_t base = __atomic_load_n(&range->base, __ATOMIC_RELAXED);
    uint64_t size = __atomic_load_n(&range->size, __ATOMIC_RELAXED);
    uint64_t count = (base + size - 1) / PUMP_BLOCK_SIZE - base / PUMP_BLOCK_SIZE + 1;
    struct pump_blocks *a = count <= UINT32_MAX ? calloc(1, sizeof *a + count * sizeof(struct pump_block)) : NULL;
    bool ok = a != NULL;
    if (ok) {
        a->range = range;
        a->base = base;
        a->size = size;
        a->count = (uint32_t)count;
        bool reused = pump_discard_over(base, size) != 0;  /* memory a pool handed out again */
        for (uint32_t i = 0; reused && i < a->count; i++)
            a->block[i].discarded = pump_discard_over(block_start(a, i), block_bytes(a, i));
    }
    pthread_mutex_lock(&lock);
    if (ok && blocks_total + count > scratch_size) {
        uint64_t want = blocks_total + count > 2 * scratch_size ? blocks_total + count : 2 * scratch_size;
        struct victim *grown = realloc(scratch, want * sizeof *grown);
        ok = grown != NULL;
        if (ok) {
            scratch = grown;
            scratch_size = want;
        }
    }
    if (ok) {
        for (uint32_t i = 0; i < a->count; i++) {
            a->block[i].owner = a;
            a->block[i].device = -1;
        }
        blocks_total += count;
        range->blocks = a;
    }
    pthread_mutex_unlock(&lock);
    if (!ok) {
        free(a);
        pump_log_once("no memory for a managed allocation's residency: it is prefetched whole and never budgeted");
    }
    return ok;
}

PUMP_HIDDEN void pump_residency_detach(struct pump_range *range)
{
    pthread_mutex_lock(&lock);
    struct pump_blocks *a = range->blocks;
    if (a != NULL) {
        for (uint32_t i = 0; i < a->count; i++)
            count_out(a, i);
        blocks_total -= a->count;
        range->blocks = NULL;
        publish_resident();
    }
    pthread_mutex_unlock(&lock);
    free(a);
}

PUMP_HIDDEN void pump_residency_freed(struct pump_range *range)
{
    reorder_range(range, false);
}

PUMP_HIDDEN uint64_t pump_residency_resident_bytes(int device)
{
    return device >= 0 && device < DEVICES_MAX ? __atomic_load_n(&devices[device].resident, __ATOMIC_RELAXED) : 0;
}

/* ---- evictions ---- */

struct evictions {
    struct pump_context *c;
    int device;
    CUstream stream;     /* where a fallback use event may be recorded (NULL: none) */
    uint64_t after;      /* a use every eviction here also waits for (0: none) */
    uint64_t fallback;   /* the use waited for when a block's last use is unknown */
    uint32_t n, waits;
    CUdeviceptr ptr[BATCH];
    size_t size[BATCH];
    uint64_t wait[BATCH];
    uint64_t bytes, blocks;
};

static void evictions_flush(struct evictions *e)
{
    if (e->n == 0)
        return;
    for (uint32_t i = 0; i < e->waits; i++)
        pump_evict_after(e->c, e->wait[i]);
    if (pump_evict_to_host(e->c, e->ptr, e->size, e->n)) {
        PUMP_COUNT(bytes_evicted, e->bytes);
        PUMP_COUNT(evictions, e->blocks);
    }
    devices[e->device].evicted_unawaited += e->bytes;
    e->n = e->waits = 0;
    e->bytes = e->blocks = 0;
}

static void add_wait(struct evictions *e, uint64_t token)
{
    for (uint32_t i = 0; i < e->waits; i++)
        if (e->wait[i] == token)
            return;
    if (token != 0)
        e->wait[e->waits++] = token;
}

/* The discard a move of block b must wait for (0: none; it is then known to
 * have run), or PUMP_DISCARD_UNORDERED: one no move can wait for. */
static uint64_t after_discard(struct pump_block *b)
{
    if (b->discarded != 0 && pump_discard_done(b->discarded))
        b->discarded = 0;
    return b->discarded;
}

/* Block i of a leaves the belief now and the GPU after its last user. */
static void evict_block(struct evictions *e, struct pump_blocks *a, uint32_t i)
{
    uint64_t discarded = after_discard(&a->block[i]);
    if (discarded == PUMP_DISCARD_UNORDERED) {
        count_out(a, i);  /* never moved by pump */
        return;
    }
    if (discarded != 0)
        pump_evict_after_discard(e->c, discarded);
    a->block[i].discarded = 0;
    uint64_t token = __atomic_load_n(&a->range->last_use, __ATOMIC_ACQUIRE);
    if (token == 0) {
        /* Used before anything was recorded: after all the stream has so far. */
        if (e->fallback == 0 && e->stream != NULL)
            e->fallback = pump_use_record(e->c, e->stream);
        token = e->fallback;
    }
    if (e->n == BATCH)
        evictions_flush(e);
    if (e->waits + 3 > BATCH)
        evictions_flush(e);
    add_wait(e, token);
    add_wait(e, e->after);
    add_wait(e, a->block[i].ready);  /* a planned prefetch of it no kernel waited for */
    uint64_t start = block_start(a, i), bytes = block_bytes(a, i);
    /* Also when it is not believed resident (a plan's evict range): pages a
     * kernel faulted in move out, and a prefetch of it must not pass that. */
    a->block[i].evicted_in = devices[e->device].awaited + 1;
    if (e->n > 0 && e->ptr[e->n - 1] + e->size[e->n - 1] == start) {
        e->size[e->n - 1] += bytes;
    } else {
        e->ptr[e->n] = start;
        e->size[e->n++] = bytes;
    }
    e->bytes += bytes;
    e->blocks++;
    count_out(a, i);
}

static bool is_protected(const struct pump_block *b, uint64_t decision)
{
    return b->owner->mark == decision || b->mark == decision;
}

static int by_use(const void *x, const void *y)
{
    const struct victim *a = x, *b = y;
    if (a->used != b->used)
        return a->used < b->used ? -1 : 1;
    return a->migrated < b->migrated ? -1 : a->migrated > b->migrated;
}

/* Evicts unprotected blocks of e's device, in `order`, until `need` more
 * bytes fit under `budget` (0: none); true when they fit. */
static bool make_room(struct evictions *e, uint64_t need, uint64_t budget, uint32_t order, uint64_t decision)
{
    struct device_state *d = device_state(e->device);
    if (budget == 0 || d->resident + need <= budget)
        return true;
    if (order == PUMP_ORDER_USED) {
        size_t n = 0;
        for (struct pump_block *b = d->order.newer; b != &d->order; b = b->newer) {
            if (is_protected(b, decision))
                continue;
            /* A freed tensor's blocks first (pump_residency_freed). */
            uint64_t used = __atomic_load_n(&b->owner->range->dead, __ATOMIC_RELAXED)
                                ? 0
                                : __atomic_load_n(&b->owner->range->used_tick, __ATOMIC_RELAXED);
            scratch[n++] = (struct victim){used > b->planned_for ? used : b->planned_for, b->migrated, b};
        }
        qsort(scratch, n, sizeof *scratch, by_use);
        for (size_t i = 0; i < n && d->resident + need > budget; i++)
            evict_block(e, scratch[i].block->owner, index_of(scratch[i].block));
    } else {
        struct pump_block *next;
        for (struct pump_block *b = d->order.newer; b != &d->order && d->resident + need > budget; b = next) {
            next = b->newer;
            if (!is_protected(b, decision))
                evict_block(e, b->owner, index_of(b));
        }
    }
    return d->resident + need <= budget;
}

/* ---- prefetches ---- */

struct prefetches {
    struct pump_context *c;
    int device;
    struct stamps stamps;
    bool from_plan, issued;
    bool after_evictions;  /* a block of it has an eviction the prefetch stream has not waited for */
    uint64_t tick;         /* a plan's prefetch: the launch whose trigger it is (0: none) */
    uint32_t n;
    struct {
        struct pump_blocks *a;
        uint32_t first, count;
    } run[BATCH];
    uint64_t pending;    /* bytes of the runs new to the device */
    uint64_t bytes;
    uint32_t discards;   /* marks of discards the runs' memory must wait for */
    uint64_t discard[BATCH];
};

static void prefetches_flush(struct prefetches *p, struct evictions *e, uint64_t budget)
{
    if (p->n == 0)
        return;
    evictions_flush(e);
    struct device_state *d = &devices[p->device];
    /* Room made by evictions still queued: this prefetch may not pass them. */
    if (p->after_evictions ||
        (budget != 0 && d->evicted_unawaited > 0 && d->resident + p->pending + d->evicted_unawaited > budget)) {
        pump_prefetch_after_evictions(p->c);
        d->evicted_unawaited = 0;
        d->awaited++;
    }
    for (uint32_t k = 0; k < p->discards; k++)
        pump_prefetch_after_discard(p->c, p->discard[k]);
    PUMP_COUNT(prefetch_discard_waits, p->discards);
    CUdeviceptr ptrs[BATCH];
    size_t sizes[BATCH];
    for (uint32_t r = 0; r < p->n; r++) {
        ptrs[r] = block_start(p->run[r].a, p->run[r].first);
        uint64_t last = p->run[r].first + p->run[r].count - 1;
        sizes[r] = (size_t)(block_start(p->run[r].a, (uint32_t)last) + block_bytes(p->run[r].a, (uint32_t)last) -
                            ptrs[r]);
    }
    bool ok = pump_prefetch_to_device(p->c, ptrs, sizes, p->n);
    uint64_t ready = ok && p->from_plan ? pump_prefetch_record(p->c) : 0;
    PUMP_COUNT(prefetch_ranges, p->n);
    PUMP_COUNT(prefetch_bytes, p->bytes);
    if (p->from_plan)
        PUMP_COUNT(plan_prefetch_ranges, p->n);
    for (uint32_t r = 0; ok && r < p->n; r++) {
        struct pump_blocks *a = p->run[r].a;
        uint64_t stamp = stamp_for(a->range, p->stamps);
        for (uint32_t i = p->run[r].first; i < p->run[r].first + p->run[r].count; i++) {
            count_in(a, i, p->device);
            a->block[i].discarded = 0;  /* the prefetch stream is past it */
            a->block[i].stamp = stamp;
            a->block[i].ready = ready;
            if (p->tick != 0)
                a->block[i].planned_for = p->tick;
        }
        /* A plan's prefetch no kernel has waited for yet leaves the lock-free
         * skip off: the next launch rule over it must wait for `ready`. */
        refresh(a, p->device, p->from_plan ? 0 : stamp);
    }
    p->issued = true;
    p->after_evictions = false;
    p->n = p->discards = 0;
    p->pending = p->bytes = 0;
}

static bool holds(const uint64_t *marks, uint32_t n, uint64_t mark)
{
    for (uint32_t k = 0; k < n; k++)
        if (marks[k] == mark)
            return true;
    return false;
}

/* Block i of a, wanted on p's device: false when it cannot fit. */
static bool want_block(struct prefetches *p, struct evictions *e, uint64_t budget, uint32_t order,
                       uint64_t decision, struct pump_blocks *a, uint32_t i, bool may_evict)
{
    struct pump_block *b = &a->block[i];
    if (p->tick != 0 && b->device == p->device)
        b->planned_for = p->tick;  /* named by a trigger: used by it, whether prefetched anew or not */
    uint64_t stamp = stamp_for(a->range, p->stamps);
    if (stamp != 0 && b->device == p->device && b->stamp == stamp)
        return true;  /* prefetched this epoch */
    if (stamp != 0 && b->device == p->device && b->stamp != 0 &&
        !__atomic_load_n(&a->range->host_touchable, __ATOMIC_RELAXED))
        PUMP_COUNT(epoch_reprefetches, 1);  /* only the safety net's epoch expired it */
    uint64_t bytes = block_bytes(a, i), cost = b->device == p->device ? 0 : bytes;
    uint64_t discard = cost > 0 ? after_discard(b) : 0;
    if (discard == PUMP_DISCARD_UNORDERED) {
        PUMP_COUNT(prefetch_discard_skips, 1);
        return true;  /* left to the kernel's faults */
    }
    if (cost > 0 && !may_evict && budget != 0 && device_state(p->device)->resident + p->pending + cost > budget)
        return false;
    if (cost > 0 && may_evict && !make_room(e, p->pending + cost, budget, order, decision))
        return false;
    if (cost > 0 && b->evicted_in == device_state(p->device)->awaited + 1)
        p->after_evictions = true;  /* its eviction may not pass this prefetch */
    bool joins = p->n > 0 && p->run[p->n - 1].a == a && p->run[p->n - 1].first + p->run[p->n - 1].count == i;
    bool new_discard = discard != 0 && !holds(p->discard, p->discards, discard);
    if ((!joins && p->n == BATCH) || (new_discard && p->discards == BATCH)) {
        prefetches_flush(p, e, budget);
        joins = false;
    }
    if (joins) {
        p->run[p->n - 1].count++;
    } else {
        p->run[p->n].a = a;
        p->run[p->n].first = i;
        p->run[p->n++].count = 1;
    }
    if (new_discard)
        p->discard[p->discards++] = discard;
    p->pending += cost;
    p->bytes += bytes;
    return true;
}

/* The allocations one launch (a kernel's own, or a graph replay's) uses. */
struct uses {
    struct pump_range *const *range;
    uint32_t n;
};

static struct uses uses_of(const struct pump_scan *scan)
{
    return (struct uses){scan->range, scan->own};
}

/* Marks the launch's own allocations: never its victims. */
static uint64_t begin_decision(struct uses u)
{
    uint64_t decision = ++decisions;
    for (uint32_t r = 0; r < u.n; r++)
        if (u.range[r]->blocks != NULL)
            u.range[r]->blocks->mark = decision;
    return decision;
}

/* ---- the rules ---- */

/* The allocation's blocks a plan range names, or NULL when the range is not
 * inside a live managed allocation. */
static struct pump_blocks *plan_blocks(const struct pump_plan_range *range, uint32_t *first, uint32_t *last)
{
    uint64_t address = range->address, bytes = range->bytes;
    if (bytes == 0 || address + bytes < address)
        return NULL;
    struct pump_range *r = pump_ranges_find(address);
    struct pump_blocks *a = r != NULL ? r->blocks : NULL;
    if (a == NULL || address < a->base || address + bytes > a->base + a->size)
        return NULL;
    *first = (uint32_t)(address / PUMP_BLOCK_SIZE - a->base / PUMP_BLOCK_SIZE);
    *last = (uint32_t)((address + bytes - 1) / PUMP_BLOCK_SIZE - a->base / PUMP_BLOCK_SIZE);
    return a;
}

/* Marks the blocks of ranges[0 .. n) with the decision: never its victims. */
static void mark_ranges(const struct pump_plan_range *ranges, uint32_t n, uint64_t decision)
{
    for (uint32_t k = 0; k < n; k++) {
        uint32_t first, last;
        struct pump_blocks *a = plan_blocks(&ranges[k], &first, &last);
        for (uint32_t i = first; a != NULL && i <= last; i++)
            a->block[i].mark = decision;
    }
}

/* Ends what a launch takes before its kernel: the moves are enqueued, and the
 * kernel's stream waits for its prefetches, or else for the planned prefetch
 * `ready` names (0: none). Under the lock. True when it prefetched. */
static bool take_done(struct prefetches *p, struct evictions *e, CUstream stream, uint64_t budget, uint64_t ready)
{
    prefetches_flush(p, e, budget);
    evictions_flush(e);
    if (p->issued)
        pump_prefetch_wait(p->c, stream);
    else if (ready != 0 && pump_config.wait)
        pump_use_wait(stream, ready);
    return p->issued;
}

/* Said once per process: a launch whose own blocks pass the budget cannot be
 * held. What does not fit is left to page faults, after other blocks were
 * evicted to make room: slower than no budget at all. */
static void tell_launch_over_budget(uint64_t launch_bytes, uint64_t budget)
{
    if (launch_bytes > budget)
        pump_notice_once("a kernel launch uses %.1f MiB of managed memory, more than the budget of %.1f MiB: "
                         "what does not fit is left to page faults (budget_skips in pump-run --stats), which "
                         "costs more than no budget; set the budget above the largest launch's working set",
                         (double)launch_bytes / (1 << 20), (double)budget / (1 << 20));
}

/* A launch with a plan trigger takes its need ranges instead of its whole
 * allocations: those not believed resident are prefetched (room is made in
 * the plan's order), and the kernel waits for them, or else for the planned
 * prefetch that brought the latest of them, if any. */
static void need_rule(struct pump_context *c, int device, CUstream stream, const struct pump_scan *scan,
                      uint64_t budget, const struct pump_trigger *t)
{
    uint64_t left_out = 0, ready = 0;
    pthread_mutex_lock(&lock);
    uint64_t decision = begin_decision(uses_of(scan));
    mark_ranges(t->range, t->need, decision);
    struct evictions e = {.c = c, .device = device, .stream = stream};
    struct prefetches p = {.c = c, .device = device, .stamps = resident_stamps(device)};
    bool full = false;
    for (uint32_t k = 0; k < t->need; k++) {
        uint32_t first, last;
        struct pump_blocks *a = plan_blocks(&t->range[k], &first, &last);
        for (uint32_t i = first; a != NULL && i <= last; i++) {
            if (a->block[i].device == device && a->block[i].ready > ready)
                ready = a->block[i].ready;
            full = full || !want_block(&p, &e, budget, t->order, decision, a, i, true);
            left_out += full;
        }
    }
    bool prefetched = take_done(&p, &e, stream, budget, ready);
    publish_resident();
    pthread_mutex_unlock(&lock);
    if (prefetched)
        PUMP_COUNT(launches_prefetched, 1);
    if (left_out > 0) {
        PUMP_COUNT(budget_skips, left_out);
        uint64_t need_bytes = 0;
        for (uint32_t k = 0; k < t->need; k++)
            need_bytes += t->range[k].bytes;
        tell_launch_over_budget(need_bytes, budget);
    }
}

/* The launch rule: the blocks of the launch's allocations (also for a launch
 * a plan has no trigger for); the kernel waits for them, or else for the
 * planned prefetch that brought the latest of them, if any. True when it
 * prefetched. */
static bool launch_rule(struct pump_context *c, int device, CUstream stream, struct uses u, uint64_t budget,
                        struct stamps stamps)
{
    pthread_mutex_lock(&lock);
    uint64_t decision = begin_decision(u);
    struct evictions e = {.c = c, .device = device, .stream = stream};
    struct prefetches p = {.c = c, .device = device, .stamps = stamps};
    uint64_t left_out = 0, ready = 0;
    bool full = false;
    for (uint32_t r = 0; r < u.n; r++) {
        struct pump_blocks *a = u.range[r]->blocks;
        for (uint32_t i = 0; a != NULL && i < a->count; i++) {
            if (a->block[i].device == device && a->block[i].ready > ready)
                ready = a->block[i].ready;
            full = full || !want_block(&p, &e, budget, PUMP_ORDER_MIGRATED, decision, a, i, true);
            left_out += full;
        }
    }
    bool prefetched = take_done(&p, &e, stream, budget, ready);
    for (uint32_t r = 0; r < u.n; r++)
        if (u.range[r]->blocks != NULL)
            refresh(u.range[r]->blocks, device, stamp_for(u.range[r], stamps));
    publish_resident();
    pthread_mutex_unlock(&lock);
    if (left_out > 0) {
        PUMP_COUNT(budget_skips, left_out);
        uint64_t launch_bytes = 0;
        for (uint32_t r = 0; r < u.n; r++)
            launch_bytes += __atomic_load_n(&u.range[r]->size, __ATOMIC_RELAXED);
        tell_launch_over_budget(launch_bytes, budget);
    }
    return prefetched;
}

/* The allocations not believed resident on `device` this epoch (their
 * number), counting the others as resident skips. */
static uint32_t launch_todo(struct uses u, struct stamps stamps)
{
    uint32_t todo = 0;
    for (uint32_t r = 0; r < u.n; r++) {
        uint64_t stamp = stamp_for(u.range[r], stamps);
        todo += stamp == 0 || __atomic_load_n(&u.range[r]->resident_stamp, __ATOMIC_RELAXED) != stamp;
    }
    if (todo < u.n)
        PUMP_COUNT(resident_skips, u.n - todo);
    return todo;
}

PUMP_HIDDEN void pump_residency_launch(struct pump_context *c, CUstream stream, const struct pump_scan *scan,
                                       uint64_t budget, const struct pump_trigger *trigger, int *capturing)
{
    int device = pump_context_device(c);
    if (device < 0 || device >= DEVICES_MAX)
        return;
    bool planned = trigger != NULL && trigger->need > 0;
    struct stamps stamps = resident_stamps(device);
    if (!planned && launch_todo(uses_of(scan), stamps) == 0)
        return;
    *capturing = pump_stream_capturing(stream);
    if (*capturing)
        PUMP_COUNT(launches_captured, 1);
    else if (planned)
        need_rule(c, device, stream, scan, budget, trigger);
    else if (launch_rule(c, device, stream, uses_of(scan), budget, stamps))
        PUMP_COUNT(launches_prefetched, 1);
}

PUMP_HIDDEN void pump_residency_graph_launch(struct pump_context *c, CUstream stream,
                                             struct pump_range *const *ranges, uint32_t n, uint64_t budget)
{
    int device = pump_context_device(c);
    if (device < 0 || device >= DEVICES_MAX)
        return;
    struct uses u = {ranges, n};
    struct stamps stamps = resident_stamps(device);
    if (launch_todo(u, stamps) > 0)
        launch_rule(c, device, stream, u, budget, stamps);
}

/* Policy off with a budget: the launch's blocks are counted in (the kernel
 * faults in what it touches), then the oldest others leave until it holds. */
static void off_rule(struct pump_context *c, int device, struct uses u, uint64_t budget, uint64_t token)
{
    uint32_t counted = 0;
    for (uint32_t r = 0; r < u.n; r++)
        counted += __atomic_load_n(&u.range[r]->accounted_on, __ATOMIC_RELAXED) == (uint32_t)device + 1;
    if (counted == u.n)
        return;
    pthread_mutex_lock(&lock);
    uint64_t decision = begin_decision(u);
    for (uint32_t r = 0; r < u.n; r++) {
        struct pump_blocks *a = u.range[r]->blocks;
        if (a == NULL)
            continue;
        for (uint32_t i = 0; i < a->count; i++)
            count_in(a, i, device);
        refresh(a, device, 0);
    }
    struct evictions e = {.c = c, .device = device, .fallback = token};
    make_room(&e, 0, budget, PUMP_ORDER_MIGRATED, decision);
    evictions_flush(&e);
    publish_resident();
    pthread_mutex_unlock(&lock);
}

static void plan_rule(struct pump_context *c, int device, struct uses u, uint64_t budget,
                      uint64_t token, uint64_t tick, const struct pump_trigger *t)
{
    uint64_t skipped = 0, left_out = 0;
    pthread_mutex_lock(&lock);
    uint64_t decision = begin_decision(u);
    struct evictions e = {.c = c, .device = device, .after = token, .fallback = token};
    uint32_t prefetch_from = t->need, evict_from = t->need + t->prefetch;
    for (uint32_t k = evict_from; k < evict_from + t->evict; k++) {
        uint32_t first, last;
        struct pump_blocks *a = plan_blocks(&t->range[k], &first, &last);
        skipped += a == NULL;
        for (uint32_t i = first; a != NULL && i <= last; i++)
            evict_block(&e, a, i);
        if (a != NULL)
            PUMP_COUNT(plan_evict_ranges, 1);
    }
    mark_ranges(t->range + prefetch_from, t->prefetch, decision);
    struct prefetches p = {.c = c, .device = device, .stamps = resident_stamps(device), .from_plan = true,
                           .tick = tick};
    for (uint32_t k = prefetch_from; k < evict_from; k++) {
        uint32_t first, last;
        struct pump_blocks *a = plan_blocks(&t->range[k], &first, &last);
        skipped += a == NULL;
        for (uint32_t i = first; a != NULL && i <= last; i++) {
            left_out += !want_block(&p, &e, budget, t->order, decision, a, i, false);
        }
    }
    prefetches_flush(&p, &e, budget);
    evictions_flush(&e);
    publish_resident();
    pthread_mutex_unlock(&lock);
    if (skipped > 0)
        PUMP_COUNT(plan_ranges_skipped, skipped);
    if (left_out > 0)
        PUMP_COUNT(budget_skips, left_out);
}

/* Over the budget although every rule kept to it: the budget was lowered (the
 * arbiter, `pump` set) or a rule could not help it (policy off's launch larger
 * than the budget). The oldest blocks but this launch's leave. */
static void hold_budget(struct pump_context *c, int device, struct uses u, uint64_t budget, uint64_t token)
{
    pthread_mutex_lock(&lock);
    uint64_t decision = begin_decision(u);
    struct evictions e = {.c = c, .device = device, .fallback = token};
    make_room(&e, 0, budget, PUMP_ORDER_MIGRATED, decision);
    evictions_flush(&e);
    publish_resident();
    pthread_mutex_unlock(&lock);
}

/* After a kernel or a graph replay was enqueued: see pump_residency_after_launch. */
static void after_use(struct pump_context *c, CUstream stream, struct uses u, uint64_t budget, uint64_t tick,
                      const struct pump_trigger *trigger)
{
    uint64_t token = 0;
    if (budget != 0 || (trigger != NULL && trigger->evict > 0))
        token = pump_use_record(c, stream);
    if (budget != 0 && token != 0) {
        for (uint32_t r = 0; r < u.n; r++) {
            struct pump_range *range = u.range[r];
            uint64_t old = __atomic_load_n(&range->last_use, __ATOMIC_RELAXED);
            /* The latest use wins (tokens order by their sequence number). */
            while (old >> PUMP_USE_SEQUENCE_SHIFT < token >> PUMP_USE_SEQUENCE_SHIFT &&
                   !__atomic_compare_exchange_n(&range->last_use, &old, token, true, __ATOMIC_RELEASE,
                                                __ATOMIC_RELAXED)) {
            }
            __atomic_store_n(&range->used_tick, tick, __ATOMIC_RELAXED);
        }
    }
    int device = pump_context_device(c);
    if (device < 0 || device >= DEVICES_MAX)
        return;
    if (pump_config.policy == PUMP_POLICY_OFF && budget != 0)
        off_rule(c, device, u, budget, token);
    if (trigger != NULL)
        plan_rule(c, device, u, budget, token, tick, trigger);
    if (budget != 0 && __atomic_load_n(&devices[device].resident, __ATOMIC_RELAXED) > budget)
        hold_budget(c, device, u, budget, token);
}

PUMP_HIDDEN void pump_residency_after_launch(struct pump_context *c, CUstream stream, const struct pump_scan *scan,
                                             uint64_t budget, uint64_t tick, const struct pump_trigger *trigger)
{
    after_use(c, stream, uses_of(scan), budget, tick, trigger);
}

PUMP_HIDDEN void pump_residency_after_graph_launch(struct pump_context *c, CUstream stream,
                                                   struct pump_range *const *ranges, uint32_t n, uint64_t budget,
                                                   uint64_t tick)
{
    after_use(c, stream, (struct uses){ranges, n}, budget, tick, NULL);
}

PUMP_HIDDEN void pump_residency_before_fork(void)
{
    pthread_mutex_lock(&lock);
}

PUMP_HIDDEN void pump_residency_after_fork(void)
{
    pthread_mutex_unlock(&lock);
}
