/* evict_order.c: the launch rule's victims (PUMP_ORDER_USED) against their
 * definition, the order the rule took when it sorted every resident block of
 * the device at each victim search (until residency_rank.c): freed tensors'
 * blocks first, then by the later of the allocation's last use and the plan
 * trigger that named the block, ties by migration order. Linked with the
 * shim's objects; one device (the rules' locks are taken as the rules take
 * them), and threads recording uses and frees while launches make room. And
 * read-mostly victims, which leave pump's belief without a driver call.
 *   evict_order               random workloads: each search's victims, in
 *                             order, must be the sort's; "evict_order: N
 *                             passed, M failed"
 *   evict_order bench N...    a cyclic job over N resident blocks (every launch
 *                             evicts 8): median ns per decision, kept order and
 *                             sort, a JSON line per N (scripts/bench-evict)
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "expect.h"
#include "residency.h"
#include "residency_evict.h"
#include "residency_rank.h"

#define MiB (1ull << 20)
#define BASE 0x7f0000000000ull


static uint64_t rng = 88172645463325252ull;

static uint64_t rnd(uint64_t n)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng % n;
}

static struct pump_range **ranges;
static uint64_t tick;

/* Allocation k: `blocks` 2 MiB blocks (the last `tail` bytes short when tail > 0). */
static void allocate(uint32_t k, uint32_t blocks, uint64_t tail)
{
    uint64_t base = BASE + (uint64_t)k * 64 * MiB, size = blocks * PUMP_BLOCK_SIZE - tail;
    ranges[k] = pump_ranges_insert(base, size, 1, false, 0);
    if (ranges[k] == NULL || !pump_residency_attach(ranges[k])) {
        fprintf(stderr, "evict_order: no range for allocation %u\n", k);
        exit(2);
    }
}

static void release(uint32_t allocations)
{
    for (uint32_t k = 0; k < allocations; k++) {
        uint64_t size;
        int device;
        pump_residency_detach(ranges[k]);
        __atomic_store_n(&ranges[k]->dead, 0, __ATOMIC_RELAXED);
        pump_ranges_remove(ranges[k]->base, &size, &device);
    }
}

/* ---- the definition: the sort the launch rule made at each victim search ---- */

struct ranked {
    uint64_t used, migrated;
    struct pump_block *block;
};

static int by_use(const void *x, const void *y)
{
    const struct ranked *a = x, *b = y;
    if (a->used != b->used)
        return a->used < b->used ? -1 : 1;
    return a->migrated < b->migrated ? -1 : a->migrated > b->migrated;
}

/* The device's unprotected resident blocks, sorted; their number. */
static size_t sorted(struct ranked *out, uint64_t decision)
{
    size_t n = 0;
    for (struct pump_block *b = pump_devices[0].order.newer; b != &pump_devices[0].order; b = b->newer) {
        if (pump_block_protected(b, decision))
            continue;
        uint64_t used = __atomic_load_n(&b->owner->range->dead, __ATOMIC_RELAXED)
                            ? 0
                            : __atomic_load_n(&b->owner->range->used_tick, __ATOMIC_RELAXED);
        out[n++] = (struct ranked){used > b->planned_for ? used : b->planned_for, b->migrated, b};
    }
    qsort(out, n, sizeof *out, by_use);
    return n;
}

/* The sort's victims: evicted as pump_make_room evicts them. */
static void sort_make_room(struct evictions *e, uint64_t need, uint64_t budget, struct ranked *scratch)
{
    struct pump_device_state *d = &pump_devices[0];
    if (d->resident + need <= budget)
        return;
    size_t n = sorted(scratch, e->dn->number);
    for (size_t i = 0; i < n && d->resident + need > budget; i++)
        pump_evict_block(e, scratch[i].block->owner, (uint32_t)(scratch[i].block - scratch[i].block->owner->block));
}

/* ---- the rules' steps, as residency.c takes them ---- */

/* A launch's use recorded after its kernel (after_use): on the touched lists. */
static void use(struct pump_range *const *r, uint32_t n, uint64_t at)
{
    for (uint32_t k = 0; k < n; k++)
        __atomic_store_n(&r[k]->used_tick, at, __ATOMIC_RELAXED);
    pump_blocks_used(r, n, 0);
}

/* The launch rule over r[0 .. n) at a budget: room made, checked against the sort (check),
 * or with the sort instead (sort), then its blocks counted in. The ns its decision took up to
 * its evictions written down (the locks, the uses since the last rule ranked, the search). */
static double launch(struct pump_range *const *r, uint32_t n, uint64_t budget, bool check, bool sort,
                     struct ranked *scratch)
{
    struct pump_decision dn = {.device = 0};
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    if (!pump_decision_begin(&dn, r, n, NULL, 0))
        exit(2);
    tick++;
    for (uint32_t k = 0; k < n; k++) {
        __atomic_store_n(&r[k]->used_tick, tick, __ATOMIC_RELAXED);
        pump_rank_touched(r[k]->blocks, 0);
    }
    pump_rank_settle(0);
    uint64_t need = 0;
    for (uint32_t k = 0; k < n; k++)
        for (uint32_t i = 0; i < r[k]->blocks->count; i++)
            need += r[k]->blocks->block[i].device == 0 ? 0 : pump_block_bytes(r[k]->blocks, i);
    size_t expected = 0, want = 0;
    if (check) {
        expected = sorted(scratch, dn.number);
        for (uint64_t left = pump_devices[0].resident; want < expected && left + need > budget; want++)
            left -= pump_block_bytes(scratch[want].block->owner,
                                     (uint32_t)(scratch[want].block - scratch[want].block->owner->block));
    }
    struct evictions e = {.dn = &dn};
    if (sort)
        sort_make_room(&e, need, budget, scratch);
    else
        pump_make_room(&e, need, budget, PUMP_ORDER_USED);
    pump_evictions_flush(&e);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if (check) {
        /* The victims in order: each move's blocks, by address (a run is consecutive victims). */
        size_t got = 0;
        bool same = true;
        for (uint32_t m = 0; m < dn.n; m++)
            for (uint32_t r2 = 0; r2 < dn.moves[m].n; r2++)
                for (uint64_t at = dn.moves[m].ptr[r2]; at < dn.moves[m].ptr[r2] + dn.moves[m].size[r2];
                     at = (at / PUMP_BLOCK_SIZE + 1) * PUMP_BLOCK_SIZE) {
                    struct pump_block *b = got < expected ? scratch[got].block : NULL;
                    same = same && b != NULL && pump_block_start(b->owner, (uint32_t)(b - b->owner->block)) == at;
                    got++;
                }
        EXPECT(same && got == want);
    }
    for (uint32_t k = 0; k < n; k++)
        for (uint32_t i = 0; i < r[k]->blocks->count; i++)
            if (pump_devices[0].resident + pump_block_bytes(r[k]->blocks, i) <= budget)
                pump_block_count_in(r[k]->blocks, i, 0);
    free(dn.moves);
    pump_decision_unlock(&dn);
    if (dn.turn != 0)
        pump_turn_end(0);
    return (double)(t1.tv_sec - t0.tv_sec) * 1e9 + (double)(t1.tv_nsec - t0.tv_nsec);
}

/* ---- random workloads, checked ---- */

static void workload(uint32_t allocations, uint64_t budget, uint32_t steps, struct ranked *scratch)
{
    for (uint32_t k = 0; k < allocations; k++)
        allocate(k, 1 + (uint32_t)rnd(6), rnd(3) == 0 ? MiB : 0);
    for (uint32_t s = 0; s < steps; s++) {
        struct pump_range *r[3];
        uint32_t n = 0, pick = (uint32_t)rnd(100);
        for (uint32_t k = 0; k < 3; k++) {
            struct pump_range *c = ranges[rnd(allocations)];
            bool twice = false;
            for (uint32_t j = 0; j < n; j++)
                twice = twice || r[j] == c;
            if (!c->dead && !twice)
                r[n++] = c;
        }
        if (pick < 45 && n > 0) {
            launch(r, n, budget, true, false, scratch);
        } else if (pick < 65 && n > 0) {
            use(r, n, ++tick);  /* a launch that found its blocks resident */
        } else if (pick < 72 && n > 0) {
            use(r, n, tick - rnd(tick < 20 ? tick : 20));  /* a use recorded late by a racing thread */
        } else if (pick < 82 && n > 0) {
            __atomic_store_n(&r[0]->dead, 1, __ATOMIC_RELAXED);  /* freed: the observer's call */
            pump_residency_freed(r[0]);
        } else if (pick < 90) {
            struct pump_range *c = ranges[rnd(allocations)];  /* taken over by the next tensor */
            if (c->dead) {
                __atomic_store_n(&c->dead, 0, __ATOMIC_RELAXED);
                pump_residency_attach(c);
            }
        } else if (n > 0) {
            /* A plan trigger names a resident block (residency.c want_block), under the locks. */
            struct pump_decision dn = {.device = 0};
            pump_decision_begin(&dn, NULL, 0, NULL, 0);
            struct pump_block *b = &r[0]->blocks->block[rnd(r[0]->blocks->count)];
            if (b->device == 0) {
                b->planned_for = ++tick;
                pump_rank_update(b);
            }
            pump_decision_unlock(&dn);
        }
    }
    release(allocations);
}

/* ---- read-mostly memory: left to the driver (residency.h, pump_residency_advised) ---- */

/* A run of an allocation's blocks: from `first`, `blocks` of them. */
struct run {
    uint32_t allocation, first, blocks;
};

/* Makes room for `blocks` blocks at `budget` for allocation 2, as a rule (or, moving_only, as room
 * made ahead does); the decision's moves are checked against want[0 .. n), unless want is NULL. */
static bool room_for(uint32_t blocks, uint64_t budget, bool moving_only, const struct run *want, uint32_t n)
{
    struct pump_decision dn = {.device = 0};
    pump_decision_begin(&dn, &ranges[2], 1, NULL, 0);
    struct evictions e = {.dn = &dn, .moving_only = moving_only};
    bool fit = pump_make_room(&e, blocks * PUMP_BLOCK_SIZE, budget, PUMP_ORDER_USED);
    pump_evictions_flush(&e);
    bool same = n == 0 ? dn.n == 0 : dn.n == 1 && dn.moves[0].evict && dn.moves[0].n == n;
    for (uint32_t k = 0; same && k < n; k++)
        same = dn.moves[0].ptr[k] == ranges[want[k].allocation]->base + want[k].first * PUMP_BLOCK_SIZE &&
               dn.moves[0].size[k] == want[k].blocks * PUMP_BLOCK_SIZE;
    free(dn.moves);
    pump_decision_unlock(&dn);
    if (dn.turn != 0)
        pump_turn_end(0);
    EXPECT(same || want == NULL);
    return fit;
}

/* Three allocations of 4 blocks under a budget of 8 (returned), 0 and 1 resident, 1 the more
 * recently used. */
static uint64_t two_resident(struct ranked *scratch)
{
    uint64_t budget = 8 * PUMP_BLOCK_SIZE;
    for (uint32_t k = 0; k < 3; k++)
        allocate(k, 4, 0);
    launch(&ranges[0], 1, budget, false, false, scratch);
    launch(&ranges[1], 1, budget, false, false, scratch);
    return budget;
}

static int resident_blocks(uint32_t allocation)
{
    int n = 0;
    for (uint32_t i = 0; i < ranges[allocation]->blocks->count; i++)
        n += ranges[allocation]->blocks->block[i].device == 0;
    return n;
}

static void read_mostly(struct ranked *scratch)
{
    uint64_t budget = two_resident(scratch);
    /* Blocks 0 to 2 of allocation 0 wholly, block 3 half: not read-mostly. */
    pump_residency_advised(ranges[0]->base, 3 * PUMP_BLOCK_SIZE + MiB, CU_MEM_ADVISE_SET_READ_MOSTLY);
    /* Blocks whose eviction moves them first, in the order (allocation 0's block 3, then 1's),
     * though allocation 0 is the least recently used. */
    EXPECT(room_for(2, budget, false, (struct run[]){{0, 3, 1}, {1, 0, 1}}, 2));
    EXPECT(resident_blocks(0) == 3 && resident_blocks(1) == 3);
    /* Beyond them, read-mostly blocks leave the belief without a driver call. */
    EXPECT(room_for(6, budget, false, (struct run[]){{1, 1, 3}}, 1));
    EXPECT(resident_blocks(0) == 2 && resident_blocks(1) == 0);
    /* Unset on a byte of block 1: it no longer is; 0 and 2 still are. */
    pump_residency_advised(ranges[0]->base + PUMP_BLOCK_SIZE + 5, 1, CU_MEM_ADVISE_UNSET_READ_MOSTLY);
    EXPECT(ranges[0]->blocks->block[0].read_mostly && !ranges[0]->blocks->block[1].read_mostly &&
           ranges[0]->blocks->block[2].read_mostly && !ranges[0]->blocks->block[3].read_mostly);
    release(3);

    /* A freed tensor's read-mostly blocks, first in the order (the rank heap's top): room made
     * ahead (moving_only) passes over them, and takes what moves (it was handed the same block
     * again and again, for good). */
    two_resident(scratch);
    pump_residency_advised(ranges[0]->base, 4 * PUMP_BLOCK_SIZE, CU_MEM_ADVISE_SET_READ_MOSTLY);
    __atomic_store_n(&ranges[0]->dead, 1, __ATOMIC_RELAXED);
    pump_residency_freed(ranges[0]);
    EXPECT(!room_for(6, budget, true, (struct run[]){{1, 0, 4}}, 1));
    EXPECT(resident_blocks(0) == 4 && resident_blocks(1) == 0);
    EXPECT(room_for(8, budget, false, (struct run[1]){{0, 0, 0}}, 0));  /* a rule's: the driver's to drop */
    EXPECT(resident_blocks(0) == 0);
    release(3);
}

/* ---- dead memory kept where discards take it (pump_rank_dead_left) ---- */

/* Allocations 0 and 1 resident (1 the more recently used), 1 freed; the victim of room for 4
 * blocks for allocation 2. */
static uint32_t dead_victim(struct ranked *scratch)
{
    uint64_t budget = two_resident(scratch);
    __atomic_store_n(&ranges[1]->dead, 1, __ATOMIC_RELAXED);
    pump_residency_freed(ranges[1]);
    EXPECT(room_for(4, budget, false, NULL, 0));
    uint32_t victim = resident_blocks(1) == 0 && resident_blocks(0) == 4 ? 1
                      : resident_blocks(0) == 0 && resident_blocks(1) == 4 ? 0 : 2;
    release(3);
    return victim;
}

static void dead_kept(struct ranked *scratch)
{
    struct pump_device_state *d = &pump_devices[0];
    d->dead_discarded = d->dead_evicted = 0;
    EXPECT(dead_victim(scratch) == 1);  /* nothing discarded: dead blocks first */
    d->dead_discarded = d->dead_evicted = 0;
    pump_rank_dead_left(0, 4 * PUMP_BLOCK_SIZE, true);
    pump_rank_dead_left(0, 3 * PUMP_BLOCK_SIZE, false);
    EXPECT(dead_victim(scratch) == 0);  /* discards take more: by its last use, it stays */
    pump_rank_dead_left(0, 2 * PUMP_BLOCK_SIZE, false);
    EXPECT(dead_victim(scratch) == 1);  /* evictions copy out more again */
    /* Lately: where either passes a GiB, both halve. */
    d->dead_discarded = d->dead_evicted = 0;
    pump_rank_dead_left(0, 1000ull << 20, false);
    pump_rank_dead_left(0, 100ull << 20, true);
    pump_rank_dead_left(0, 100ull << 20, false);
    EXPECT(d->dead_evicted == 550ull << 20 && d->dead_discarded == 50ull << 20);
    d->dead_discarded = d->dead_evicted = 0;
}

/* ---- threads racing the rules (for the sanitizers: no order is checked, a use recorded
 * while a search runs may count from the next) ---- */

struct racer {
    uint64_t rng, tick;
    uint32_t allocations, rounds;
    bool frees;  /* also frees tensors and hands them out again */
};

static void *race(void *arg)
{
    struct racer *r = arg;
    for (uint32_t s = 0; s < r->rounds; s++) {
        r->rng ^= r->rng << 13;
        r->rng ^= r->rng >> 7;
        r->rng ^= r->rng << 17;
        struct pump_range *c = ranges[r->rng % r->allocations];
        if (r->frees && (r->rng >> 32) % 4 == 0) {
            bool dead = __atomic_load_n(&c->dead, __ATOMIC_RELAXED);
            __atomic_store_n(&c->dead, !dead, __ATOMIC_RELAXED);
            if (dead)
                pump_residency_attach(c);
            else
                pump_residency_freed(c);
        } else {
            use(&c, 1, r->tick += 1 + (r->rng >> 40) % 3);
        }
    }
    return NULL;
}

static void races(struct ranked *scratch)
{
    uint32_t allocations = 40;
    for (uint32_t k = 0; k < allocations; k++)
        allocate(k, 1 + (uint32_t)rnd(4), 0);
    struct racer racers[2] = {{.rng = 7, .tick = 1, .allocations = allocations, .rounds = 20000, .frees = true},
                              {.rng = 11, .tick = 2, .allocations = allocations, .rounds = 20000}};
    pthread_t threads[2];
    for (int t = 0; t < 2; t++)
        EXPECT(pthread_create(&threads[t], NULL, race, &racers[t]) == 0);
    for (uint32_t s = 0; s < 5000; s++)
        launch(&ranges[rnd(allocations)], 1, 12 * PUMP_BLOCK_SIZE, false, false, scratch);
    for (int t = 0; t < 2; t++)
        pthread_join(threads[t], NULL);
    release(allocations);
}

/* ---- the benchmark ---- */

/* A job cycling over `blocks` blocks in allocations of 8, one allocation more than the budget
 * holds: every launch evicts the 8 least recently used and brings its own in; it also uses the
 * two allocations before it again (resident). The median ns of a launch's decision over
 * `launches` (a median: the machine's other work preempts a few). */
static int by_value(const void *x, const void *y)
{
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

static double cycle(uint32_t blocks, uint32_t launches, bool sort, struct ranked *scratch)
{
    uint32_t allocations = blocks / 8 + 1;
    for (uint32_t k = 0; k < allocations; k++)
        allocate(k, 8, 0);
    uint64_t budget = (uint64_t)blocks * PUMP_BLOCK_SIZE;
    for (uint32_t k = 0; k < allocations; k++)  /* the first pass fills the device */
        launch(&ranges[k], 1, budget, false, sort, scratch);
    double *ns = malloc(launches * sizeof *ns);
    if (ns == NULL)
        exit(2);
    for (uint32_t l = 0; l < launches; l++) {
        uint32_t k = l % allocations;
        struct pump_range *again[2] = {ranges[(k + allocations - 1) % allocations],
                                       ranges[(k + allocations - 2) % allocations]};
        use(again, 2, ++tick);
        ns[l] = launch(&ranges[k], 1, budget, false, sort, scratch);
    }
    release(allocations);
    qsort(ns, launches, sizeof *ns, by_value);
    double median = ns[launches / 2];
    free(ns);
    return median;
}

int main(int argc, char **argv)
{
    ranges = calloc(PUMP_RANGES_MAX, sizeof *ranges);
    struct ranked *scratch = malloc(PUMP_RANGES_MAX * 8 * sizeof *scratch);
    if (ranges == NULL || scratch == NULL)
        return 2;
    if (argc > 2 && strcmp(argv[1], "bench") == 0) {
        for (int a = 2; a < argc; a++) {
            uint32_t blocks = (uint32_t)strtoul(argv[a], NULL, 10), launches = 2000;
            double sort = cycle(blocks, launches, true, scratch), kept = cycle(blocks, launches, false, scratch);
            printf("{\"resident_blocks\": %u, \"launches\": %u, \"victims_per_search\": 8, "
                   "\"ns_per_search_sort\": %.0f, \"ns_per_search_kept\": %.0f}\n",
                   blocks, launches, sort, kept);
        }
        free(scratch);
        return 0;
    }
    for (uint32_t seed = 1; seed <= 20; seed++) {
        rng = 88172645463325252ull * seed;
        workload(12 + seed * 3, (uint64_t)(4 + seed % 9) * PUMP_BLOCK_SIZE + (seed % 2) * MiB, 1500, scratch);
    }
    for (uint32_t seed = 1; seed <= 3; seed++) {  /* larger heaps */
        rng = 2862933555777941757ull * seed;
        workload(300, (uint64_t)(150 + 50 * seed) * PUMP_BLOCK_SIZE, 20000, scratch);
    }
    read_mostly(scratch);
    dead_kept(scratch);
    races(scratch);
    free(scratch);
    return expect_report("evict_order");
}
