/* units.c: unit tests of the shim's internals, linked with the shim's objects
 * (plain and sanitized): the capacity grammar and the range table, including
 * lock-free readers racing a writer, and a tensor carved over freed memory keeping its eviction; the PUMP_BUDGET/JOB/NAME grammars; the
 * event ring's writer (threads racing a reader round a small ring), the
 * plan's reader, which allocation a refused prefetch marks (and which refusals tell a managed
 * pool's memory apart), and a timing
 * probe broken in one life of its context and made in the next. Prints
 * "units: N passed, M failed". */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "channel.h"
#include "device_memory.h"
#include "expect.h"
#include "host_room.h"
#include "link_rate.h"
#include "prefetch_ranges.h"
#include "ranges.h"
#include "residency.h"
#include "residency_blocks.h"


static void test_capacity_grammar(void)
{
    static const struct {
        const char *text;
        enum pump_capacity_kind kind;
        uint64_t value;
    } good[] = {
        {"1073741824", PUMP_CAP_BYTES, 1ull << 30}, {"8G", PUMP_CAP_BYTES, 8ull << 30},
        {"512MiB", PUMP_CAP_BYTES, 512ull << 20},   {"2TB", PUMP_CAP_BYTES, 2000000000000ull},
        {"7K", PUMP_CAP_BYTES, 7 << 10},            {"1%", PUMP_CAP_PERCENT, 1},
        {"100%", PUMP_CAP_PERCENT, 100},            {"host", PUMP_CAP_HOST, 0},
        {"8gb", PUMP_CAP_BYTES, 8000000000ull},     {"8gib", PUMP_CAP_BYTES, 8ull << 30}, /* any case */
        {"8g", PUMP_CAP_BYTES, 8ull << 30},         {"3Kb", PUMP_CAP_BYTES, 3000},
    };
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        enum pump_capacity_kind kind;
        uint64_t value;
        EXPECT(pump_parse_capacity(good[i].text, &kind, &value));
        EXPECT(kind == good[i].kind && value == good[i].value);
    }
    static const char *const bad[] = {"", "0", "0%", "101%", "1.5G", "5 G", "-1", "12X", "G", "%",
                                      "99999999999999999999", "20000000T", "8gx"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        enum pump_capacity_kind kind;
        uint64_t value;
        EXPECT(!pump_parse_capacity(bad[i], &kind, &value));
    }
}

static struct pump_range *find(uint64_t addr)
{
    struct pump_range *found[4];
    uint64_t hits = 0;
    uint32_t n = pump_ranges_lookup(&addr, 1, found, 0, 4, &hits);
    return n == 1 ? found[0] : NULL;
}

#define MiB (1ull << 20)

/* What pump_ranges_drop told, per device. */
static uint64_t dropped_on[4];

static void count_dropped(int device, uint64_t bytes)
{
    dropped_on[device] += bytes;
}

static void test_range_table(void)
{
    EXPECT(pump_ranges_empty());
    EXPECT(find(0x1000) == NULL);
    uint64_t base = 0x7f0000000000ull;
    EXPECT(pump_ranges_insert(base, 3 * MiB, 1, false, 1));
    EXPECT(pump_ranges_insert(base + 8 * MiB, 1, 1, false, 0));        /* a one-byte allocation */
    EXPECT(pump_ranges_insert(base - 4 * MiB, 4 * MiB, 1, false, 0));  /* adjacent below */
    EXPECT(!pump_ranges_empty());
    EXPECT(find(base) != NULL && find(base)->base == base);
    EXPECT(find(base + 3 * MiB - 1) != NULL && find(base + 3 * MiB - 1)->base == base);
    EXPECT(find(base + 3 * MiB) == NULL);
    EXPECT(find(base - 1) != NULL && find(base - 1)->base == base - 4 * MiB);
    EXPECT(find(base + 8 * MiB) != NULL && find(base + 8 * MiB + 1) == NULL);
    EXPECT(find(base - 4 * MiB - 1) == NULL);

    /* Several words, duplicates counted as hits but listed once. */
    uint64_t words[] = {base, base + 16, 42, base - 8, base + 5 * MiB};
    struct pump_range *found[4];
    uint64_t hits = 0;
    EXPECT(pump_ranges_lookup(words, 5, found, 0, 4, &hits) == 2 && hits == 3);
    /* Words in a row across the edges of adjacent allocations, each looked up after a hit in
     * its neighbour (the lookup keeps the last hit's allocation for the words after it): a
     * word at an allocation's end is in the next one, or in none. */
    uint64_t edges[] = {base - 8, base, base + 3 * MiB - 1, base + 3 * MiB, base + 8 * MiB, base + 8 * MiB + 1,
                        base - 4 * MiB, base - 4 * MiB - 1};
    hits = 0;
    EXPECT(pump_ranges_lookup(edges, 8, found, 0, 4, &hits) == 3 && hits == 5);
    EXPECT(found[0]->base == base - 4 * MiB && found[1]->base == base && found[2]->base == base + 8 * MiB);

    uint64_t size = 0;
    int device = -1;
    EXPECT(pump_ranges_remove(base, &size, &device) == PUMP_REMOVED_ALLOCATION && size == 3 * MiB && device == 1);
    EXPECT(!pump_ranges_remove(base, &size, &device));
    EXPECT(find(base + 1) == NULL);
    EXPECT(!pump_ranges_remove(base - 4 * MiB + 1, &size, &device)); /* only exact bases */

    /* Memory handed out again over stale entries drops them. */
    EXPECT(pump_ranges_drop(base - 5 * MiB, 20 * MiB, count_dropped) == 4 * MiB + 1);
    EXPECT(dropped_on[0] == 4 * MiB + 1 && dropped_on[1] == 0);  /* each on its device */
    EXPECT(pump_ranges_empty());
    EXPECT(pump_ranges_drop(base, MiB, NULL) == 0);
}

/* A caching allocator's segment carved into tensors: launches find the tensors,
 * never the segment; the segment's bytes stay counted until its own free, which
 * also takes any tensor whose free was missed. */
static void test_carved_segments(void)
{
    uint64_t seg = 0x7e0000000000ull, cbase, csize, size = 0;
    int device = -1;
    EXPECT(pump_ranges_insert_tensor(seg, MiB, &cbase, &csize) == NULL);  /* not managed memory */
    EXPECT(pump_ranges_insert(seg, 20 * MiB, 1, false, 2));
    struct pump_range *a = pump_ranges_insert_tensor(seg, 6 * MiB, &cbase, &csize);
    EXPECT(a != NULL && a->base == seg && a->size == 6 * MiB && !a->counted && a->device == 2);
    EXPECT(cbase == seg && csize == 20 * MiB);  /* carved by this tensor */
    EXPECT(pump_ranges_insert_tensor(seg + 6 * MiB, 512, &cbase, &csize) != NULL && csize == 0);
    EXPECT(find(seg + 5 * MiB)->base == seg);
    EXPECT(find(seg + 6 * MiB + 511)->base == seg + 6 * MiB);
    EXPECT(find(seg + 10 * MiB) == NULL);  /* free space in the segment: nothing there */
    EXPECT(pump_ranges_insert_tensor(seg + 19 * MiB, 2 * MiB, &cbase, &csize) == NULL);  /* past its end */

    /* A tensor freed, and the next of the same extent takes its record over. */
    EXPECT(pump_ranges_remove_tensor(seg, &size) && size == 6 * MiB);
    EXPECT(!pump_ranges_remove_tensor(seg, &size));
    EXPECT(find(seg) == NULL);
    EXPECT(pump_ranges_insert_tensor(seg, 6 * MiB, &cbase, &csize) == a && find(seg) == a && !a->dead);
    EXPECT(pump_ranges_remove_tensor(seg, &size) && find(seg + MiB) == NULL);
    /* One handed out over freed or stale ones replaces them. */
    EXPECT(pump_ranges_insert_tensor(seg, 2 * MiB, &cbase, &csize) != NULL && find(seg)->size == 2 * MiB);
    EXPECT(pump_ranges_remove_tensor(seg, &size) && size == 2 * MiB);
    EXPECT(pump_ranges_insert_tensor(seg + 6 * MiB, 4 * MiB, &cbase, &csize) != NULL);
    EXPECT(find(seg + 6 * MiB)->size == 4 * MiB);
    /* What is left of a replaced one outside the new tensor stays, freed: invisible to
     * lookups, and a tensor of its extent takes it over; the segment's free takes it too. */
    EXPECT(find(seg + 3 * MiB) == NULL);
    struct pump_range *rest = pump_ranges_insert_tensor(seg + 2 * MiB, 4 * MiB, &cbase, &csize);
    EXPECT(rest != NULL && find(seg + 3 * MiB) == rest && find(seg + MiB) == NULL);

    /* The segment's free: its 20 MiB, the tensor left in it gone with it. */
    EXPECT(pump_ranges_remove(seg + 6 * MiB, &size, &device) == PUMP_REMOVED_NOTHING);  /* a tensor's base */
    EXPECT(pump_ranges_remove(seg, &size, &device) == PUMP_REMOVED_CARVED && size == 20 * MiB && device == 2);
    EXPECT(pump_ranges_empty() && find(seg + 6 * MiB) == NULL);
    EXPECT(pump_ranges_remove(seg, &size, &device) == PUMP_REMOVED_NOTHING);

    /* Memory handed out over a carved segment pump saw no free of: its bytes come back. A
     * tensor of memory the program allocated managed itself is, as its segment, host-touchable. */
    EXPECT(pump_ranges_insert(seg, 4 * MiB, 1, true, 3));
    struct pump_range *t = pump_ranges_insert_tensor(seg + MiB, MiB, &cbase, &csize);
    EXPECT(t != NULL && csize == 4 * MiB && t->host_touchable);
    EXPECT(pump_ranges_drop(seg + 2 * MiB, MiB, count_dropped) == 4 * MiB && dropped_on[3] == 4 * MiB);
    EXPECT(pump_ranges_empty() && pump_ranges_remove(seg, &size, &device) == PUMP_REMOVED_NOTHING);
}

/* A tensor carved over freed memory takes the latest eviction of that memory, even where pump
 * believes it nowhere: an eviction pump's worker has not made yet may still concern it, and the
 * new tensor's first prefetch must come after it (residency.c's after_evictions). Before, such a
 * tensor's blocks began at 0 and their prefetch passed the eviction, which then took them to the
 * host behind pump's back (whole tensors faulted in on the H200 case c replay under lookahead). */
static void test_a_tensor_over_freed_memory_waits_for_its_eviction(void)
{
    uint64_t seg = 0x7e4000000000ull, cbase, csize, size = 0;
    int device = -1;
    EXPECT(pump_ranges_insert(seg, 20 * MiB, 1, false, 0));
    struct pump_range *old = pump_ranges_insert_tensor(seg, 6 * MiB, &cbase, &csize);
    EXPECT(old != NULL && pump_residency_attach(old) && old->blocks != NULL && old->blocks->count == 3);
    old->blocks->block[1].evicted_in = 42;  /* evicted, so believed nowhere: device -1 */
    EXPECT(old->blocks->block[1].device < 0);
    EXPECT(pump_ranges_remove_tensor(seg, &size) && size == 6 * MiB);
    struct pump_range *made = pump_ranges_insert_tensor(seg + 2 * MiB, 2 * MiB, &cbase, &csize);
    EXPECT(made != NULL && made != old && made->blocks != NULL && made->blocks->count == 1);
    EXPECT(made->blocks->block[0].device < 0 && made->blocks->block[0].evicted_in == 42);
    EXPECT(pump_ranges_remove(seg, &size, &device) == PUMP_REMOVED_CARVED);
}

/* The device memory let through, per device: every allocation found again at its free,
 * whatever the collisions and removals in between moved in the table. */
static void test_device_memory(void)
{
    enum { N = 3000 };
    const CUdeviceptr base = 0x7d0000000000ull;
    for (int i = 0; i < N; i++)
        pump_device_memory_add(base + (CUdeviceptr)i * 512, 512, i % 2);
    EXPECT(pump_device_memory_held(0) == N / 2 * 512 && pump_device_memory_held(1) == N / 2 * 512);
    pump_device_memory_add(base, 4096, 1);  /* handed out again at a base whose free was missed */
    EXPECT(pump_device_memory_held(0) == (N / 2 - 1) * 512 && pump_device_memory_held(1) == N / 2 * 512 + 4096);
    int found = 0;
    for (int i = 1; i < N; i += 3)
        found += pump_device_memory_remove(base + (CUdeviceptr)i * 512);
    EXPECT(found == (N - 1 + 2) / 3);
    for (int i = 0; i < N; i++)
        found += pump_device_memory_remove(base + (CUdeviceptr)i * 512);
    EXPECT(found == N && !pump_device_memory_remove(base));
    EXPECT(pump_device_memory_held(0) == 0 && pump_device_memory_held(1) == 0 && pump_device_memory_held(-1) == 0);
}

/* Readers must only ever see ranges that really contain the address they
 * asked for, while a writer inserts and removes next to them. */
static atomic_bool stop;
static atomic_int bad_reads;
#define RACE_BASE 0x600000000000ull

static void *reader(void *arg)
{
    (void)arg;
    uint64_t addr = RACE_BASE;
    while (!atomic_load(&stop)) {
        addr = RACE_BASE + (addr * 6364136223846793005ull + 1442695040888963407ull) % (64 * 4 * MiB);
        struct pump_range *r = find(addr);
        if (r != NULL) {
            uint64_t b = __atomic_load_n(&r->base, __ATOMIC_ACQUIRE);
            uint64_t s = __atomic_load_n(&r->size, __ATOMIC_ACQUIRE);
            /* The record may be recycled after the lookup; it must at least
             * be a real range of the table's address space. */
            if (b < RACE_BASE || b + s > RACE_BASE + 64 * 4 * MiB)
                atomic_fetch_add(&bad_reads, 1);
        }
        if (find(RACE_BASE + 64 * 4 * MiB + 4096) != NULL)
            atomic_fetch_add(&bad_reads, 1);
    }
    return NULL;
}

static void test_readers_race_writer(void)
{
    pthread_t readers[3];
    for (int i = 0; i < 3; i++)
        pthread_create(&readers[i], NULL, reader, NULL);
    for (int round = 0; round < 200; round++) {
        for (int i = 0; i < 64; i++)
            pump_ranges_insert(RACE_BASE + (uint64_t)i * 4 * MiB, (1 + (uint64_t)(i + round) % 4) * MiB, 1,
                               false, 0);
        for (int i = 0; i < 64; i += 2) {
            uint64_t size;
            int device;
            pump_ranges_remove(RACE_BASE + (uint64_t)i * 4 * MiB, &size, &device);
        }
        pump_ranges_drop(RACE_BASE, 64 * 4 * MiB, NULL);
    }
    atomic_store(&stop, true);
    for (int i = 0; i < 3; i++)
        pthread_join(readers[i], NULL);
    EXPECT(atomic_load(&bad_reads) == 0);
    EXPECT(pump_ranges_empty());
}

static void test_budget_job_name_grammar(void)
{
    enum pump_capacity_kind kind;
    uint64_t value;
    EXPECT(pump_parse_budget("6GiB", &kind, &value) && kind == PUMP_CAP_BYTES && value == 6ull << 30);
    EXPECT(pump_parse_budget("40%", &kind, &value) && kind == PUMP_CAP_PERCENT && value == 40);
    EXPECT(!pump_parse_budget("host", &kind, &value));
    EXPECT(!pump_parse_budget("0", &kind, &value));
    EXPECT(pump_valid_job("j0123456789abcdef") && pump_valid_job("a-b_C") && pump_valid_job("x"));
    EXPECT(!pump_valid_job("") && !pump_valid_job("a b") && !pump_valid_job("a\"b") && !pump_valid_job("j/1"));
    EXPECT(pump_valid_job("0123456789012345678901234567890") && !pump_valid_job("01234567890123456789012345678901"));
    EXPECT(pump_valid_name("resnet \"big\" \\ run") && pump_valid_name("r\xc3\xa9seau") &&
           pump_valid_name("\xe2\x82\xac\xf0\x9f\x98\x80"));
    EXPECT(!pump_valid_name("") && !pump_valid_name("tab\there") && !pump_valid_name("del\x7f"));
    EXPECT(!pump_valid_name("\xc3") && !pump_valid_name("\xc0\xaf") && !pump_valid_name("\xed\xa0\x80") &&
           !pump_valid_name("\xff"));
    char longest[66];
    memset(longest, 'n', 65);
    longest[65] = '\0';
    EXPECT(!pump_valid_name(longest));
    longest[64] = '\0';
    EXPECT(pump_valid_name(longest));
}

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
    scan.range[scan.found++] = find(own[0]);  /* the launch's own, in argument order */
    scan.range[scan.found++] = find(own[1]);
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

/* A prefetch whose range the program frees, and allocates again at the same address, between
 * pump's call and the driver's answer: the driver refuses the freed range (issue 42, risk 7). */
static uint64_t raced_base;

static CUresult freed_while_asked(CUdeviceptr ptr, size_t size, CUmemLocation to, unsigned int flags, CUstream s)
{
    (void)ptr, (void)size, (void)to, (void)flags, (void)s;
    uint64_t bytes;
    int device;
    pump_ranges_remove(raced_base, &bytes, &device);
    pump_ranges_insert(raced_base, bytes, 1, false, device);
    return CUDA_ERROR_INVALID_VALUE;
}

static CUresult refused(CUdeviceptr ptr, size_t size, CUmemLocation to, unsigned int flags, CUstream s)
{
    (void)ptr, (void)size, (void)to, (void)flags, (void)s;
    return CUDA_ERROR_INVALID_VALUE;
}

static void test_a_refusal_marks_the_allocation_asked_about(void)
{
    raced_base = 0x7f4000000000ull;
    EXPECT(pump_ranges_insert(raced_base, 4 * MiB, 1, false, 0));
    struct pump_driver saved = pump_driver;
    pump_driver.prefetch_batch = NULL;
    pump_driver.exchange_capture_mode = NULL;
    CUmemLocation to = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0};
    CUdeviceptr ptr = raced_base;
    size_t size = 2 * MiB;
    pump_driver.prefetch_v2 = freed_while_asked;
    EXPECT(!pump_move_ranges(NULL, to, &ptr, &size, 1));
    EXPECT(find(raced_base) != NULL && !find(raced_base)->unprefetchable);  /* the new one is asked again */
    pump_driver.prefetch_v2 = refused;  /* the allocation itself refused: marked */
    EXPECT(!pump_move_ranges(NULL, to, &ptr, &size, 1));
    EXPECT(find(raced_base) != NULL && find(raced_base)->unprefetchable);
    pump_driver = saved;
    uint64_t bytes;
    int device;
    EXPECT(pump_ranges_remove(raced_base, &bytes, &device) == PUMP_REMOVED_ALLOCATION);
}

/* A refusal of memory managed_all took from a device's managed pool (flags 0, not
 * host-touchable), a tensor of such a segment included, is recorded for its device: managed_all
 * then turns from that pool to cuMemAllocManaged (managed_all_cache.c). cuMemAllocManaged's
 * memory, and the program's own pool, refused are not. */
static void test_a_pool_refusal_is_recorded_for_its_device(void)
{
    uint64_t own = 0x7f5000000000ull, programs = own + 64 * MiB, pooled = own + 128 * MiB, cbase, csize;
    EXPECT(pump_ranges_insert(own, 4 * MiB, CU_MEM_ATTACH_GLOBAL, false, 5));
    EXPECT(pump_ranges_insert(programs, 4 * MiB, 0, true, 5));
    EXPECT(pump_ranges_insert(pooled, 4 * MiB, 0, false, 6));
    struct pump_range *tensor = pump_ranges_insert_tensor(pooled, 2 * MiB, &cbase, &csize);
    EXPECT(tensor != NULL && tensor->flags == 0 && csize == 4 * MiB);  /* its segment's flags */
    struct pump_driver saved = pump_driver;
    pump_driver.prefetch_batch = NULL;
    pump_driver.exchange_capture_mode = NULL;
    pump_driver.prefetch_v2 = refused;
    CUmemLocation to = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0};
    CUdeviceptr ptrs[] = {own, programs};
    size_t sizes[] = {2 * MiB, 2 * MiB};
    EXPECT(!pump_move_ranges(NULL, to, ptrs, sizes, 2));
    EXPECT(find(own)->unprefetchable && find(programs)->unprefetchable);
    EXPECT(pump_pool_refusal_of(5) == CUDA_SUCCESS && pump_pool_refusal_of(6) == CUDA_SUCCESS);
    CUdeviceptr ptr = pooled;
    size_t size = 2 * MiB;
    EXPECT(!pump_move_ranges(NULL, to, &ptr, &size, 1));
    EXPECT(pump_pool_refusal_of(6) == CUDA_ERROR_INVALID_VALUE && pump_pool_refusal_of(5) == CUDA_SUCCESS);
    EXPECT(pump_pool_refusal_of(-1) == CUDA_SUCCESS && pump_pool_refusal_of(PUMP_DEVICES_MAX) == CUDA_SUCCESS);
    pump_driver = saved;
    uint64_t bytes;
    int device;
    EXPECT(pump_ranges_remove(own, &bytes, &device) == PUMP_REMOVED_ALLOCATION);
    EXPECT(pump_ranges_remove(programs, &bytes, &device) == PUMP_REMOVED_ALLOCATION);
    EXPECT(pump_ranges_remove(pooled, &bytes, &device) == PUMP_REMOVED_CARVED && device == 6);
}

/* A driver that refuses the first two timing events it is asked for (one probe's pair, the
 * first of them), then makes them. */
static int events_asked;

static CUresult events_refused_then_made(CUevent *event, unsigned int flags)
{
    (void)flags;
    *event = (CUevent)(uintptr_t)(0x1000 + events_asked);
    return events_asked++ == 0 ? CUDA_ERROR_OUT_OF_MEMORY : CUDA_SUCCESS;
}

static CUresult recorded(CUevent event, CUstream s)
{
    (void)event, (void)s;
    return CUDA_SUCCESS;
}

static CUresult elapsed(float *ms, CUevent start, CUevent end)
{
    (void)start, (void)end;
    *ms = 1.0f;
    return CUDA_SUCCESS;
}

/* A probe whose events the driver refused is broken for that life of its context only
 * (issue 42, risk 8): the same life asks no more, the next one makes them again. */
static void test_a_broken_probe_is_tried_again_in_its_contexts_next_life(void)
{
    struct pump_driver saved = pump_driver;
    pump_driver.exchange_capture_mode = NULL;
    pump_driver.event_create = events_refused_then_made;
    pump_driver.event_record = recorded;
    pump_driver.event_elapsed = elapsed;
    static struct pump_link_probe probe;  /* zeroed, as a context's slot */
    EXPECT(!pump_link_probe_begin(&probe, NULL, 0, NULL, 0, PUMP_BLOCK_SIZE) && events_asked == 1);
    EXPECT(!pump_link_probe_begin(&probe, NULL, 0, NULL, 0, PUMP_BLOCK_SIZE) && events_asked == 1);
    EXPECT(pump_link_probe_begin(&probe, NULL, 1, NULL, 0, PUMP_BLOCK_SIZE) && events_asked == 3);
    pump_link_probe_end(&probe, NULL, true);
    EXPECT(probe.probe.state == PUMP_PROBE_IN_FLIGHT);
    pump_driver = saved;
}

/* The memory cgroup's directory from /proc/self/cgroup and /proc/self/mountinfo: v2 on a
 * host, v1's memory hierarchy on a hybrid host (this project's CI machine), a container whose
 * cgroup namespace makes its own cgroup "/", a mount whose root is a cgroup below the top. */
static void test_cgroup_dir(void)
{
    static const char hybrid_cgroups[] = "4:memory:/process_api/e3\n3:cpuset:/\n0::/\n";
    static const char hybrid_mounts[] =
        "30 25 0:26 / /sys/fs/cgroup/unified rw,relatime shared:5 - cgroup2 cgroup2 rw\n"
        "35 25 0:31 / /sys/fs/cgroup/memory rw,relatime shared:14 - cgroup cgroup rw,memory\n"
        "36 25 0:32 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct\n";
    char dir[256];
    size_t mount_len = 0;
    EXPECT(pump_cgroup_dir(hybrid_cgroups, hybrid_mounts, false, dir, sizeof dir, &mount_len));
    EXPECT(strcmp(dir, "/sys/fs/cgroup/memory/process_api/e3") == 0 && mount_len == strlen("/sys/fs/cgroup/memory"));
    EXPECT(pump_cgroup_dir(hybrid_cgroups, hybrid_mounts, true, dir, sizeof dir, &mount_len));
    EXPECT(strcmp(dir, "/sys/fs/cgroup/unified") == 0);
    static const char v2_cgroups[] = "0::/system.slice/job-7.scope\n";
    static const char v2_mounts[] = "24 30 0:21 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n";
    EXPECT(pump_cgroup_dir(v2_cgroups, v2_mounts, true, dir, sizeof dir, &mount_len));
    EXPECT(strcmp(dir, "/sys/fs/cgroup/system.slice/job-7.scope") == 0 && mount_len == strlen("/sys/fs/cgroup"));
    EXPECT(!pump_cgroup_dir(v2_cgroups, v2_mounts, false, dir, sizeof dir, &mount_len));
    /* A pod: its namespace's root is its cgroup, mounted at /sys/fs/cgroup. */
    EXPECT(pump_cgroup_dir("0::/\n", v2_mounts, true, dir, sizeof dir, &mount_len) && strcmp(dir, "/sys/fs/cgroup") == 0);
    /* A bind mount of a cgroup below the top: the path is taken below the mount's root. */
    static const char bound[] = "40 30 0:21 /kubepods/pod1 /sys/fs/cgroup ro - cgroup2 cgroup2 rw\n";
    EXPECT(pump_cgroup_dir("0::/kubepods/pod1/c2\n", bound, true, dir, sizeof dir, &mount_len));
    EXPECT(strcmp(dir, "/sys/fs/cgroup/c2") == 0);
    EXPECT(!pump_cgroup_dir("0::/kubepods/pod10\n", bound, true, dir, sizeof dir, &mount_len));
    EXPECT(!pump_cgroup_dir(v2_cgroups, v2_mounts, true, dir, 8, &mount_len));  /* too long for dir */
    EXPECT(!pump_cgroup_dir(NULL, v2_mounts, true, dir, sizeof dir, &mount_len));
    EXPECT(!pump_cgroup_dir(v2_cgroups, "garbage\n\n- -\n", true, dir, sizeof dir, &mount_len));
    struct pump_host_room room;
    pump_host_room(&room);
    EXPECT(room.reserve >= 2ull << 30 && room.room <= room.available);
}

int main(void)
{
    test_cgroup_dir();
    test_capacity_grammar();
    test_range_table();
    test_carved_segments();
    test_a_tensor_over_freed_memory_waits_for_its_eviction();
    test_readers_race_writer();
    test_device_memory();
    test_budget_job_name_grammar();
    test_ring();
    test_plan();
    test_a_refusal_marks_the_allocation_asked_about();
    test_a_pool_refusal_is_recorded_for_its_device();
    test_a_broken_probe_is_tried_again_in_its_contexts_next_life();
    return expect_report("units");
}
