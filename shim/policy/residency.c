/* residency.c: the rules that decide what moves, and the budget they keep to
 * (see residency.h); the belief they change is residency_blocks.h's.
 *
 * A rule runs only when a launch actually changes the belief: under the locks
 * of its device and of the keepers of the blocks it names (residency_blocks.h)
 * it counts blocks in, chooses victims (residency_evict.c: for the launch rule
 * where no plan is in force, and a plan with PUMP_ORDER_USED, freed tensors'
 * blocks first, then least recently used by a launch, ties broken by migration
 * order; for the launch rule under a plan, policy off's emulation and a lowered
 * budget, least recently migrated, the driver's order; the last two, and room made
 * ahead, after the kernel: residency_hold.c, residency_ahead.c)
 * and writes down the moves, whose driver calls are made
 * after every lock is left (residency_moves.h): a thread launching on another
 * GPU never waits for them. A block taken for a launch is never its victim,
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
#include "residency_ahead.h"
#include "residency_evict.h"
#include "residency_hold.h"
#include "residency_rank.h"

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

/* ---- allocations ---- */

PUMP_HIDDEN bool pump_residency_attach(struct pump_range *range)
{
    return pump_blocks_attach(range);
}

PUMP_HIDDEN void pump_residency_detach(struct pump_range *range)
{
    pump_blocks_detach(range);
}

PUMP_HIDDEN void pump_residency_replaced(struct pump_range *const *made, uint32_t m, struct pump_range *const *old,
                                        uint32_t n)
{
    pump_blocks_replace(made, m, old, n);
}

PUMP_HIDDEN void pump_residency_freed(struct pump_range *range)
{
    pump_blocks_reorder(range, false);
}

PUMP_HIDDEN void pump_residency_advised(uint64_t ptr, uint64_t bytes, CUmem_advise advice)
{
    if (advice == CU_MEM_ADVISE_SET_READ_MOSTLY || advice == CU_MEM_ADVISE_UNSET_READ_MOSTLY)
        pump_blocks_read_mostly(ptr, bytes, advice == CU_MEM_ADVISE_SET_READ_MOSTLY);
}

PUMP_HIDDEN uint64_t pump_residency_resident_bytes(int device)
{
    return device >= 0 && device < PUMP_DEVICES_MAX ? __atomic_load_n(&pump_devices[device].resident, __ATOMIC_RELAXED)
                                                    : 0;
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

/* ---- prefetches ---- */

struct prefetches {
    struct pump_decision *dn;
    struct stamps stamps;
    uint64_t tick;       /* a plan's prefetch: the launch whose trigger it is (0: none) */
    uint64_t pending;    /* bytes of the runs new to the device */
    struct pump_move m;
};

static void prefetches_flush(struct prefetches *p, struct evictions *e, uint64_t budget)
{
    if (p->m.n == 0)
        return;
    pump_evictions_flush(e);
    struct pump_decision *dn = p->dn;
    struct pump_device_state *d = &pump_devices[dn->device];
    /* Room made by evictions not yet awaited: this prefetch may not pass those it needs. Where
     * those whose calls were made are room enough, the prefetch stream waits for them alone, on
     * the GPU; else for every eviction decided (those not made yet are made first: a drain,
     * residency_moves.c). */
    uint64_t covered = d->awaited > d->awaited_made ? d->awaited : d->awaited_made;
    if (!p->m.after_evictions && budget != 0 && d->resident + p->pending + (d->evicted - covered) > budget) {
        uint64_t made = __atomic_load_n(&d->evicted_made, __ATOMIC_ACQUIRE);
        if (made > covered && d->resident + p->pending + (d->evicted - made) <= budget) {
            p->m.after_made = true;
            if (!p->m.populate)
                d->awaited_made = made;
        } else {
            p->m.after_evictions = true;
        }
    }
    /* A populate's stream waits, not the prefetch stream (residency_moves.c): what it
     * awaited stays unawaited for the prefetches to come. */
    if (p->m.after_evictions && !p->m.populate)
        d->awaited = d->evicted;
    /* Timed only when every byte is believed on the host, put there by pump: a batch with
     * blocks already resident (an epoch's re-prefetch) moves less than it names. */
    p->m.timeable = !p->m.populate && p->pending == p->m.bytes;
    for (uint32_t r = 0; r < p->m.n; r++) {
        struct pump_blocks *a = p->m.run[r].a;
        uint32_t last = p->m.run[r].first + p->m.run[r].count - 1;
        for (uint32_t i = p->m.run[r].first; i <= last; i++)
            p->m.timeable = p->m.timeable && a->block[i].evicted_in != 0;
        p->m.ptr[r] = pump_block_start(a, p->m.run[r].first);
        p->m.size[r] = (size_t)(pump_block_start(a, last) + pump_block_bytes(a, last) - p->m.ptr[r]);
    }
    p->m.evict = false;
    bool written = pump_decision_write(dn, &p->m);
    for (uint32_t r = 0; written && r < p->m.n; r++) {
        struct pump_blocks *a = p->m.run[r].a;
        uint64_t stamp = stamp_for(a->range, p->stamps);
        for (uint32_t i = p->m.run[r].first; i < p->m.run[r].first + p->m.run[r].count; i++) {
            pump_block_count_in(a, i, dn->device);
            a->block[i].discarded = 0;  /* the prefetch stream will be past it */
            a->block[i].stamp = stamp;
            a->block[i].brought = dn->turn;
            a->block[i].ready = p->m.from_plan ? PUMP_READY_PENDING : 0;
            if (p->tick != 0) {
                a->block[i].planned_for = p->tick;
                pump_rank_update(&a->block[i]);
            }
        }
        /* A plan's prefetch no kernel has waited for yet leaves the lock-free
         * skip off: the next launch rule over it must wait for `ready`. */
        pump_blocks_refresh(a, dn->device, p->m.from_plan ? 0 : stamp);
    }
    p->m.after_evictions = p->m.after_made = p->m.populate = false;
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
    if (p->tick != 0 && b->device == device && b->planned_for != p->tick) {
        b->planned_for = p->tick;  /* named by a trigger: used by it, whether prefetched anew or not */
        pump_rank_update(b);
    }
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
    /* Discarded on the legacy peer: populated on a stream of its own (discard_marks.h). */
    bool populate = discard != 0 && pump_discard_on_peer(discard, p->dn->c);
    if (p->m.n > 0 && p->m.populate != populate)
        prefetches_flush(p, e, budget);
    p->m.populate = populate;
    struct pump_device_state *d = &pump_devices[device];
    if (cost > 0 && !may_evict && budget != 0 && d->resident + p->pending + cost > budget)
        return false;
    if (cost > 0 && may_evict && !pump_make_room(e, p->pending + cost, budget, order))
        return false;
    if (cost > 0 && b->evicted_in > d->awaited)
        p->m.after_evictions = true;  /* its eviction may not pass this prefetch */
    bool joins = p->m.n > 0 && p->m.run[p->m.n - 1].a == a && p->m.run[p->m.n - 1].first + p->m.run[p->m.n - 1].count == i;
    bool new_discard = discard != 0 && !pump_marks_hold(p->m.discard, p->m.discards, discard);
    if ((!joins && p->m.n == PUMP_MOVE_BATCH) || (new_discard && p->m.discards == PUMP_MOVE_BATCH)) {
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

/* ---- the rules ---- */

/* Marks the blocks of ranges[0 .. n) with the decision: never its victims. */
static void mark_ranges(struct pump_decision *dn, const struct pump_plan_range *ranges, uint32_t n)
{
    for (uint32_t k = 0; k < n; k++) {
        uint32_t first, last;
        struct pump_blocks *a = pump_decision_plan_blocks(dn, &ranges[k], &first, &last);
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
    pump_evictions_flush(e);
    p->dn->ready = ready;
    p->dn->kernel_waits = true;
    if (ready == PUMP_READY_PENDING)
        pump_decision_turn(p->dn);  /* its wait comes after that prefetch's calls */
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

/* A launch's blocks taken in order, up to the first that does not fit (left_out counts it
 * and those after it); ready: the latest planned prefetch among those already there. */
struct taking {
    struct prefetches *p;
    struct evictions *e;
    uint64_t budget, ready, left_out;
    uint32_t order;
    bool full;
};

static void take_blocks(struct taking *k, struct pump_blocks *a, uint32_t first, uint32_t last)
{
    int device = k->p->dn->device;
    for (uint32_t i = first; i <= last; i++) {
        if (a->block[i].device == device && a->block[i].ready > k->ready)
            k->ready = a->block[i].ready;
        k->full = k->full || !want_block(k->p, k->e, k->budget, k->order, a, i, true);
        k->left_out += k->full;
    }
}

/* Whether a need range of t lies in a's allocation. */
static bool names_any(const struct pump_trigger *t, const struct pump_blocks *a)
{
    for (uint32_t k = 0; k < t->need; k++)
        if (t->range[k].bytes != 0 && t->range[k].address < a->base + a->size &&
            a->base < t->range[k].address + t->range[k].bytes)
            return true;
    return false;
}

/* A launch with a plan trigger takes its need ranges instead of the allocations
 * they lie in (and its own allocations no need range names whole): those not
 * believed resident are prefetched (room is made in the plan's order), and the
 * kernel waits for them, or else for the planned prefetch that brought the
 * latest of them, if any. */
static void need_rule(struct pump_context *c, int device, CUstream stream, const struct pump_scan *scan,
                      uint64_t budget, const struct pump_trigger *t, bool *moved)
{
    struct pump_decision dn = {.c = c, .device = device, .stream = stream};
    if (!pump_decision_begin(&dn, scan->range, scan->own, t->range, t->need))
        return;
    mark_ranges(&dn, t->range, t->need);
    struct evictions e = {.dn = &dn};
    struct prefetches p = {.dn = &dn, .stamps = resident_stamps(device)};
    struct taking take = {.p = &p, .e = &e, .budget = budget, .order = t->order};
    for (uint32_t n = 0; n < t->need; n++) {
        uint32_t first, last;
        struct pump_blocks *a = pump_decision_plan_blocks(&dn, &t->range[n], &first, &last);
        if (a != NULL)
            take_blocks(&take, a, first, last);
    }
    /* An allocation of the launch's own that no need range names (the plan learned the step
     * from other memory: an allocator placing a tensor elsewhere, a range freed since) is
     * taken whole, as the launch rule would: else its kernel faults it in, and on a full
     * device the driver makes room by evicting blocks the plan placed for launches to come.
     * So is every one where the need was cut (channel.c carries at most half the trigger's
     * ranges): the ranges left out may lie in any of them (a 393-block tensor of a GPT-2
     * replay, named block by block, was taken 128 blocks in and faulted the other 265). */
    for (uint32_t r = 0; r < scan->own; r++) {
        struct pump_blocks *a = scan->range[r]->blocks;
        if (a != NULL && a->count > 0 && (t->need_cut || !names_any(t, a)))
            take_blocks(&take, a, 0, a->count - 1);
    }
    uint64_t left_out = take.left_out;
    take_done(&p, &e, budget, take.ready);
    /* The lock-free skip, as the launch rule's: a trigger's need lies in the launch's own
     * allocations (pumpd knows a launch by them), so a launch whose allocations are all
     * resident and awaited this epoch has nothing to take. */
    for (uint32_t r = 0; r < scan->own; r++)
        if (scan->range[r]->blocks != NULL)
            pump_blocks_refresh(scan->range[r]->blocks, device, stamp_for(scan->range[r], p.stamps));
    pump_decision_unlock(&dn);
    *moved = dn.n > 0 || left_out > 0;
    if (pump_decision_make(&dn))
        PUMP_COUNT(launches_prefetched, 1);
    if (left_out > 0) {
        PUMP_COUNT(budget_skips, left_out);
        uint64_t need_bytes = 0;
        for (uint32_t k = 0; k < t->need; k++)
            need_bytes += t->range[k].bytes;
        tell_launch_over_budget(need_bytes, budget);
    }
}

/* The launch rule's victims: least recently used (freed tensors first) where no plan is in
 * force; under a plan (lookahead), in migration order, as before: the plan's prefetches for
 * launches to come rank by the trigger that named them, older than what the launches since
 * used, and least recently used could take them before their use. */
static uint32_t launch_rule_order(void)
{
    struct pump_channel *channel = pump_channel_get();
    bool planned = channel != NULL && channel->plan != NULL &&
                   __atomic_load_n(&channel->plan->trigger_count, __ATOMIC_ACQUIRE) > 0;
    return planned ? PUMP_ORDER_MIGRATED : PUMP_ORDER_USED;
}

/* The launch rule: the blocks of the launch's allocations (also for a launch
 * a plan has no trigger for); the kernel waits for them, or else for the
 * planned prefetch that brought the latest of them, if any. True when it
 * prefetched. */
static bool launch_rule(struct pump_context *c, int device, CUstream stream, struct uses u, uint64_t budget,
                        struct stamps stamps, bool *moved)
{
    struct pump_decision dn = {.c = c, .device = device, .stream = stream};
    if (!pump_decision_begin(&dn, u.range, u.n, NULL, 0))
        return false;
    struct evictions e = {.dn = &dn};
    struct prefetches p = {.dn = &dn, .stamps = stamps};
    uint32_t order = launch_rule_order();
    struct taking take = {.p = &p, .e = &e, .budget = budget, .order = order};
    uint64_t counted_before = pump_devices[device].counted_in, evicted_before = pump_devices[device].evicted;
    /* Its allocations count as used from now, not from when its kernel's use is recorded: a
     * launch racing on another thread must not take what this one brings in as the least
     * recently used. */
    uint64_t now = PUMP_COUNT(launches_managed, 0);
    for (uint32_t r = 0; r < u.n; r++) {
        if (__atomic_load_n(&u.range[r]->used_tick, __ATOMIC_RELAXED) >= now)
            continue;
        __atomic_store_n(&u.range[r]->used_tick, now, __ATOMIC_RELAXED);
        /* Its blocks are kept by the devices they are on, whose locks the decision holds. */
        struct pump_blocks *a = u.range[r]->blocks;
        uint64_t on = a != NULL ? dn.held & __atomic_load_n(&a->devices, __ATOMIC_RELAXED) : 0;
        for (; on != 0; on &= on - 1)
            pump_rank_touched(a, __builtin_ctzll(on));
    }
    pump_rank_settle(device);
    for (uint32_t r = 0; r < u.n; r++) {
        struct pump_blocks *a = u.range[r]->blocks;
        if (a != NULL && a->count > 0)
            take_blocks(&take, a, 0, a->count - 1);
    }
    uint64_t left_out = take.left_out;
    take_done(&p, &e, budget, take.ready);
    if (budget != 0 && pump_config.evict_ahead && order == PUMP_ORDER_USED)  /* where room is made ahead */
        pump_ahead_learn(device, pump_devices[device].counted_in - counted_before,
                         pump_devices[device].evicted > evicted_before, budget);
    for (uint32_t r = 0; r < u.n; r++)
        if (u.range[r]->blocks != NULL)
            pump_blocks_refresh(u.range[r]->blocks, device, stamp_for(u.range[r], stamps));
    pump_decision_unlock(&dn);
    *moved = dn.n > 0 || left_out > 0;
    bool prefetched = pump_decision_make(&dn);
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
    bool planned = trigger != NULL && trigger->need > 0, moved = false;
    struct stamps stamps = resident_stamps(device);
    if (launch_todo(uses_of(scan), stamps) > 0) {
        *capturing = pump_stream_capturing(stream);
        if (*capturing)
            PUMP_COUNT(launches_captured, 1);
        else if (planned)
            need_rule(c, device, stream, scan, budget, trigger, &moved);
        else if (launch_rule(c, device, stream, uses_of(scan), budget, stamps, &moved))
            PUMP_COUNT(launches_prefetched, 1);
    }
    /* Under a plan with triggers: the launch found what it uses where the plan put it. */
    if (!moved && *capturing <= 0 && launch_rule_order() == PUMP_ORDER_MIGRATED)
        PUMP_COUNT(launches_planned, 1);
}

PUMP_HIDDEN void pump_residency_graph_launch(struct pump_context *c, CUstream stream,
                                             struct pump_range *const *ranges, uint32_t n, uint64_t budget)
{
    int device = pump_context_device(c);
    if (device < 0 || device >= PUMP_DEVICES_MAX)
        return;
    struct uses u = {ranges, n};
    struct stamps stamps = resident_stamps(device);
    bool moved;
    if (launch_todo(u, stamps) > 0)
        launch_rule(c, device, stream, u, budget, stamps, &moved);
}

static void plan_rule(struct pump_context *c, int device, struct uses u, uint64_t budget,
                      uint64_t token, uint64_t tick, const struct pump_trigger *t)
{
    uint64_t skipped = 0, left_out = 0;
    uint32_t prefetch_from = t->need, evict_from = t->need + t->prefetch;
    struct pump_decision dn = {.c = c, .device = device, .after = token, .fallback = token};
    if (!pump_decision_begin(&dn, u.range, u.n, t->range + prefetch_from, t->prefetch + t->evict))
        return;
    struct evictions e = {.dn = &dn, .m.from_plan = true};
    for (uint32_t k = evict_from; k < evict_from + t->evict; k++) {
        uint32_t first, last;
        struct pump_blocks *a = pump_decision_plan_blocks(&dn, &t->range[k], &first, &last);
        skipped += a == NULL;
        for (uint32_t i = first; a != NULL && i <= last; i++)
            pump_evict_block(&e, a, i);
        if (a != NULL)
            PUMP_COUNT(plan_evict_ranges, 1);
    }
    mark_ranges(&dn, t->range + prefetch_from, t->prefetch);
    struct prefetches p = {.dn = &dn, .stamps = resident_stamps(device), .tick = tick, .m.from_plan = true};
    for (uint32_t k = prefetch_from; k < evict_from; k++) {
        uint32_t first, last;
        struct pump_blocks *a = pump_decision_plan_blocks(&dn, &t->range[k], &first, &last);
        skipped += a == NULL;
        for (uint32_t i = first; a != NULL && i <= last; i++)
            left_out += !want_block(&p, &e, budget, t->order, a, i, false);
    }
    prefetches_flush(&p, &e, budget);
    pump_evictions_flush(&e);
    pump_decision_unlock(&dn);
    pump_decision_make(&dn);
    if (skipped > 0)
        PUMP_COUNT(plan_ranges_skipped, skipped);
    if (left_out > 0)
        PUMP_COUNT(plan_prefetch_skips, left_out);  /* not faults: the launch that needs them takes them */
}

/* After a kernel or a graph replay was enqueued: see pump_residency_after_launch. */
static void after_use(struct pump_context *c, CUstream stream, struct uses u, uint64_t budget, uint64_t tick,
                      const struct pump_trigger *trigger)
{
    uint64_t token = 0;
    bool used = false;  /* an allocation's used_tick changed */
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
            used = used || __atomic_load_n(&range->used_tick, __ATOMIC_RELAXED) != tick;
            __atomic_store_n(&range->used_tick, tick, __ATOMIC_RELAXED);
        }
    }
    int device = pump_context_device(c);
    if (device < 0 || device >= PUMP_DEVICES_MAX)
        return;
    if (used)
        pump_blocks_used(u.range, u.n, device);
    if (pump_config.policy == PUMP_POLICY_OFF && budget != 0)
        pump_off_rule(c, device, u.range, u.n, budget, token);
    if (trigger != NULL && trigger->prefetch + trigger->evict > 0)
        plan_rule(c, device, u, budget, token, tick, trigger);
    if (budget != 0 && __atomic_load_n(&pump_devices[device].resident, __ATOMIC_RELAXED) > budget)
        pump_hold_budget(c, device, u.range, u.n, budget, token);
    else if (budget != 0 && pump_config.evict_ahead && pump_config.policy == PUMP_POLICY_LAUNCH &&
             launch_rule_order() == PUMP_ORDER_USED)
        pump_ahead_evict(c, device, u.range, u.n, budget, token);
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

PUMP_HIDDEN void pump_residency_after_fork(bool child)
{
    pump_blocks_after_fork(child);
}
