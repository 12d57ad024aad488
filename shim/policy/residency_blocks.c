/* residency_blocks.c: the per-block belief, per-device orders and their locks
 * (see residency_blocks.h).
 *
 * Each managed allocation gets, when it is made, a state per 2 MiB block
 * (address >> 21; the last block may be partial): the device it is believed
 * resident on, its place in that device's migration order (a list, oldest
 * first: the order blocks became believed resident; using a resident block
 * again does not move it), and what the rules need of it. Each allocation's
 * range record summarises its blocks for the launch path, which reads only
 * those summaries (without a lock): resident_stamp (every block prefetched in
 * this epoch: skip it) and accounted_on (every block counted on that device:
 * nothing for policy off to count).
 */
#include <stdlib.h>

#include "locks.h"
#include "prefetch.h"
#include "residency.h"
#include "residency_blocks.h"
#include "residency_rank.h"

/* Writers first: allocations and frees take it written while other threads launch, and with a
 * reader-preferring lock a thread allocating could wait for as long as launches overlap (issue
 * 42, risk 6). glibc's writer-preferring kind deadlocks a thread that takes it read a second
 * time while a writer waits: a thread's nested read takes nothing (shape_reads). */
static pthread_rwlock_t shape = PTHREAD_RWLOCK_WRITER_NONRECURSIVE_INITIALIZER_NP;
static _Thread_local unsigned int shape_reads __attribute__((tls_model("initial-exec")));
static pthread_once_t devices_once = PTHREAD_ONCE_INIT;
static bool device_ready[PUMP_DEVICES_MAX]; /* atomic: orders and rooms set up (under `shape` written) */
static uint64_t blocks_total, allocations_total; /* under `shape` written */
/* What each ready device's rooms hold (under `shape` written): blocks on its heap and in its
 * batch, allocations on its touched list (residency_rank.h). */
static uint64_t room_blocks, room_allocations;
static _Atomic uint64_t resident_total, resident_peak;

static void devices_init(void)
{
    for (int d = 0; d < PUMP_DEVICES_MAX; d++) {
        pthread_mutex_init(&pump_devices[d].lock, NULL);
        pthread_mutex_init(&pump_devices[d].turn_lock, NULL);
        pthread_cond_init(&pump_devices[d].turn_done, NULL);
    }
}

/* Waits counted: a lock another thread holds (never across a driver call). */
static void lock_counted(pthread_mutex_t *m)
{
    if (pump_mutex_trylock(m))
        return;
    PUMP_COUNT(residency_lock_waits, 1);
    pump_mutex_lock(m);
}

static void read_shape(void)
{
    if (shape_reads++ > 0 || pump_rwlock_tryrdlock(&shape))
        return;
    PUMP_COUNT(residency_lock_waits, 1);
    pump_rwlock_rdlock(&shape);
}

static void unread_shape(void)
{
    if (--shape_reads == 0)
        pump_rwlock_unlock(&shape);
}

static void write_shape(void)
{
    pthread_once(&devices_once, devices_init);
    if (pump_rwlock_trywrlock(&shape))
        return;
    PUMP_COUNT(residency_lock_waits, 1);
    pump_rwlock_wrlock(&shape);
}

PUMP_HIDDEN void pump_shape_write(void)
{
    write_shape();
}

PUMP_HIDDEN void pump_shape_write_end(void)
{
    pump_rwlock_unlock(&shape);
}

/* Grows device d's rooms to hold `blocks` blocks and `allocations` allocations (false: no memory;
 * what grew stays grown). Under `shape` written. */
static bool rooms_grow(struct pump_device_state *d, uint64_t blocks, uint64_t allocations)
{
    if (blocks > 0) {
        struct pump_block **heap = realloc(d->heap, blocks * sizeof *heap);
        if (heap != NULL)
            d->heap = heap;
        struct pump_block **batch = realloc(d->batch, blocks * sizeof *batch);
        if (batch != NULL)
            d->batch = batch;
        if (heap == NULL || batch == NULL)
            return false;
    }
    if (allocations > 0) {
        struct pump_blocks **touched = realloc(d->touched, allocations * sizeof *touched);
        if (touched == NULL)
            return false;
        d->touched = touched;
    }
    return true;
}

/* Room for `blocks` blocks and `allocations` allocations on every ready device, doubling; under
 * `shape` written. */
static bool rooms_need(uint64_t blocks, uint64_t allocations)
{
    if (blocks <= room_blocks && allocations <= room_allocations)
        return true;
    uint64_t b = blocks > 2 * room_blocks ? blocks : 2 * room_blocks;
    uint64_t n = allocations > 2 * room_allocations ? allocations : 2 * room_allocations;
    for (int d = 0; d < PUMP_DEVICES_MAX; d++)
        if (__atomic_load_n(&device_ready[d], __ATOMIC_ACQUIRE) && !rooms_grow(&pump_devices[d], b, n))
            return false;  /* those grown keep their room: larger than needed, never smaller */
    room_blocks = b;
    room_allocations = n;
    return true;
}

PUMP_HIDDEN bool pump_blocks_enter(int device)
{
    pthread_once(&devices_once, devices_init);
    if (!__atomic_load_n(&device_ready[device], __ATOMIC_ACQUIRE)) {
        /* The device's first rule sets up its orders and rooms, once, with the shape lock
         * written (a wait for it is not counted: it is no launch's decision). */
        pump_rwlock_wrlock(&shape);
        struct pump_device_state *d = &pump_devices[device];
        if (!__atomic_load_n(&device_ready[device], __ATOMIC_RELAXED)) {
            d->order.newer = d->order.older = &d->order;
            d->used.newer_used = d->used.older_used = &d->used;
            __atomic_store_n(&device_ready[device], rooms_grow(d, room_blocks, room_allocations), __ATOMIC_RELEASE);
        }
        bool ready = __atomic_load_n(&device_ready[device], __ATOMIC_RELAXED);
        pump_rwlock_unlock(&shape);
        if (!ready) {
            pump_log_once("no memory for a device's residency: its launches are not prefetched");
            return false;
        }
    }
    read_shape();
    return true;
}

PUMP_HIDDEN void pump_blocks_leave(void)
{
    unread_shape();
}

PUMP_HIDDEN void pump_blocks_used(struct pump_range *const *ranges, uint32_t n, int device)
{
    if (!pump_blocks_enter(device))
        return;
    uint64_t devices = 0;
    for (uint32_t r = 0; r < n; r++)
        if (ranges[r]->blocks != NULL)
            devices |= __atomic_load_n(&ranges[r]->blocks->devices, __ATOMIC_RELAXED);
    pump_devices_lock(devices);
    for (uint32_t r = 0; r < n; r++) {
        struct pump_blocks *a = ranges[r]->blocks;
        /* Bits set since the load above belong to devices whose lock the setter held while
         * it ranked the block (pump_rank_join): already in place. */
        uint64_t on = a != NULL ? devices & __atomic_load_n(&a->devices, __ATOMIC_RELAXED) : 0;
        for (; on != 0; on &= on - 1)
            pump_rank_touched(a, __builtin_ctzll(on));
    }
    pump_devices_unlock(devices);
    pump_blocks_leave();
}

PUMP_HIDDEN void pump_blocks_keepers(const struct pump_blocks *a, uint64_t *mask)
{
    for (uint32_t i = 0; i < a->count; i++) {
        int32_t keeper = __atomic_load_n(&a->block[i].keeper, __ATOMIC_RELAXED);
        if (keeper >= 0)
            *mask |= 1ull << keeper;
    }
}

PUMP_HIDDEN bool pump_blocks_claim(struct pump_blocks *a, int device, uint64_t held, uint64_t *want)
{
    bool all = true;
    for (uint32_t i = 0; i < a->count; i++) {
        int32_t keeper = -1;
        if (__atomic_compare_exchange_n(&a->block[i].keeper, &keeper, device, false, __ATOMIC_RELAXED,
                                        __ATOMIC_RELAXED) ||
            (held & 1ull << keeper))
            continue;
        *want |= 1ull << keeper;
        all = false;
    }
    return all;
}

PUMP_HIDDEN void pump_devices_lock(uint64_t mask)
{
    for (int d = 0; d < PUMP_DEVICES_MAX; d++)
        if (mask & 1ull << d)
            lock_counted(&pump_devices[d].lock);
}

PUMP_HIDDEN void pump_devices_unlock(uint64_t mask)
{
    for (int d = PUMP_DEVICES_MAX - 1; d >= 0; d--)
        if (mask & 1ull << d)
            pump_mutex_unlock(&pump_devices[d].lock);
}

PUMP_HIDDEN uint64_t pump_turn_take(int device)
{
    return pump_devices[device].turns++;
}

PUMP_HIDDEN void pump_turn_wait(int device, uint64_t turn)
{
    struct pump_device_state *d = &pump_devices[device];
    pump_wait_for_calls();
    pump_mutex_lock(&d->turn_lock);
    if (d->serving != turn)
        PUMP_COUNT(residency_turn_waits, 1);
    while (d->serving != turn)
        pthread_cond_wait(&d->turn_done, &d->turn_lock);
    pump_mutex_unlock(&d->turn_lock);
    pump_hold_begin();  /* a lock until its end: no driver call meanwhile */
}

PUMP_HIDDEN void pump_turn_end(int device)
{
    struct pump_device_state *d = &pump_devices[device];
    pump_hold_end();
    pump_mutex_lock(&d->turn_lock);
    d->serving++;
    pthread_cond_broadcast(&d->turn_done);
    pump_mutex_unlock(&d->turn_lock);
}

PUMP_HIDDEN uint64_t pump_block_start(const struct pump_blocks *a, uint32_t i)
{
    uint64_t start = (a->base / PUMP_BLOCK_SIZE + i) * PUMP_BLOCK_SIZE;
    return start < a->base ? a->base : start;
}

PUMP_HIDDEN uint64_t pump_block_bytes(const struct pump_blocks *a, uint32_t i)
{
    uint64_t end = (a->base / PUMP_BLOCK_SIZE + i + 1) * PUMP_BLOCK_SIZE, last = a->base + a->size;
    return (end > last ? last : end) - pump_block_start(a, i);
}

PUMP_HIDDEN void pump_blocks_read_mostly(uint64_t ptr, uint64_t bytes, bool on)
{
    uint64_t end = ptr + bytes < ptr ? UINT64_MAX : ptr + bytes;
    read_shape();  /* no allocation goes meanwhile */
    for (uint64_t at = ptr; at < end;) {
        struct pump_range *r = pump_ranges_find(at);
        struct pump_blocks *a = r != NULL ? r->blocks : NULL;
        if (a == NULL)
            break;  /* past the allocations pump knows there */
        for (uint32_t i = 0; i < a->count; i++) {
            uint64_t start = pump_block_start(a, i), stop = start + pump_block_bytes(a, i);
            if (on ? start >= ptr && stop <= end : start < end && stop > ptr)
                __atomic_store_n(&a->block[i].read_mostly, on, __ATOMIC_RELAXED);
        }
        at = a->base + a->size;
    }
    unread_shape();
}

PUMP_HIDDEN void pump_blocks_publish(void)
{
    uint64_t total = atomic_load_explicit(&resident_total, memory_order_relaxed);
    PUMP_SET(resident_bytes, total);
    uint64_t peak = atomic_load_explicit(&resident_peak, memory_order_relaxed);
    while (total > peak && !atomic_compare_exchange_weak_explicit(&resident_peak, &peak, total,
                                                                   memory_order_relaxed, memory_order_relaxed)) {
    }
    if (total > peak)
        PUMP_SET(resident_bytes_peak, total);
}

PUMP_HIDDEN void pump_block_count_out(struct pump_blocks *a, uint32_t i)
{
    struct pump_block *b = &a->block[i];
    if (b->device < 0)
        return;
    struct pump_device_state *d = &pump_devices[b->device];
    uint64_t bytes = pump_block_bytes(a, i);
    pump_rank_leave(b);
    b->older->newer = b->newer;
    b->newer->older = b->older;
    b->older = b->newer = NULL;
    __atomic_store_n(&d->resident, d->resident - bytes, __ATOMIC_RELAXED);
    atomic_fetch_sub_explicit(&resident_total, bytes, memory_order_relaxed);
    b->device = -1;
    b->stamp = 0;
    b->ready = 0;
    b->brought = 0;
    b->planned_for = 0;
    __atomic_store_n(&a->range->resident_stamp, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&a->range->accounted_on, 0, __ATOMIC_RELAXED);
}

PUMP_HIDDEN void pump_block_count_in(struct pump_blocks *a, uint32_t i, int device)
{
    struct pump_block *b = &a->block[i];
    if (b->device == device)
        return;
    pump_block_count_out(a, i);
    struct pump_device_state *d = &pump_devices[device];
    b->older = d->order.older;
    b->newer = &d->order;
    d->order.older->newer = b;
    d->order.older = b;
    b->migrated = ++d->migrations;
    b->device = device;
    __atomic_store_n(&b->keeper, device, __ATOMIC_RELAXED);
    __atomic_fetch_or(&a->devices, 1ull << device, __ATOMIC_RELAXED);
    pump_rank_join(b);
    uint64_t bytes = pump_block_bytes(a, i);
    __atomic_store_n(&d->resident, d->resident + bytes, __ATOMIC_RELAXED);
    __atomic_store_n(&d->counted_in, d->counted_in + bytes, __ATOMIC_RELAXED);
    atomic_fetch_add_explicit(&resident_total, bytes, memory_order_relaxed);
}

PUMP_HIDDEN uint64_t pump_residency_counted_in_bytes(int device)
{
    return device >= 0 && device < PUMP_DEVICES_MAX ? __atomic_load_n(&pump_devices[device].counted_in, __ATOMIC_RELAXED)
                                                    : 0;
}

PUMP_HIDDEN void pump_blocks_refresh(struct pump_blocks *a, int device, uint64_t stamp)
{
    bool counted = true, stamped = stamp != 0;
    for (uint32_t i = 0; i < a->count; i++) {
        counted = counted && a->block[i].device == device;
        stamped = stamped && a->block[i].device == device && a->block[i].stamp == stamp;
    }
    __atomic_store_n(&a->range->accounted_on, counted ? (uint32_t)device + 1 : 0, __ATOMIC_RELAXED);
    __atomic_store_n(&a->range->resident_stamp, stamped ? stamp : 0, __ATOMIC_RELAXED);
}

/* Moves block b (believed resident) to the newest end of its device's migration order
 * (newest) or to its oldest end, where the next eviction finds it first. */
static void reorder(struct pump_block *b, bool newest)
{
    struct pump_device_state *d = &pump_devices[b->device];
    b->older->newer = b->newer;
    b->newer->older = b->older;
    struct pump_block *after = newest ? d->order.older : &d->order;
    b->older = after;
    b->newer = after->newer;
    after->newer->older = b;
    after->newer = b;
    if (newest)
        b->migrated = ++d->migrations;
    pump_rank_update(b);  /* a new tensor's, or a freed one's */
}

PUMP_HIDDEN bool pump_blocks_reorder(struct pump_range *range, bool newest)
{
    write_shape();  /* no rule in flight: every device's order may change */
    struct pump_blocks *a = range->blocks;
    for (uint32_t i = 0; a != NULL && i < a->count; i++)
        if (a->block[i].device >= 0)
            reorder(&a->block[i], newest);
    pump_rwlock_unlock(&shape);
    return a != NULL;
}

PUMP_HIDDEN bool pump_blocks_attach(struct pump_range *range)
{
    /* A tensor that took over a freed one's record (ranges.h): the same memory, which the
     * caching allocator kept on the GPU. What of it is still believed resident is a new
     * tensor's now: the newest in the migration order; what was discarded at the free
     * (torch_trace.c) keeps its mark, so the new tensor's prefetch waits for the discard. */
    if (pump_blocks_reorder(range, true))
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
        for (uint32_t i = 0; i < a->count; i++) {
            a->block[i].owner = a;
            a->block[i].device = a->block[i].keeper = -1;
            if (reused)
                a->block[i].discarded = pump_discard_over(pump_block_start(a, i), pump_block_bytes(a, i));
        }
    }
    write_shape();
    ok = ok && rooms_need(blocks_total + count, allocations_total + 1);
    if (ok) {
        blocks_total += count;
        allocations_total++;
        range->blocks = a;
    }
    pump_rwlock_unlock(&shape);
    if (!ok) {
        free(a);
        pump_log_once("no memory for a managed allocation's residency: it is prefetched whole and never budgeted");
    }
    return ok;
}

/* Block i of f takes what the records old[*from .. n) (address order, disjoint; *from advanced
 * past those wholly before it) knew of its bytes: believed resident on a device where every byte
 * of it was, there, with what its prefetches and evictions left to wait for; else nowhere. */
static void inherit_block(struct pump_blocks *f, uint32_t i, struct pump_range *const *old, uint32_t n,
                          uint32_t *from)
{
    uint64_t start = pump_block_start(f, i), end = start + pump_block_bytes(f, i), covered = 0;
    while (*from < n && __atomic_load_n(&old[*from]->base, __ATOMIC_RELAXED) +
                                __atomic_load_n(&old[*from]->size, __ATOMIC_RELAXED) <= start)
        (*from)++;
    struct pump_block took = {.device = -1, .read_mostly = 1};
    for (uint32_t o = *from; o < n && covered < end - start; o++) {
        const struct pump_blocks *a = old[o]->blocks;
        if (a == NULL || a->base >= end)
            return;  /* one without blocks (no memory for them): believed nowhere */
        const struct pump_block *b = &a->block[start / PUMP_BLOCK_SIZE - a->base / PUMP_BLOCK_SIZE];
        /* Its latest eviction, wherever the block is believed: believed nowhere, its memory may
         * still wait for an eviction pump's worker has not made, and the block's prefetch must come
         * after it (residency.c's after_evictions). */
        if (b->evicted_in > f->block[i].evicted_in)
            f->block[i].evicted_in = b->evicted_in;
        if (b->device < 0 || (took.device >= 0 && b->device != took.device))
            return;
        took.stamp = took.device < 0 || b->stamp == took.stamp ? b->stamp : 0;
        took.device = b->device;
        took.read_mostly &= __atomic_load_n(&b->read_mostly, __ATOMIC_RELAXED);
#define LATEST(field) took.field = b->field > took.field ? b->field : took.field
        LATEST(ready);
        LATEST(brought);
        LATEST(planned_for);
        LATEST(discarded);
#undef LATEST
        uint64_t lo = a->base > start ? a->base : start, hi = a->base + a->size < end ? a->base + a->size : end;
        covered += hi - lo;
    }
    if (covered != end - start)
        return;
    struct pump_block *b = &f->block[i];
    b->stamp = took.stamp;
    b->ready = took.ready;
    b->brought = took.brought;
    b->planned_for = took.planned_for;
    b->discarded = took.discarded;
    __atomic_store_n(&b->read_mostly, took.read_mostly, __ATOMIC_RELAXED);
    pump_block_count_in(f, i, took.device);
}

/* f's range takes the latest use of the records of old that overlap it: its blocks' evictions
 * wait for their users. */
static void inherit_use(struct pump_range *made, struct pump_range *const *old, uint32_t n)
{
    uint64_t base = __atomic_load_n(&made->base, __ATOMIC_RELAXED), tick = 0, token = 0;
    uint64_t end = base + __atomic_load_n(&made->size, __ATOMIC_RELAXED);
    for (uint32_t o = 0; o < n; o++) {
        uint64_t start = __atomic_load_n(&old[o]->base, __ATOMIC_RELAXED);
        if (start >= end || start + __atomic_load_n(&old[o]->size, __ATOMIC_RELAXED) <= base)
            continue;
        uint64_t t = __atomic_load_n(&old[o]->last_use, __ATOMIC_RELAXED);
        if (t >> PUMP_USE_SEQUENCE_SHIFT > token >> PUMP_USE_SEQUENCE_SHIFT)
            token = t;
        uint64_t used = __atomic_load_n(&old[o]->used_tick, __ATOMIC_RELAXED);
        tick = used > tick ? used : tick;
    }
    __atomic_store_n(&made->last_use, token, __ATOMIC_RELAXED);
    __atomic_store_n(&made->used_tick, tick, __ATOMIC_RELAXED);
}

PUMP_HIDDEN void pump_blocks_replace(struct pump_range *const *made, uint32_t m, struct pump_range *const *old,
                                     uint32_t n)
{
    for (uint32_t k = 0; k < m; k++)
        pump_blocks_attach(made[k]);
    write_shape();  /* no rule in flight: blocks join their devices' orders */
    for (uint32_t k = 0; k < m; k++) {
        struct pump_blocks *f = made[k]->blocks;
        if (f == NULL)
            continue;
        inherit_use(made[k], old, n);
        uint32_t from = 0;
        bool waited = true;  /* no block left a kernel a prefetch to wait for */
        for (uint32_t i = 0; i < f->count; i++) {
            inherit_block(f, i, old, n, &from);
            waited = waited && f->block[i].ready == 0;
            if (f->block[i].device >= 0 && __atomic_load_n(&made[k]->dead, __ATOMIC_RELAXED))
                reorder(&f->block[i], false);  /* freed memory: the first to go */
        }
        if (f->block[0].device >= 0)
            pump_blocks_refresh(f, f->block[0].device, waited ? f->block[0].stamp : 0);
    }
    /* The memory counts once: the old records leave the accounting before any rule sees it. */
    for (uint32_t o = 0; o < n; o++)
        for (uint32_t i = 0; old[o]->blocks != NULL && i < old[o]->blocks->count; i++)
            pump_block_count_out(old[o]->blocks, i);
    pump_blocks_publish();
    pump_rwlock_unlock(&shape);
}

PUMP_HIDDEN void pump_blocks_detach(struct pump_range *range)
{
    write_shape();
    struct pump_blocks *a = range->blocks;
    if (a != NULL) {
        pump_rank_forget(a);
        for (uint32_t i = 0; i < a->count; i++)
            pump_block_count_out(a, i);
        blocks_total -= a->count;
        allocations_total--;
        range->blocks = NULL;
        pump_blocks_publish();
    }
    pump_rwlock_unlock(&shape);
    free(a);
}

/* The devices set up so far: stable while the shape lock is held. */
static uint64_t ready_devices(void)
{
    uint64_t mask = 0;
    for (int d = 0; d < PUMP_DEVICES_MAX; d++)
        if (__atomic_load_n(&device_ready[d], __ATOMIC_ACQUIRE))
            mask |= 1ull << d;
    return mask;
}

/* The shape lock is taken for reading (a rwlock's writer is known by its thread id, which the
 * child's one thread does not share with the parent's), then the lock of every device set up:
 * no rule decides across fork, and none takes a turn. A turn taken before may still be waited
 * for or handing its moves over (never across a driver call), and their calls may be under way
 * on another thread, holding no lock: the fork waits for none of them (a driver call can take
 * as long as the GPU does; issue 42, risk 4). The child serves every turn taken, and its turn
 * locks are new (a parent's thread may have held one). */
PUMP_HIDDEN void pump_blocks_before_fork(void)
{
    pthread_once(&devices_once, devices_init);
    read_shape();
    pump_devices_lock(ready_devices());
}

PUMP_HIDDEN void pump_blocks_after_fork(bool child)
{
    uint64_t ready = ready_devices();
    for (int d = 0; child && d < PUMP_DEVICES_MAX; d++) {
        if (!(ready & 1ull << d))
            continue;
        pthread_mutex_init(&pump_devices[d].turn_lock, NULL);
        pthread_cond_init(&pump_devices[d].turn_done, NULL);
        pump_devices[d].serving = pump_devices[d].turns;
    }
    pump_devices_unlock(ready);
    unread_shape();
}
