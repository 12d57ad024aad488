/* residency_rank.c: each device's blocks in PUMP_ORDER_USED's victim order
 * (see residency_rank.h).
 *
 * Blocks rank as they are used, so nearly every block takes its place at the
 * newest end: a list in victim order (oldest first) holds them, and the
 * victim search walks it from the oldest end. A block whose rank comes out
 * older than the list's newest (a freed tensor's, rank 0; a block a plan
 * trigger names, ranked by that launch but migrated before others it ranked;
 * a use recorded late by a racing thread) goes to a heap instead, in the same
 * order. The next victim is the older of the list's first and the heap's top:
 * choosing k victims costs O(k) steps of the list (O(k log h) over a heap of
 * h blocks), ranking a block O(1) (O(log h)), and the order is the one the
 * launch rule had when it sorted the device's blocks at each victim search.
 *
 * A launch's use stores its allocations' used_tick without a lock (residency.c);
 * the allocation is put on the device's touched list, and its blocks take
 * their places at the device's next settle, before any victim search or rule:
 * an allocation a thousand launches use between two searches is ranked once.
 */
#include <stdlib.h>

#include "residency_rank.h"

/* Where either count of dead bytes, discarded or evicted, passes it, both are halved: "lately"
 * is about the last GiB (GPT-2 small at a 50% budget frees about 2 GB of whole blocks a step). */
#define DEAD_WINDOW (1ull << 30)

PUMP_HIDDEN void pump_rank_dead_left(int device, uint64_t bytes, bool discarded)
{
    if (device < 0 || device >= PUMP_DEVICES_MAX)
        return;
    struct pump_device_state *d = &pump_devices[device];
    if (__atomic_add_fetch(discarded ? &d->dead_discarded : &d->dead_evicted, bytes, __ATOMIC_RELAXED) <= DEAD_WINDOW)
        return;
    /* a racing add may be halved or not: a ratio of recent bytes, approximately */
    __atomic_fetch_sub(&d->dead_discarded, __atomic_load_n(&d->dead_discarded, __ATOMIC_RELAXED) / 2, __ATOMIC_RELAXED);
    __atomic_fetch_sub(&d->dead_evicted, __atomic_load_n(&d->dead_evicted, __ATOMIC_RELAXED) / 2, __ATOMIC_RELAXED);
}

static bool dead_kept(const struct pump_device_state *d)
{
    uint64_t discarded = __atomic_load_n(&d->dead_discarded, __ATOMIC_RELAXED);
    return discarded != 0 && discarded >= __atomic_load_n(&d->dead_evicted, __ATOMIC_RELAXED);
}

static uint64_t rank_of(const struct pump_block *b)
{
    const struct pump_range *range = b->owner->range;
    /* A freed tensor's last use counts for nothing, unless its device keeps dead memory. */
    uint64_t used = __atomic_load_n(&range->dead, __ATOMIC_RELAXED) && !dead_kept(&pump_devices[b->device])
                        ? 0
                        : __atomic_load_n(&range->used_tick, __ATOMIC_RELAXED);
    return used > b->planned_for ? used : b->planned_for;
}

/* Whether x goes before y. Ranks are cached (`rank`), migrated is unique per device. */
static bool older(const struct pump_block *x, const struct pump_block *y)
{
    return x->rank != y->rank ? x->rank < y->rank : x->migrated < y->migrated;
}

/* ---- the heap ---- */

static void heap_set(struct pump_device_state *d, uint32_t at, struct pump_block *b)
{
    d->heap[at] = b;
    b->heap_at = at + 1;
}

static void sift_up(struct pump_device_state *d, uint32_t at)
{
    struct pump_block *b = d->heap[at];
    while (at > 0 && older(b, d->heap[(at - 1) / 2])) {
        heap_set(d, at, d->heap[(at - 1) / 2]);
        at = (at - 1) / 2;
    }
    heap_set(d, at, b);
}

static void sift_down(struct pump_device_state *d, uint32_t at)
{
    struct pump_block *b = d->heap[at];
    for (;;) {
        uint32_t child = 2 * at + 1;
        if (child >= d->heap_n)
            break;
        if (child + 1 < d->heap_n && older(d->heap[child + 1], d->heap[child]))
            child++;
        if (!older(d->heap[child], b))
            break;
        heap_set(d, at, d->heap[child]);
        at = child;
    }
    heap_set(d, at, b);
}

static void heap_push(struct pump_device_state *d, struct pump_block *b)
{
    heap_set(d, d->heap_n++, b);
    sift_up(d, d->heap_n - 1);
}

static void heap_remove(struct pump_device_state *d, struct pump_block *b)
{
    uint32_t at = b->heap_at - 1;
    b->heap_at = 0;
    struct pump_block *last = d->heap[--d->heap_n];
    if (last == b)
        return;
    heap_set(d, at, last);
    sift_up(d, at);
    sift_down(d, last->heap_at - 1);
}

/* ---- placing ---- */

/* b, in neither, takes its place by its cached rank. */
static void place(struct pump_device_state *d, struct pump_block *b)
{
    struct pump_block *newest = d->used.older_used;
    if (newest != &d->used && older(b, newest)) {
        heap_push(d, b);
        return;
    }
    b->older_used = newest;
    b->newer_used = &d->used;
    newest->newer_used = b;
    d->used.older_used = b;
}

static void take_out(struct pump_device_state *d, struct pump_block *b)
{
    if (b->heap_at != 0) {
        heap_remove(d, b);
    } else if (b->older_used != NULL) {
        b->older_used->newer_used = b->newer_used;
        b->newer_used->older_used = b->older_used;
        b->older_used = b->newer_used = NULL;
    }
}

PUMP_HIDDEN void pump_rank_join(struct pump_block *b)
{
    b->rank = rank_of(b);
    place(&pump_devices[b->device], b);
}

PUMP_HIDDEN void pump_rank_leave(struct pump_block *b)
{
    take_out(&pump_devices[b->device], b);
}

PUMP_HIDDEN void pump_rank_update(struct pump_block *b)
{
    struct pump_device_state *d = &pump_devices[b->device];
    take_out(d, b);
    b->rank = rank_of(b);
    place(d, b);
}

/* ---- touched allocations ---- */

PUMP_HIDDEN void pump_rank_touched(struct pump_blocks *a, int device)
{
    uint64_t bit = 1ull << device;
    if (__atomic_fetch_or(&a->touched, bit, __ATOMIC_RELAXED) & bit)
        return;  /* already on the list */
    struct pump_device_state *d = &pump_devices[device];
    d->touched[d->touched_n++] = a;
}

static int by_place(const void *x, const void *y)
{
    const struct pump_block *a = *(struct pump_block *const *)x, *b = *(struct pump_block *const *)y;
    return older(a, b) ? -1 : older(b, a);
}

PUMP_HIDDEN void pump_rank_settle(int device)
{
    struct pump_device_state *d = &pump_devices[device];
    size_t n = 0;
    for (uint32_t k = 0; k < d->touched_n; k++) {
        struct pump_blocks *a = d->touched[k];
        __atomic_fetch_and(&a->touched, ~(1ull << device), __ATOMIC_RELAXED);
        for (uint32_t i = 0; i < a->count; i++) {
            struct pump_block *b = &a->block[i];
            uint64_t rank = b->device == device ? rank_of(b) : b->rank;
            if (rank == b->rank)
                continue;
            take_out(d, b);
            b->rank = rank;
            d->batch[n++] = b;
        }
    }
    d->touched_n = 0;
    /* In victim order, so that a launch's blocks, ranked alike, join the list's newest end. */
    qsort(d->batch, n, sizeof *d->batch, by_place);
    for (size_t k = 0; k < n; k++)
        place(d, d->batch[k]);
}

PUMP_HIDDEN void pump_rank_forget(struct pump_blocks *a)
{
    uint64_t touched = __atomic_load_n(&a->touched, __ATOMIC_RELAXED);
    for (int device = 0; touched != 0 && device < PUMP_DEVICES_MAX; device++) {
        if (!(touched & 1ull << device))
            continue;
        struct pump_device_state *d = &pump_devices[device];
        for (uint32_t k = 0; k < d->touched_n; k++)
            if (d->touched[k] == a)
                d->touched[k--] = d->touched[--d->touched_n];
    }
    __atomic_store_n(&a->touched, 0, __ATOMIC_RELAXED);
}

/* ---- the victim search ---- */

PUMP_HIDDEN void pump_rank_walk_begin(struct pump_rank_walk *w, int device, uint64_t decision, bool moving_only)
{
    pump_rank_settle(device);
    *w = (struct pump_rank_walk){
        .next = pump_devices[device].used.newer_used, .decision = decision, .moving_only = moving_only};
}

static bool passed_over(struct pump_rank_walk *w, const struct pump_block *b)
{
    if (pump_block_protected(b, w->decision))
        return true;
    bool left = w->moving_only && pump_block_left_to_driver(b);
    w->left_passed |= left;
    return left;
}

PUMP_HIDDEN struct pump_block *pump_rank_walk_next(struct pump_rank_walk *w, int device)
{
    struct pump_device_state *d = &pump_devices[device];
    while (w->next != &d->used && passed_over(w, w->next))
        w->next = w->next->newer_used;
    while (d->heap_n > 0 && passed_over(w, d->heap[0])) {
        struct pump_block *b = d->heap[0];
        heap_remove(d, b);
        b->newer_used = w->aside;
        w->aside = b;
    }
    struct pump_block *listed = w->next != &d->used ? w->next : NULL;
    struct pump_block *top = d->heap_n > 0 ? d->heap[0] : NULL;
    if (listed != NULL && (top == NULL || older(listed, top))) {
        w->next = listed->newer_used;
        return listed;
    }
    return top;
}

PUMP_HIDDEN void pump_rank_walk_end(struct pump_rank_walk *w, int device)
{
    struct pump_device_state *d = &pump_devices[device];
    while (w->aside != NULL) {
        struct pump_block *b = w->aside;
        w->aside = b->newer_used;
        b->newer_used = NULL;
        heap_push(d, b);
    }
}
