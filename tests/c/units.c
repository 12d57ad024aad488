/* units.c: unit tests of the shim's internals, linked with the shim's objects
 * (plain and sanitized): the capacity grammar and the range table, including
 * lock-free readers racing a writer and waiting for one held mid-edit, and a tensor carved over freed memory keeping its eviction; the
 * PUMP_BUDGET/JOB/NAME grammars; which allocation a refused prefetch marks (and which refusals
 * tell a managed pool's memory apart), and a timing probe broken in one life of its context and
 * made in the next (the channel's ring and plan: units_channel.c). Prints
 * "units: N passed, M failed". */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "device_memory.h"
#include "expect.h"
#include "host_room.h"
#include "link_rate.h"
#include "locks.h"
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

/* A writer held mid-edit (preempted there, on a loaded machine; here its observer sleeps while
 * the sequence is odd) must not make a launch's lookup miss a live allocation: a lookup holding
 * no pump lock waits for the writer (before, it gave up after 64 spins and the launch's later
 * words were all missed). One holding a pump lock gives up and counts it. */
static atomic_bool writer_inside;

static void slow_freed(struct pump_range *r)
{
    atomic_store(&writer_inside, true);
    nanosleep(&(struct timespec){.tv_nsec = 100 * 1000 * 1000}, NULL);
    pump_residency_freed(r);
}

static void *free_tensor_slowly(void *arg)
{
    uint64_t size;
    pump_ranges_remove_tensor((uint64_t)(uintptr_t)arg, &size);
    return NULL;
}

static void test_a_lookup_waits_for_a_writer_held_mid_edit(void)
{
    const uint64_t live = 0x700000000000ull, seg = live + 64 * MiB;
    uint64_t cbase, csize;
    EXPECT(pump_ranges_insert(live, 4 * MiB, 1, false, 0));
    EXPECT(pump_ranges_insert(seg, 4 * MiB, 1, false, 0));
    for (int locked = 0; locked < 2; locked++) {
        EXPECT(pump_ranges_insert_tensor(seg, MiB, &cbase, &csize) != NULL);
        pump_ranges_observe((struct pump_range_observer){
            .gone = pump_residency_detach, .freed = slow_freed, .replaced = pump_residency_replaced});
        atomic_store(&writer_inside, false);
        pthread_t writer_thread;
        pthread_create(&writer_thread, NULL, free_tensor_slowly, (void *)(uintptr_t)seg);
        while (!atomic_load(&writer_inside))
            sched_yield();
        uint64_t missed = pump_stats_record->range_finds_missed;
        pump_lock_depth += (unsigned)locked;  /* as a caller holding a pump lock */
        struct pump_range *r = find(live + MiB);
        pump_lock_depth -= (unsigned)locked;
        EXPECT(locked ? r == NULL && pump_stats_record->range_finds_missed == missed + 1
                      : r != NULL && r->base == live && pump_stats_record->range_finds_missed == missed);
        pthread_join(writer_thread, NULL);
        pump_ranges_observe((struct pump_range_observer){
            .gone = pump_residency_detach, .freed = pump_residency_freed, .replaced = pump_residency_replaced});
    }
    int device;
    uint64_t size;
    EXPECT(pump_ranges_remove(seg, &size, &device) == PUMP_REMOVED_CARVED);
    EXPECT(pump_ranges_remove(live, &size, &device) == PUMP_REMOVED_ALLOCATION);
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
    test_a_lookup_waits_for_a_writer_held_mid_edit();
    test_device_memory();
    test_budget_job_name_grammar();
    test_a_refusal_marks_the_allocation_asked_about();
    test_a_pool_refusal_is_recorded_for_its_device();
    test_a_broken_probe_is_tried_again_in_its_contexts_next_life();
    return expect_report("units");
}
