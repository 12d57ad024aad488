/* units_channel.c: unit tests of the shim's channel to pumpd, linked with the shim's objects
 * (plain and sanitized): the event ring's writer (threads racing a reader round a small ring,
 * a full ring dropping whole groups) and the plan's reader (launch keys, triggers and their
 * ranges, bounds, generations). Prints "units_channel: N passed, M failed". */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "channel.h"
#include "expect.h"
#include "ranges.h"

#define MiB (1ull << 20)

/* ---- the ring: writers in threads, a reader advancing the tail ---- */
#define RING_RECORDS 1024
#define WRITERS 4
#define WRITES 20000

static struct pump_ring_header *ring;
static struct pump_event *ring_records;
static atomic_bool writers_done;
static atomic_int ring_errors;
static uint64_t records_read;

static void *ring_writer(void *arg)
{
    struct pump_channel *c = pump_channel_get();
    uint64_t id = (uint64_t)(uintptr_t)arg;
    for (uint64_t i = 0; i < WRITES; i++) {
        /* Groups of 1 to 3 records, each naming its writer, sequence and part. */
        uint32_t n = 1 + (uint32_t)(i % 3);
        struct pump_event group[3];
        memset(group, 0, sizeof group);
        for (uint32_t k = 0; k < n; k++) {
            group[k].kind = k == 0 ? PUMP_EVENT_LAUNCH : PUMP_EVENT_LAUNCH_MORE;
            group[k].count = (uint16_t)n;
            group[k].device = (int32_t)id;
            group[k].arg[0] = id;
            group[k].arg[1] = i;
            group[k].arg[2] = k;
        }
        /* Mostly give the reader room (so the ring goes round however the
         * threads are scheduled); now and then write regardless. */
        while (i % 64 != 0 && __atomic_load_n(&ring->head, __ATOMIC_RELAXED) -
                                      __atomic_load_n(&ring->tail, __ATOMIC_ACQUIRE) > RING_RECORDS / 2)
            sched_yield();
        pump_channel_emit(c, group, n);
    }
    return NULL;
}

static void *ring_reader(void *arg)
{
    (void)arg;
    uint64_t tail = 0;
    for (;;) {
        bool done = atomic_load(&writers_done);
        uint64_t head = __atomic_load_n(&ring->head, __ATOMIC_ACQUIRE);
        if (tail == head && done)
            return NULL;
        while (tail < head) {
            struct pump_event *e = &ring_records[tail % RING_RECORDS];
            if (__atomic_load_n(&e->seq, __ATOMIC_ACQUIRE) != tail + 1)
                break;  /* reserved, not yet complete */
            uint16_t kind = __atomic_load_n(&e->kind, __ATOMIC_RELAXED);
            uint16_t count = __atomic_load_n(&e->count, __ATOMIC_RELAXED);
            uint64_t part = __atomic_load_n(&e->arg[2], __ATOMIC_RELAXED);
            /* A group's records are contiguous: part k follows part k - 1. */
            if (kind == PUMP_EVENT_LAUNCH) {
                if (part != 0 || count < 1 || count > 3)
                    atomic_fetch_add(&ring_errors, 1);
                for (uint32_t k = 1; k < count; k++) {
                    struct pump_event *more = &ring_records[(tail + k) % RING_RECORDS];
                    while (__atomic_load_n(&more->seq, __ATOMIC_ACQUIRE) != tail + k + 1)
                        pump_cpu_relax();
                    if (__atomic_load_n(&more->arg[2], __ATOMIC_RELAXED) != k ||
                        __atomic_load_n(&more->arg[1], __ATOMIC_RELAXED) !=
                            __atomic_load_n(&e->arg[1], __ATOMIC_RELAXED) ||
                        __atomic_load_n(&more->arg[0], __ATOMIC_RELAXED) !=
                            __atomic_load_n(&e->arg[0], __ATOMIC_RELAXED))
                        atomic_fetch_add(&ring_errors, 1);
                }
                tail += count;
                records_read += count;
            } else {
                atomic_fetch_add(&ring_errors, 1);
                tail++;
                records_read++;
            }
            __atomic_store_n(&ring->tail, tail, __ATOMIC_RELEASE);
        }
        pump_cpu_relax();
    }
}

static void test_ring(void)
{
    size_t size = sizeof(struct pump_ring_header) + RING_RECORDS * sizeof(struct pump_event);
    void *memory = NULL;
    EXPECT(posix_memalign(&memory, 64, size) == 0);
    ring = memory;
    memset(ring, 0, size);
    ring->magic = PUMP_RING_MAGIC;
    ring->version = PUMP_PROTOCOL_VERSION;
    ring->record_size = sizeof(struct pump_event);
    ring->capacity = RING_RECORDS;
    ring_records = (struct pump_event *)(ring + 1);

    /* Bad geometry is refused. */
    ring->capacity = 1000;
    EXPECT(!pump_channel_install(ring, size, NULL));
    ring->capacity = RING_RECORDS;
    EXPECT(!pump_channel_install(ring, size - 64, NULL));
    ring->record_size = 32;
    EXPECT(!pump_channel_install(ring, size, NULL));
    ring->record_size = sizeof(struct pump_event);
    EXPECT(pump_channel_get() == NULL);
    EXPECT(pump_channel_install(ring, size, NULL));
    EXPECT(pump_channel_get() != NULL);

    pthread_t writers[WRITERS], reader;
    pthread_create(&reader, NULL, ring_reader, NULL);
    for (uintptr_t i = 0; i < WRITERS; i++)
        pthread_create(&writers[i], NULL, ring_writer, (void *)i);
    for (int i = 0; i < WRITERS; i++)
        pthread_join(writers[i], NULL);
    atomic_store(&writers_done, true);
    pthread_join(reader, NULL);
    uint64_t attempted = (uint64_t)WRITERS * (WRITES / 3 * 6 + (WRITES % 3 >= 1) + 2 * (WRITES % 3 >= 2));
    uint64_t written = __atomic_load_n(&ring->written, __ATOMIC_RELAXED);
    uint64_t dropped = __atomic_load_n(&ring->dropped, __ATOMIC_RELAXED);
    EXPECT(atomic_load(&ring_errors) == 0);
    EXPECT(written + dropped == attempted);
    EXPECT(written == records_read && written == __atomic_load_n(&ring->head, __ATOMIC_RELAXED));
    EXPECT(written > RING_RECORDS);  /* it went round */

    /* Full: a group that does not fit is dropped whole; a reader's tail
     * beyond the head (garbage) reads as full, never as room. */
    uint64_t head = __atomic_load_n(&ring->head, __ATOMIC_RELAXED);
    __atomic_store_n(&ring->tail, head - RING_RECORDS + 2, __ATOMIC_RELEASE);
    struct pump_event three[3];
    memset(three, 0, sizeof three);
    pump_channel_emit(pump_channel_get(), three, 3);
    EXPECT(__atomic_load_n(&ring->head, __ATOMIC_RELAXED) == head);
    EXPECT(__atomic_load_n(&ring->dropped, __ATOMIC_RELAXED) == dropped + 3);
    __atomic_store_n(&ring->tail, head + 5, __ATOMIC_RELEASE);
    pump_channel_emit(pump_channel_get(), three, 1);
    EXPECT(__atomic_load_n(&ring->head, __ATOMIC_RELAXED) == head);
    __atomic_store_n(&ring->tail, head, __ATOMIC_RELEASE);
    pump_channel_emit(pump_channel_get(), three, 2);
    EXPECT(__atomic_load_n(&ring->head, __ATOMIC_RELAXED) == head + 2);
    EXPECT(ring_records[head % RING_RECORDS].seq == head + 1 && ring_records[(head + 1) % RING_RECORDS].seq == head + 2);
}

/* ---- the plan: launch keys, triggers, bounds, generations ---- */
/* The key as pump_channel.h defines it, written again here from the text. */
static struct pump_plan_trigger trigger(uint64_t key, uint32_t first, uint16_t need, uint16_t prefetch,
                                        uint16_t evict)
{
    return (struct pump_plan_trigger){.key = key, .first = first, .need = need, .prefetch = prefetch,
                                      .evict = evict};
}

static uint64_t spec_key(uint64_t function, const uint64_t *bases, int n)
{
    uint64_t h = function * 0x9E3779B97F4A7C15ull;
    for (int i = 0; i < n; i++)
        h = (h ^ bases[i]) * 0x9E3779B97F4A7C15ull;
    h ^= h >> 32;
    return h ? h : 1;
}

static void test_plan(void)
{
    struct pump_plan *plan = calloc(1, sizeof *plan);
    plan->magic = PUMP_PLAN_MAGIC;
    plan->version = PUMP_PLAN_VERSION;
    plan->order = PUMP_ORDER_USED;
    struct pump_channel c = *pump_channel_get();
    c.plan = plan;

    uint64_t base = 0x500000000000ull;
    for (int i = 0; i < 4; i++)
        EXPECT(pump_ranges_insert(base + (uint64_t)i * 8 * MiB, 4 * MiB, 1, false, 0));
    uint64_t f = 0x7f00deadbe00ull, g = 0x7f00deadbf00ull;
    uint64_t own[] = {base + 8 * MiB, base};
    struct pump_scan scan = {.found = 0};
    scan.range = scan.inline_range;
    scan.range[scan.found++] = pump_ranges_find(own[0]);  /* the launch's own, in argument order */
    scan.range[scan.found++] = pump_ranges_find(own[1]);
    scan.own = scan.found;
    uint64_t key = spec_key(f, own, 2);
    EXPECT(key != spec_key(f, (uint64_t[]){own[1], own[0]}, 2));  /* the order is part of the key */
    /* The trigger two slots past its hash (behind other keys). */
    uint32_t s = (uint32_t)(key >> (64 - PUMP_PLAN_SLOT_BITS));
    plan->trigger[s].key = key ^ 1;
    plan->trigger[(s + 1) % PUMP_PLAN_SLOTS].key = key ^ 2;
    plan->trigger[(s + 2) % PUMP_PLAN_SLOTS] = trigger(key, 100, 0, 2, 1);
    plan->range[100] = (struct pump_plan_range){base + 16 * MiB, 64 << 10};
    plan->range[101] = (struct pump_plan_range){0x42, 4096};
    plan->range[102] = (struct pump_plan_range){base + 24 * MiB, 2 * MiB};
    plan->trigger_count = 3;

    struct pump_trigger t;
    EXPECT(pump_channel_plan_trigger(&c, pump_channel_launch_key((CUfunction)f, &scan), &t));
    EXPECT(t.prefetch == 2 && t.evict == 1 && t.order == PUMP_ORDER_USED);
    EXPECT(t.range[0].address == base + 16 * MiB && t.range[0].bytes == (64 << 10));
    EXPECT(t.range[1].address == 0x42 && t.range[2].address == base + 24 * MiB);
    /* Another function, or the same with other allocations: no trigger. */
    EXPECT(!pump_channel_plan_trigger(&c, pump_channel_launch_key((CUfunction)g, &scan), &t));
    scan.own = 1;
    EXPECT(!pump_channel_plan_trigger(&c, pump_channel_launch_key((CUfunction)f, &scan), &t));
    scan.own = 2;
    /* Mid-write (odd generation): nothing. */
    plan->generation = 7;
    EXPECT(!pump_channel_plan_trigger(&c, pump_channel_launch_key((CUfunction)f, &scan), &t));
    plan->generation = 8;
    EXPECT(pump_channel_plan_trigger(&c, pump_channel_launch_key((CUfunction)f, &scan), &t));
    /* Out of bounds: first, or first + prefetch + evict, past the ranges; or no ranges. */
    struct pump_plan_trigger *trig = &plan->trigger[(s + 2) % PUMP_PLAN_SLOTS];
    struct { uint32_t first; uint16_t need, prefetch, evict; } bad[] = {
        {PUMP_PLAN_RANGES, 0, 1, 0}, {PUMP_PLAN_RANGES - 1, 0, 1, 1}, {PUMP_PLAN_RANGES - 2, 0, 0xffff, 0xffff},
        {PUMP_PLAN_RANGES - 2, 2, 1, 0}, {0xffffffffu, 0, 2, 0}, {5, 0, 0, 0}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        *trig = trigger(key, bad[i].first, bad[i].need, bad[i].prefetch, bad[i].evict);
        EXPECT(!pump_channel_plan_trigger(&c, pump_channel_launch_key((CUfunction)f, &scan), &t));
    }
    /* Needs come first, in order. */
    *trig = trigger(key, 100, 1, 1, 1);
    EXPECT(pump_channel_plan_trigger(&c, pump_channel_launch_key((CUfunction)f, &scan), &t));
    EXPECT(t.need == 1 && t.prefetch == 1 && t.evict == 1 && t.range[0].address == base + 16 * MiB &&
           t.range[1].address == 0x42 && t.range[2].address == base + 24 * MiB && !t.need_cut);
    /* Many ranges: at most PUMP_TRIGGER_RANGES_MAX, up to half needs, then half of the rest
     * evictions when both other kinds are many. */
    *trig = trigger(key, 0, 0, 1000, 1000);
    EXPECT(pump_channel_plan_trigger(&c, pump_channel_launch_key((CUfunction)f, &scan), &t));
    EXPECT(t.prefetch == PUMP_TRIGGER_RANGES_MAX / 2 && t.evict == PUMP_TRIGGER_RANGES_MAX / 2);
    *trig = trigger(key, 0, 0, 1000, 3);
    EXPECT(pump_channel_plan_trigger(&c, pump_channel_launch_key((CUfunction)f, &scan), &t));
    EXPECT(t.prefetch == PUMP_TRIGGER_RANGES_MAX - 3 && t.evict == 3);
    *trig = trigger(key, 0, 1000, 1000, 1000);
    EXPECT(pump_channel_plan_trigger(&c, pump_channel_launch_key((CUfunction)f, &scan), &t));
    EXPECT(t.need == PUMP_TRIGGER_RANGES_MAX / 2 && t.prefetch == PUMP_TRIGGER_RANGES_MAX / 4 &&
           t.evict == PUMP_TRIGGER_RANGES_MAX / 4 && t.need_cut);
    /* Beyond the probe window: not found. */
    *trig = trigger(0, 0, 0, 0, 0);
    plan->trigger[(s + PUMP_PLAN_PROBES) % PUMP_PLAN_SLOTS] = trigger(key, 100, 0, 2, 0);
    EXPECT(!pump_channel_plan_trigger(&c, pump_channel_launch_key((CUfunction)f, &scan), &t));
    plan->trigger[(s + PUMP_PLAN_PROBES - 1) % PUMP_PLAN_SLOTS] = trigger(key, 100, 0, 2, 0);
    EXPECT(pump_channel_plan_trigger(&c, pump_channel_launch_key((CUfunction)f, &scan), &t) && t.prefetch == 2 && t.evict == 0);
    /* An empty plan is not searched. */
    plan->trigger_count = 0;
    EXPECT(!pump_channel_plan_trigger(&c, pump_channel_launch_key((CUfunction)f, &scan), &t));

    for (int i = 0; i < 4; i++) {
        uint64_t size;
        int device;
        EXPECT(pump_ranges_remove(base + (uint64_t)i * 8 * MiB, &size, &device));
    }
    free(plan);
}

int main(void)
{
    test_ring();
    test_plan();  /* reads the plan through the channel test_ring installed */
    return expect_report("units_channel");
}
