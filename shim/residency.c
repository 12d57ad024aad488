/* residency.c: the rules that decide what moves, and the budget they keep to
 * (see residency.h); the belief they change is residency_blocks.h's.
 *
 * A rule runs only when a launch actually changes the belief: under the locks
 * of its device and of the keepers of the blocks it names (residency_blocks.h)
 * it counts blocks in, chooses victims (least recently migrated, or for a plan
 * with PUMP_ORDER_USED least recently used by a launch, ties broken by
 * migration order) and writes down the moves; it makes their driver calls
 * after leaving every lock, in its device's order of decisions (its turn), so
 * the streams take the moves in the order the belief assumed and a thread
 * launching on another GPU never waits for them. A move the driver refused
 * leaves the belief again. A block taken for a launch is never its victim,
 * nor is a block its trigger prefetches.
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
#include <stdlib.h>

#include "context_cache.h"
#include "residency.h"
#include "residency_blocks.h"

#define BATCH 64 /* ranges per driver call, and waits per eviction batch */

static _Atomic uint64_t decisions;

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
 * synchronisation epoch's, for host-touchable memory), then the device + 1 (1 .. PUMP_DEVICES_MAX)
 * in the low bits, so no epoch wraps into another's stamp early. */
#define STAMP_DEVICE_BITS 7
_Static_assert(PUMP_DEVICES_MAX < 1 << STAMP_DEVICE_BITS, "a stamp names every device");

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
    if (device < 0 || device >= PUMP_DEVICES_MAX)
        return (struct stamps){0, 0};
    return (struct stamps){stamp_of(atomic_load_explicit(&synced, memory_order_relaxed), true, device),
                           stamp_of(atomic_load_explicit(&launched, memory_order_relaxed), false, device)};
}

static uint64_t stamp_for(const struct pump_range *range, struct stamps s)
{
    return __atomic_load_n(&range->host_touchable, __ATOMIC_RELAXED) ? s.host : s.device;
}

static uint32_t index_of(const struct pump_block *b)
{
    return (uint32_t)(b - b->owner->block);
}

/* ---- allocations ---- */

PUMP_HIDDEN bool pump_residency_attach(struct pump_range *range)
{
    return pump_blocks_attach(range);
}

PUMP_HIDDEN void pump_residency_detach(struct pump_range *range)
{
    pump_blocks_detach(range);
}

PUMP_HIDDEN void pump_residency_freed(struct pump_range *range)
{
    if (pump_budget_possible())
        pump_residency_detach(range);
}

/* ---- a decision: the locks it holds and the moves it writes down ---- */

/* One driver call's worth of moves, decided under the locks and made after. */
struct move {
    bool evict;
    bool after_evictions;   /* a prefetch: the prefetch stream first waits for the evictions */
    bool after_prefetches;  /* an eviction: the eviction stream first waits for the prefetch stream (a
                               planned prefetch of a block it evicts is decided, not yet made) */
    bool after_fallback;    /* an eviction of a block whose last use is unknown */
    bool from_plan;
    uint32_t n, waits, discards;
    CUdeviceptr ptr[BATCH];
    size_t size[BATCH];
    uint64_t wait[BATCH];     /* an eviction: the uses it waits for */
    uint64_t discard[BATCH];  /* marks of discards its memory waits for, if still running */
    struct {
        struct pump_range *range;
        struct pump_blocks *a;
        uint32_t first, count;
    } run[BATCH];             /* a prefetch: the blocks it brings */
    uint64_t bytes, blocks;
    bool taken;               /* made: the driver took it */
    uint64_t token;           /* a plan's prefetch, made: the token of its end */
};

struct decision {
    struct pump_context *c;
    int device;
    CUstream stream;     /* where a fallback use may be recorded (NULL: none) */
    uint64_t after;      /* a use every eviction here also waits for (0: none) */
    uint64_t fallback;   /* the use waited for when a block's last use is unknown (0: one recorded on stream) */
    uint64_t number;     /* marks the blocks that are never its victims */
    uint64_t held;       /* the device locks it holds */
    uint64_t turn;       /* its device's turn + 1 (0: none taken: no driver call) */
    uint64_t ready;      /* the kernel waits for this planned prefetch (0: none) */
    bool kernel_waits;   /* a launch's kernel waits for the prefetches */
    uint32_t n;
    struct move *moves;
};

static bool holds(const uint64_t *marks, uint32_t n, uint64_t mark)
{
    for (uint32_t k = 0; k < n; k++)
        if (marks[k] == mark)
            return true;
    return false;
}

static void take_turn(struct decision *dn)
{
    if (dn->turn == 0)
        dn->turn = pump_turn_take(dn->device) + 1;
}

/* Writes down a move; false when there is no memory for it (it is then not made). */
static bool write_down(struct decision *dn, const struct move *m)
{
    struct move *grown = realloc(dn->moves, (dn->n + 1) * sizeof *grown);
    if (grown == NULL) {
        pump_log_once("no memory for a decision's moves: some are not made");
        return false;
    }
    dn->moves = grown;
    dn->moves[dn->n++] = *m;
    take_turn(dn);
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

/* The allocation's blocks a plan range names (claimed for the decision), or
 * NULL when the range is not inside a live managed allocation whose blocks'
 * keepers the decision holds. */
static struct pump_blocks *plan_blocks(struct decision *dn, const struct pump_plan_range *range, uint32_t *first,
                                       uint32_t *last, uint64_t *want)
{
    uint64_t address = range->address, bytes = range->bytes, unused = 0;
    if (bytes == 0 || address + bytes < address)
        return NULL;
    struct pump_range *r = pump_ranges_find(address);
    struct pump_blocks *a = r != NULL ? r->blocks : NULL;
    if (a == NULL || address < a->base || address + bytes > a->base + a->size ||
        !pump_blocks_claim(a, dn->device, dn->held, want != NULL ? want : &unused))
        return NULL;
    *first = (uint32_t)(address / PUMP_BLOCK_SIZE - a->base / PUMP_BLOCK_SIZE);
    *last = (uint32_t)((address + bytes - 1) / PUMP_BLOCK_SIZE - a->base / PUMP_BLOCK_SIZE);
    return a;
}

/* Takes the locks a decision over the launch's allocations and the plan's
 * ranges[0 .. n) needs (residency_blocks.h), and marks the launch's own
 * allocations: never its victims. False when the device cannot be set up. */
static bool decision_begin(struct decision *dn, struct uses u, const struct pump_plan_range *ranges, uint32_t n)
{
    if (!pump_blocks_enter(dn->device))
        return false;
    uint64_t want = 1ull << dn->device;
    for (;;) {
        for (uint32_t r = 0; r < u.n; r++)
            if (u.range[r]->blocks != NULL)
                pump_blocks_keepers(u.range[r]->blocks, &want);
        for (uint32_t k = 0; k < n; k++) {
            struct pump_range *r = ranges[k].bytes != 0 ? pump_ranges_find(ranges[k].address) : NULL;
            if (r != NULL && r->blocks != NULL)
                pump_blocks_keepers(r->blocks, &want);
        }
        dn->held = want;
        pump_devices_lock(dn->held);
        bool all = true;
        for (uint32_t r = 0; r < u.n; r++)
            if (u.range[r]->blocks != NULL)
                all = pump_blocks_claim(u.range[r]->blocks, dn->device, dn->held, &want) && all;
        for (uint32_t k = 0; k < n; k++) {
            uint32_t first, last;
            plan_blocks(dn, &ranges[k], &first, &last, &want);
        }
        if (all && want == dn->held)
            break;
        pump_devices_unlock(dn->held);  /* a block moved to a device not locked: again, with it */
    }
    dn->number = atomic_fetch_add_explicit(&decisions, 1, memory_order_relaxed) + 1;
    for (uint32_t r = 0; r < u.n; r++)
        if (u.range[r]->blocks != NULL)
            u.range[r]->blocks->mark = dn->number;
    return true;
}

static void decision_unlock(struct decision *dn)
{
    pump_blocks_publish();
    pump_devices_unlock(dn->held);
    pump_blocks_leave();
}

/* ---- evictions ---- */

struct evictions {
    struct decision *dn;
    struct move m;
};

static void evictions_flush(struct evictions *e)
{
    if (e->m.n == 0)
        return;
    e->m.evict = true;
    write_down(e->dn, &e->m);
    pump_devices[e->dn->device].evicted_unawaited += e->m.bytes;
    e->m.n = e->m.waits = e->m.discards = 0;
    e->m.bytes = e->m.blocks = 0;
    e->m.after_prefetches = e->m.after_fallback = false;
}

static void add_wait(struct evictions *e, uint64_t token)
{
    if (token == PUMP_READY_PENDING)
        e->m.after_prefetches = true;
    else if (token != 0 && !holds(e->m.wait, e->m.waits, token))
        e->m.wait[e->m.waits++] = token;
}

/* Block i of a leaves the belief now and the GPU after its last user. */
static void evict_block(struct evictions *e, struct pump_blocks *a, uint32_t i)
{
    struct pump_block *b = &a->block[i];
    if (b->discarded == PUMP_DISCARD_UNORDERED) {
        pump_block_count_out(a, i);  /* never moved by pump */
        return;
    }
    if (e->m.n == BATCH || e->m.waits + 2 > BATCH || e->m.discards == BATCH)
        evictions_flush(e);
    if (b->discarded != 0 && !holds(e->m.discard, e->m.discards, b->discarded))
        e->m.discard[e->m.discards++] = b->discarded;
    b->discarded = 0;
    uint64_t token = __atomic_load_n(&a->range->last_use, __ATOMIC_ACQUIRE);
    if (token == 0 && e->dn->fallback == 0)
        e->m.after_fallback = true;  /* used before anything was recorded: after all the stream has so far */
    add_wait(e, token != 0 ? token : e->dn->fallback);
    add_wait(e, e->dn->after);
    add_wait(e, b->ready);  /* a planned prefetch of it no kernel waited for */
    uint64_t start = pump_block_start(a, i), bytes = pump_block_bytes(a, i);
    /* Also when it is not believed resident (a plan's evict range): pages a
     * kernel faulted in move out, and a prefetch of it must not pass that. */
    b->evicted_in = pump_devices[e->dn->device].awaited + 1;
    if (e->m.n > 0 && e->m.ptr[e->m.n - 1] + e->m.size[e->m.n - 1] == start) {
        e->m.size[e->m.n - 1] += bytes;
    } else {
        e->m.ptr[e->m.n] = start;
        e->m.size[e->m.n++] = bytes;
    }
    e->m.bytes += bytes;
    e->m.blocks++;
    pump_block_count_out(a, i);
}

static bool is_protected(const struct pump_block *b, uint64_t decision)
{
    return b->owner->mark == decision || b->mark == decision;
}

static int by_use(const void *x, const void *y)
{
    const struct pump_victim *a = x, *b = y;
    if (a->used != b->used)
        return a->used < b->used ? -1 : 1;
    return a->migrated < b->migrated ? -1 : a->migrated > b->migrated;
}

/* Evicts unprotected blocks of the decision's device, in `order`, until
 * `need` more bytes fit under `budget` (0: none); true when they fit. */
static bool make_room(struct evictions *e, uint64_t need, uint64_t budget, uint32_t order)
{
    struct pump_device_state *d = &pump_devices[e->dn->device];
    uint64_t decision = e->dn->number;
    if (budget == 0 || d->resident + need <= budget)
        return true;
    if (order == PUMP_ORDER_USED) {
        size_t n = 0;
        for (struct pump_block *b = d->order.newer; b != &d->order; b = b->newer) {
            if (is_protected(b, decision))
                continue;
            uint64_t used = __atomic_load_n(&b->owner->range->used_tick, __ATOMIC_RELAXED);
            d->scratch[n++] = (struct pump_victim){used > b->planned_for ? used : b->planned_for, b->migrated, b};
        }
        qsort(d->scratch, n, sizeof *d->scratch, by_use);
        for (size_t i = 0; i < n && d->resident + need > budget; i++)
            evict_block(e, d->scratch[i].block->owner, index_of(d->scratch[i].block));
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
    struct decision *dn;
    struct stamps stamps;
    uint64_t tick;       /* a plan's prefetch: the launch whose trigger it is (0: none) */
    uint64_t pending;    /* bytes of the runs new to the device */
    struct move m;
};

static void prefetches_flush(struct prefetches *p, struct evictions *e, uint64_t budget)
{
    if (p->m.n == 0)
        return;
    evictions_flush(e);
    struct decision *dn = p->dn;
    struct pump_device_state *d = &pump_devices[dn->device];
    /* Room made by evictions still queued: this prefetch may not pass them. */
    if (p->m.after_evictions ||
        (budget != 0 && d->evicted_unawaited > 0 && d->resident + p->pending + d->evicted_unawaited > budget)) {
        p->m.after_evictions = true;
        d->evicted_unawaited = 0;
        d->awaited++;
    }
    for (uint32_t r = 0; r < p->m.n; r++) {
        struct pump_blocks *a = p->m.run[r].a;
        uint32_t last = p->m.run[r].first + p->m.run[r].count - 1;
        p->m.ptr[r] = pump_block_start(a, p->m.run[r].first);
        p->m.size[r] = (size_t)(pump_block_start(a, last) + pump_block_bytes(a, last) - p->m.ptr[r]);
    }
    p->m.evict = false;
    bool written = write_down(dn, &p->m);
    for (uint32_t r = 0; written && r < p->m.n; r++) {
        struct pump_blocks *a = p->m.run[r].a;
        uint64_t stamp = stamp_for(a->range, p->stamps);
        for (uint32_t i = p->m.run[r].first; i < p->m.run[r].first + p->m.run[r].count; i++) {
            pump_block_count_in(a, i, dn->device);
            a->block[i].discarded = 0;  /* the prefetch stream will be past it */
            a->block[i].stamp = stamp;
            a->block[i].brought = dn->turn;
            a->block[i].ready = p->m.from_plan ? PUMP_READY_PENDING : 0;
            if (p->tick != 0)
                a->block[i].planned_for = p->tick;
        }
        /* A plan's prefetch no kernel has waited for yet leaves the lock-free
         * skip off: the next launch rule over it must wait for `ready`. */
        pump_blocks_refresh(a, dn->device, p->m.from_plan ? 0 : stamp);
    }
    p->m.after_evictions = false;
    p->m.n = p->m.discards = 0;
    p->m.bytes = 0;
    p->pending = 0;
}

/* Block i of a, wanted on the decision's device: false when it cannot fit. */
static bool want_block(struct prefetches *p, struct evictions *e, uint64_t budget, uint32_t order,
                       struct pump_blocks *a, uint32_t i, bool may_evict)
{
    struct pump_block *b = &a->block[i];
    int device = p->dn->device;
    if (p->tick != 0 && b->device == device)
        b->planned_for = p->tick;  /* named by a trigger: used by it, whether prefetched anew or not */
    uint64_t stamp = stamp_for(a->range, p->stamps);
    if (stamp != 0 && b->device == device && b->stamp == stamp)
        return true;  /* prefetched this epoch */
    if (stamp != 0 && b->device == device && b->stamp != 0 &&
        !__atomic_load_n(&a->range->host_touchable, __ATOMIC_RELAXED))
        PUMP_COUNT(epoch_reprefetches, 1);  /* only the safety net's epoch expired it */
    uint64_t bytes = pump_block_bytes(a, i), cost = b->device == device ? 0 : bytes;
    uint64_t discard = cost > 0 ? b->discarded : 0;
    if (discard == PUMP_DISCARD_UNORDERED) {
        PUMP_COUNT(prefetch_discard_skips, 1);
        return true;  /* left to the kernel's faults */
    }
    struct pump_device_state *d = &pump_devices[device];
    if (cost > 0 && !may_evict && budget != 0 && d->resident + p->pending + cost > budget)
        return false;
    if (cost > 0 && may_evict && !make_room(e, p->pending + cost, budget, order))
        return false;
    if (cost > 0 && b->evicted_in == d->awaited + 1)
        p->m.after_evictions = true;  /* its eviction may not pass this prefetch */
    bool joins = p->m.n > 0 && p->m.run[p->m.n - 1].a == a && p->m.run[p->m.n - 1].first + p->m.run[p->m.n - 1].count == i;
    bool new_discard = discard != 0 && !holds(p->m.discard, p->m.discards, discard);
    if ((!joins && p->m.n == BATCH) || (new_discard && p->m.discards == BATCH)) {
        prefetches_flush(p, e, budget);
        joins = false;
    }
    if (joins) {
        p->m.run[p->m.n - 1].count++;
    } else {
        p->m.run[p->m.n].range = a->range;
        p->m.run[p->m.n].a = a;
        p->m.run[p->m.n].first = i;
        p->m.run[p->m.n++].count = 1;
    }
    if (new_discard)
        p->m.discard[p->m.discards++] = discard;
    p->pending += cost;
    p->m.bytes += bytes;
    return true;
}

/* ---- the driver calls, after the locks ---- */

static void after_discards(struct pump_context *c, const struct move *m)
{
    for (uint32_t k = 0; k < m->discards; k++) {
        if (pump_discard_done(m->discard[k]))
            continue;
        if (m->evict) {
            pump_evict_after_discard(c, m->discard[k]);
        } else {
            pump_prefetch_after_discard(c, m->discard[k]);
            PUMP_COUNT(prefetch_discard_waits, 1);
        }
    }
}

/* Makes one move's driver calls: true when the driver took it. */
static bool make_move(struct decision *dn, struct move *m, uint64_t *ready)
{
    struct pump_context *c = dn->c;
    after_discards(c, m);
    if (m->evict) {
        if (m->after_fallback && dn->fallback == 0 && dn->stream != NULL)
            dn->fallback = pump_use_record(c, dn->stream);
        if (m->after_fallback && dn->fallback != 0)
            pump_evict_after(c, dn->fallback);
        if (m->after_prefetches)
            pump_evict_after(c, pump_prefetch_record(c));
        for (uint32_t k = 0; k < m->waits; k++)
            pump_evict_after(c, m->wait[k]);
        bool ok = pump_evict_to_host(c, m->ptr, m->size, m->n);
        if (ok) {
            PUMP_COUNT(bytes_evicted, m->bytes);
            PUMP_COUNT(evictions, m->blocks);
        }
        return ok;
    }
    if (m->after_evictions)
        pump_prefetch_after_evictions(c);
    bool ok = pump_prefetch_to_device(c, m->ptr, m->size, m->n);
    *ready = ok && m->from_plan ? pump_prefetch_record(c) : 0;
    PUMP_COUNT(prefetch_ranges, m->n);
    PUMP_COUNT(prefetch_bytes, m->bytes);
    if (m->from_plan)
        PUMP_COUNT(plan_prefetch_ranges, m->n);
    return ok;
}

/* The blocks a made prefetch brought that are still its own: the token its
 * kernel-less prefetch recorded (a plan's), or, when the driver refused it,
 * out of the belief again. Under the decision's device lock. */
static void settle(struct decision *dn, const struct move *m)
{
    for (uint32_t r = 0; r < m->n; r++) {
        struct pump_blocks *a = m->run[r].a;
        if (m->run[r].range->blocks != a)
            continue;  /* freed since */
        for (uint32_t i = m->run[r].first; i < m->run[r].first + m->run[r].count; i++) {
            struct pump_block *b = &a->block[i];
            if (__atomic_load_n(&b->keeper, __ATOMIC_RELAXED) != dn->device || b->device != dn->device ||
                b->brought != dn->turn)
                continue;
            if (!m->taken)
                pump_block_count_out(a, i);
            else
                b->ready = m->token;
        }
    }
}

/* Makes the decision's driver calls in its device's turn, then the kernel's
 * wait: for the prefetches it made, else for the planned prefetch `ready`
 * names. True when it prefetched. */
static bool decision_make(struct decision *dn)
{
    bool prefetched = false, settle_needed = false;
    if (dn->turn != 0)
        pump_turn_wait(dn->device, dn->turn - 1);
    for (uint32_t k = 0; k < dn->n; k++) {
        struct move *m = &dn->moves[k];
        m->taken = make_move(dn, m, &m->token);
        prefetched = prefetched || !m->evict;
        settle_needed = settle_needed || (!m->evict && (!m->taken || m->token != 0));
    }
    if (dn->kernel_waits && (prefetched || dn->ready == PUMP_READY_PENDING))
        pump_prefetch_wait(dn->c, dn->stream);
    else if (dn->kernel_waits && dn->ready != 0 && pump_config.wait)
        pump_use_wait(dn->stream, dn->ready);
    if (dn->turn != 0)
        pump_turn_end(dn->device);
    if (settle_needed && pump_blocks_enter(dn->device)) {
        pump_devices_lock(1ull << dn->device);
        for (uint32_t k = 0; k < dn->n; k++)
            if (!dn->moves[k].evict)
                settle(dn, &dn->moves[k]);
        pump_blocks_publish();
        pump_devices_unlock(1ull << dn->device);
        pump_blocks_leave();
    }
    free(dn->moves);
    return prefetched;
}

/* ---- the rules ---- */

/* Marks the blocks of ranges[0 .. n) with the decision: never its victims. */
static void mark_ranges(struct decision *dn, const struct pump_plan_range *ranges, uint32_t n)
{
    for (uint32_t k = 0; k < n; k++) {
        uint32_t first, last;
        struct pump_blocks *a = plan_blocks(dn, &ranges[k], &first, &last, NULL);
        for (uint32_t i = first; a != NULL && i <= last; i++)
            a->block[i].mark = dn->number;
    }
}

/* Ends what a launch takes before its kernel, under the locks: the moves are
 * written down, and the kernel will wait for its prefetches, or else for the
 * planned prefetch `ready` names (0: none). */
static void take_done(struct prefetches *p, struct evictions *e, uint64_t budget, uint64_t ready)
{
    prefetches_flush(p, e, budget);
    evictions_flush(e);
    p->dn->ready = ready;
    p->dn->kernel_waits = true;
    if (ready == PUMP_READY_PENDING)
        take_turn(p->dn);  /* its wait comes after that prefetch's calls */
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
    struct decision dn = {.c = c, .device = device, .stream = stream};
    if (!decision_begin(&dn, uses_of(scan), t->range, t->need))
        return;
    mark_ranges(&dn, t->range, t->need);
    struct evictions e = {.dn = &dn};
    struct prefetches p = {.dn = &dn, .stamps = resident_stamps(device)};
    bool full = false;
    for (uint32_t k = 0; k < t->need; k++) {
        uint32_t first, last;
        struct pump_blocks *a = plan_blocks(&dn, &t->range[k], &first, &last, NULL);
        for (uint32_t i = first; a != NULL && i <= last; i++) {
            if (a->block[i].device == device && a->block[i].ready > ready)
                ready = a->block[i].ready;
            full = full || !want_block(&p, &e, budget, t->order, a, i, true);
            left_out += full;
        }
    }
    take_done(&p, &e, budget, ready);
    decision_unlock(&dn);
    if (decision_make(&dn))
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
    struct decision dn = {.c = c, .device = device, .stream = stream};
    if (!decision_begin(&dn, u, NULL, 0))
        return false;
    struct evictions e = {.dn = &dn};
    struct prefetches p = {.dn = &dn, .stamps = stamps};
    uint64_t left_out = 0, ready = 0;
    bool full = false;
    for (uint32_t r = 0; r < u.n; r++) {
        struct pump_blocks *a = u.range[r]->blocks;
        for (uint32_t i = 0; a != NULL && i < a->count; i++) {
            if (a->block[i].device == device && a->block[i].ready > ready)
                ready = a->block[i].ready;
            full = full || !want_block(&p, &e, budget, PUMP_ORDER_MIGRATED, a, i, true);
            left_out += full;
        }
    }
    take_done(&p, &e, budget, ready);
    for (uint32_t r = 0; r < u.n; r++)
        if (u.range[r]->blocks != NULL)
            pump_blocks_refresh(u.range[r]->blocks, device, stamp_for(u.range[r], stamps));
    decision_unlock(&dn);
    bool prefetched = decision_make(&dn);
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
    if (device < 0 || device >= PUMP_DEVICES_MAX)
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
    if (device < 0 || device >= PUMP_DEVICES_MAX)
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
    struct decision dn = {.c = c, .device = device, .fallback = token};
    if (!decision_begin(&dn, u, NULL, 0))
        return;
    for (uint32_t r = 0; r < u.n; r++) {
        struct pump_blocks *a = u.range[r]->blocks;
        if (a == NULL)
            continue;
        for (uint32_t i = 0; i < a->count; i++)
            pump_block_count_in(a, i, device);
        pump_blocks_refresh(a, device, 0);
    }
    struct evictions e = {.dn = &dn};
    make_room(&e, 0, budget, PUMP_ORDER_MIGRATED);
    evictions_flush(&e);
    decision_unlock(&dn);
    decision_make(&dn);
}

static void plan_rule(struct pump_context *c, int device, struct uses u, uint64_t budget,
                      uint64_t token, uint64_t tick, const struct pump_trigger *t)
{
    uint64_t skipped = 0, left_out = 0;
    uint32_t prefetch_from = t->need, evict_from = t->need + t->prefetch;
    struct decision dn = {.c = c, .device = device, .after = token, .fallback = token};
    if (!decision_begin(&dn, u, t->range + prefetch_from, t->prefetch + t->evict))
        return;
    struct evictions e = {.dn = &dn};
    for (uint32_t k = evict_from; k < evict_from + t->evict; k++) {
        uint32_t first, last;
        struct pump_blocks *a = plan_blocks(&dn, &t->range[k], &first, &last, NULL);
        skipped += a == NULL;
        for (uint32_t i = first; a != NULL && i <= last; i++)
            evict_block(&e, a, i);
        if (a != NULL)
            PUMP_COUNT(plan_evict_ranges, 1);
    }
    mark_ranges(&dn, t->range + prefetch_from, t->prefetch);
    struct prefetches p = {.dn = &dn, .stamps = resident_stamps(device), .tick = tick, .m.from_plan = true};
    for (uint32_t k = prefetch_from; k < evict_from; k++) {
        uint32_t first, last;
        struct pump_blocks *a = plan_blocks(&dn, &t->range[k], &first, &last, NULL);
        skipped += a == NULL;
        for (uint32_t i = first; a != NULL && i <= last; i++)
            left_out += !want_block(&p, &e, budget, t->order, a, i, false);
    }
    prefetches_flush(&p, &e, budget);
    evictions_flush(&e);
    decision_unlock(&dn);
    decision_make(&dn);
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
    struct decision dn = {.c = c, .device = device, .fallback = token};
    if (!decision_begin(&dn, u, NULL, 0))
        return;
    struct evictions e = {.dn = &dn};
    make_room(&e, 0, budget, PUMP_ORDER_MIGRATED);
    evictions_flush(&e);
    decision_unlock(&dn);
    decision_make(&dn);
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
    if (device < 0 || device >= PUMP_DEVICES_MAX)
        return;
    if (pump_config.policy == PUMP_POLICY_OFF && budget != 0)
        off_rule(c, device, u, budget, token);
    if (trigger != NULL)
        plan_rule(c, device, u, budget, token, tick, trigger);
    if (budget != 0 && __atomic_load_n(&pump_devices[device].resident, __ATOMIC_RELAXED) > budget)
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
    pump_blocks_before_fork();
}

PUMP_HIDDEN void pump_residency_after_fork(void)
{
    pump_blocks_after_fork();
}
