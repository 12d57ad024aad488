/* residency_evict.c: a rule's evictions (see residency_evict.h).
 *
 * Which blocks make room decides how many bytes cross the link, each way: every
 * block evicted is copied to the host (UVM copies back every evicted resident page,
 * uvm_pmm_gpu.c evict_root_chunk) and comes back when used again. The launch rule
 * takes PUMP_ORDER_USED where no plan is in force (residency.c, launch_rule_order):
 * a freed tensor's blocks first (the caching allocator may
 * never hand that memory out again; where discards take dead memory, by its last
 * use: residency_rank.h), then least recently used by a launch. The
 * driver's own order is by residency (its USED list is not reordered on access,
 * devmem.c), which in a training step's cycle evicts what the backward pass is
 * about to read again: on bench-steady's oversubscribed step, pump evicting in the
 * driver's order moved 458 MiB each way against the driver's 402; least recently
 * used, 392 (tests/test_traffic.py holds pump at or under the driver). That order
 * is kept as blocks are used (residency_rank.h): a victim search takes the first
 * k blocks of it, with no sort of the device's blocks.
 */
#include "residency.h"
#include "residency_evict.h"
#include "residency_rank.h"

/* Frees after its latest eviction for which a device still counts as pressed. */
#define PRESSED_FREES 1024

static uint32_t index_of(const struct pump_block *b)
{
    return (uint32_t)(b - b->owner->block);
}

PUMP_HIDDEN void pump_evictions_flush(struct evictions *e)
{
    if (e->m.n == 0)
        return;
    e->m.evict = true;
    pump_decision_write(e->dn, &e->m);
    struct pump_device_state *d = &pump_devices[e->dn->device];
    __atomic_store_n(&d->evicted_at, __atomic_load_n(&d->frees, __ATOMIC_RELAXED) + 1, __ATOMIC_RELAXED);
    e->m.n = e->m.waits = e->m.discards = 0;
    e->m.bytes = e->m.blocks = e->m.dead_bytes = 0;
    e->m.after_prefetches = e->m.after_fallback = false;
}

static void add_wait(struct evictions *e, uint64_t token)
{
    if (token == PUMP_READY_PENDING)
        e->m.after_prefetches = true;
    else if (token != 0 && !pump_marks_hold(e->m.wait, e->m.waits, token))
        e->m.wait[e->m.waits++] = token;
}

/* Block i of a leaves the belief now and the GPU after its last user. */
PUMP_HIDDEN void pump_evict_block(struct evictions *e, struct pump_blocks *a, uint32_t i)
{
    struct pump_block *b = &a->block[i];
    if (pump_block_left_to_driver(b)) {
        pump_block_count_out(a, i);  /* never moved by pump */
        return;
    }
    if (e->m.n == PUMP_MOVE_BATCH || e->m.waits + 3 > PUMP_MOVE_BATCH || e->m.discards == PUMP_MOVE_BATCH)
        pump_evictions_flush(e);
    if (b->discarded != 0 && !pump_marks_hold(e->m.discard, e->m.discards, b->discarded))
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
    struct pump_device_state *d = &pump_devices[e->dn->device];
    d->evicted += bytes;
    b->evicted_in = d->evicted;
    if (e->m.n > 0 && e->m.ptr[e->m.n - 1] + e->m.size[e->m.n - 1] == start) {
        e->m.size[e->m.n - 1] += bytes;
    } else {
        e->m.ptr[e->m.n] = start;
        e->m.size[e->m.n++] = bytes;
    }
    e->m.bytes += bytes;
    e->m.blocks++;
    if (__atomic_load_n(&a->range->dead, __ATOMIC_RELAXED)) {
        e->m.dead_bytes += bytes;
        pump_rank_dead_left(e->dn->device, bytes, false);
    }
    pump_block_count_out(a, i);
}

/* One pass of pump_make_room: with moving_only, no block left to the driver is taken (*left_passed:
 * one was passed over). */
static bool make_room_of(struct evictions *e, uint64_t need, uint64_t budget, uint32_t order, bool moving_only,
                         bool *left_passed)
{
    int device = e->dn->device;
    struct pump_device_state *d = &pump_devices[device];
    uint64_t decision = e->dn->number;
    if (order == PUMP_ORDER_USED) {
        struct pump_rank_walk w;
        pump_rank_walk_begin(&w, device, decision, moving_only);
        struct pump_block *b;
        while (d->resident + need > budget && (b = pump_rank_walk_next(&w, device)) != NULL)
            pump_evict_block(e, b->owner, index_of(b));
        pump_rank_walk_end(&w, device);
        *left_passed = w.left_passed;
    } else {
        struct pump_block *next;
        for (struct pump_block *b = d->order.newer; b != &d->order && d->resident + need > budget; b = next) {
            next = b->newer;
            if (pump_block_protected(b, decision))
                continue;
            if (moving_only && pump_block_left_to_driver(b))
                *left_passed = true;
            else
                pump_evict_block(e, b->owner, index_of(b));
        }
    }
    return d->resident + need <= budget;
}

/* Blocks whose eviction moves them go first. One left to the driver frees room pump believes and
 * the device lacks: the driver makes it when it needs it, evicting in its own order blocks pump
 * believes resident, which then fault (tests/test_traffic.py: with the weights read-mostly on a
 * device a neighbour holds 320 of 512 MiB of, 1,088 faults a step got through when they were
 * taken in the launch rule's order). The second pass walks again only past such a block. */
PUMP_HIDDEN bool pump_make_room(struct evictions *e, uint64_t need, uint64_t budget, uint32_t order)
{
    if (budget == 0 || pump_devices[e->dn->device].resident + need <= budget)
        return true;
    bool left_passed = false;
    return make_room_of(e, need, budget, order, true, &left_passed) ||
           (left_passed && !e->moving_only && make_room_of(e, need, budget, order, false, &left_passed));
}

PUMP_HIDDEN bool pump_residency_pressed(int device)
{
    if (device < 0 || device >= PUMP_DEVICES_MAX)
        return false;
    struct pump_device_state *d = &pump_devices[device];
    uint64_t now = __atomic_add_fetch(&d->frees, 1, __ATOMIC_RELAXED);
    uint64_t at = __atomic_load_n(&d->evicted_at, __ATOMIC_RELAXED);
    return at != 0 && now - at < PRESSED_FREES;
}
