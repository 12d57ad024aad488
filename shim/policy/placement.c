/* placement.c: where pump's allocator for PyTorch puts each tensor (issue 41, item 1).
 *
 * pumpd's lookahead plans by launch key: a kernel and the addresses of the allocations it is
 * given (pump_channel.h). A training step repeats its kernels and its allocations size for
 * size, but an allocator hands a step's tensors other addresses unless something holds them:
 * under PyTorch's caching allocator 16% of the tiny GPT's launches kept their key from one step
 * to the next, and under pump's allocator with a pool that hands out the block freed last
 * (FAKECUDA_POOL_REUSE=freed) 52%: a block freed in one order and taken in another changes
 * hands every step. So pump's allocator (torch_allocator.c) keeps the blocks PyTorch frees
 * (managed_all_cache.h) and asks here where each allocation goes:
 *
 * - Steps are the optimizer's: pump_torch_step, called after each optimizer step by pump's
 *   start-up hook (torch.optim's global step hook). Before the first nothing is placed.
 * - A device's allocations since the last step are numbered. The n-th of this step is the same
 *   allocation as the n-th of an earlier step when every allocation before it had the same size
 *   and stream in both: the steps agree so far. Of the last PAST steps the latest that agrees
 *   gives the address. An evaluation pass or a checkpoint save between two training steps makes
 *   a step that agrees with none; the training step after it agrees with the one before it.
 * - An allocation without a place, or whose place is taken, may take any kept block of its
 *   size that the agreeing step put no later allocation at (pump_placement_reserved).
 *
 * Bookkeeping only, under a lock per device, never held across a driver call.
 */
#include <pthread.h>
#include <stdlib.h>

#include "locks.h"
#include "placement.h"

#define PAST 4                      /* earlier steps a step may agree with */
#define ORDINALS_MAX (1u << 20)     /* a step's allocations placed on a device; a longer step is not */

struct placed {
    uint64_t size;
    CUstream stream;
    CUdeviceptr ptr;
};

/* One step's allocations on a device, in order; an earlier step's also by address: the last
 * number each address had (open addressing, `slots` a power of two, at most half full). */
struct record {
    struct placed *at;
    uint32_t n, room;
    CUdeviceptr *keys;
    uint32_t *last;
    uint32_t slots;
};

struct places {
    pthread_mutex_t lock;
    struct record now;          /* this step's */
    struct record past[PAST];   /* earlier steps' */
    uint32_t newest;            /* past[newest] is the latest */
    uint32_t valid, agree;      /* bit i: past[i] holds a step; ... agrees with `now` so far */
    bool overflowed;            /* this step outgrew ORDINALS_MAX (said once) */
    uint64_t generation;        /* steps ended here: a place asked before the last end names nothing now */
};

static struct places places[PUMP_DEVICES_MAX] = {
    [0 ... PUMP_DEVICES_MAX - 1] = {.lock = PTHREAD_MUTEX_INITIALIZER},
};
static _Atomic uint64_t steps;

PUMP_HIDDEN uint64_t pump_placement_steps(void)
{
    return atomic_load_explicit(&steps, memory_order_acquire);
}

static uint32_t home(CUdeviceptr ptr, uint32_t slots)
{
    return (uint32_t)((ptr * 0x9E3779B97F4A7C15ull) >> 40) & (slots - 1);
}

/* The last number ptr had in r, or -1. */
static int64_t last_at(const struct record *r, CUdeviceptr ptr)
{
    if (r->slots == 0 || ptr == 0)
        return -1;
    for (uint32_t i = home(ptr, r->slots);; i = (i + 1) & (r->slots - 1)) {
        if (r->keys[i] == ptr)
            return r->last[i];
        if (r->keys[i] == 0)
            return -1;
    }
}

/* r's addresses indexed, once it is an earlier step; false without memory (r then agrees with
 * nothing: it is dropped). */
static bool index_record(struct record *r)
{
    uint32_t slots = 16;
    while (slots < 2 * r->n)
        slots *= 2;
    if (slots > r->slots) {
        CUdeviceptr *keys = realloc(r->keys, slots * sizeof *keys);
        if (keys != NULL)
            r->keys = keys;
        uint32_t *last = keys != NULL ? realloc(r->last, slots * sizeof *last) : NULL;
        if (last == NULL)
            return false;
        r->last = last;
        r->slots = slots;
    }
    for (uint32_t i = 0; i < r->slots; i++)
        r->keys[i] = 0;
    for (uint32_t k = 0; k < r->n; k++) {
        CUdeviceptr ptr = r->at[k].ptr;
        if (ptr == 0)
            continue;
        uint32_t i = home(ptr, r->slots);
        while (r->keys[i] != 0 && r->keys[i] != ptr)
            i = (i + 1) & (r->slots - 1);
        r->keys[i] = ptr;
        r->last[i] = k;
    }
    return true;
}

/* Under p's lock: this step's record becomes the newest earlier one (the oldest's memory is
 * this step's to fill). A step without allocations here, or too long, leaves the earlier ones. */
static void end_step(struct places *p)
{
    bool keep = p->now.n > 0 && !p->overflowed;
    if (keep) {
        uint32_t slot = (p->newest + 1) % PAST;
        struct record oldest = p->past[slot];
        p->past[slot] = p->now;
        p->now = oldest;
        if (index_record(&p->past[slot])) {
            p->newest = slot;
            p->valid |= 1u << slot;
        } else {
            p->valid &= ~(1u << slot);
            pump_log_once("placement: no memory to index a step's allocations: that step is not followed");
        }
    }
    p->now.n = 0;
    p->overflowed = false;
    p->agree = p->valid;
    p->generation++;
}

PUMP_HIDDEN uint64_t pump_placement_step(void)
{
    uint64_t marked = atomic_fetch_add_explicit(&steps, 1, memory_order_acq_rel) + 1;
    for (int d = 0; d < PUMP_DEVICES_MAX; d++) {
        struct places *p = &places[d];
        pump_mutex_lock(&p->lock);
        if (p->now.n > 0 || p->overflowed)
            end_step(p);
        pump_mutex_unlock(&p->lock);
    }
    return marked;
}

/* Under p's lock: room for one more allocation in this step's record. */
static bool grow(struct places *p)
{
    struct record *r = &p->now;
    if (r->n < r->room)
        return true;
    if (r->room >= ORDINALS_MAX)
        return false;
    uint32_t room = r->room != 0 ? 2 * r->room : 1024;
    struct placed *at = realloc(r->at, room * sizeof *at);
    if (at == NULL)
        return false;
    r->at = at;
    r->room = room;
    return true;
}

PUMP_HIDDEN struct pump_place pump_placement_want(int device, uint64_t size, CUstream stream)
{
    struct pump_place place = {.device = device, .ordinal = UINT32_MAX};
    if (pump_placement_steps() == 0 || device < 0 || device >= PUMP_DEVICES_MAX)
        return place;
    struct places *p = &places[device];
    pump_mutex_lock(&p->lock);
    if (p->overflowed || !grow(p)) {
        if (!p->overflowed)
            pump_log_once("placement: a step made more than %u allocations on a device, or there was no memory to "
                          "number them: the rest of such a step is not placed",
                          ORDINALS_MAX);
        p->overflowed = true;
        pump_mutex_unlock(&p->lock);
        return place;
    }
    uint32_t k = p->now.n++;
    p->now.at[k] = (struct placed){.size = size, .stream = stream, .ptr = 0};
    for (uint32_t i = 0; i < PAST; i++) {
        const struct record *r = &p->past[i];
        if ((p->agree & 1u << i) && (k >= r->n || r->at[k].size != size || r->at[k].stream != stream))
            p->agree &= ~(1u << i);
    }
    place.ordinal = k;
    place.generation = p->generation;
    for (uint32_t back = 0; back < PAST; back++) {
        uint32_t i = (p->newest + PAST - back) % PAST;
        if (p->agree & 1u << i) {
            place.record = i;
            place.preferred = p->past[i].at[k].ptr;
            break;
        }
    }
    pump_mutex_unlock(&p->lock);
    return place;
}

/* Under p's lock: whether `place` still names an allocation of p's step (none ended since). */
static bool current(const struct places *p, const struct pump_place *place)
{
    return place->ordinal != UINT32_MAX && place->generation == p->generation;
}

PUMP_HIDDEN bool pump_placement_reserved(const struct pump_place *place, CUdeviceptr ptr)
{
    if (place->ordinal == UINT32_MAX || place->preferred == 0)
        return false;  /* no agreeing step: nothing is reserved */
    struct places *p = &places[place->device];
    pump_mutex_lock(&p->lock);
    bool reserved = current(p, place) && (p->valid & 1u << place->record) &&
                    last_at(&p->past[place->record], ptr) > (int64_t)place->ordinal;
    pump_mutex_unlock(&p->lock);
    return reserved;
}

PUMP_HIDDEN void pump_placement_made(const struct pump_place *place, CUdeviceptr ptr)
{
    if (place->ordinal == UINT32_MAX)
        return;
    struct places *p = &places[place->device];
    pump_mutex_lock(&p->lock);
    if (current(p, place) && place->ordinal < p->now.n)
        p->now.at[place->ordinal].ptr = ptr;
    pump_mutex_unlock(&p->lock);
}
