/* units.c: unit tests of the shim's internals, linked with the shim's objects
 * (plain and sanitized): the capacity grammar and the range table, including
 * lock-free readers racing a writer. Prints "units: N passed, M failed". */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "ranges.h"

static int passed, failed;

#define EXPECT(cond)                                                   \
    do {                                                               \
        if (cond) {                                                    \
            passed++;                                                  \
        } else {                                                       \
            failed++;                                                  \
            fprintf(stderr, "%s:%d: expected %s\n", __FILE__, __LINE__, #cond); \
        }                                                              \
    } while (0)

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
    };
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        enum pump_capacity_kind kind;
        uint64_t value;
        EXPECT(pump_parse_capacity(good[i].text, &kind, &value));
        EXPECT(kind == good[i].kind && value == good[i].value);
    }
    static const char *const bad[] = {"", "0", "0%", "101%", "1.5G", "5 G", "-1", "12X", "G", "%",
                                      "99999999999999999999", "20000000T", "8g"};
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

static void test_range_table(void)
{
    EXPECT(pump_ranges_empty());
    EXPECT(find(0x1000) == NULL);
    uint64_t base = 0x7f0000000000ull;
    EXPECT(pump_ranges_insert(base, 3 * MiB, 1));
    EXPECT(pump_ranges_insert(base + 8 * MiB, 1, 1));        /* a one-byte allocation */
    EXPECT(pump_ranges_insert(base - 4 * MiB, 4 * MiB, 1));  /* adjacent below */
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

    uint64_t size = 0;
    EXPECT(pump_ranges_remove(base, &size) && size == 3 * MiB);
    EXPECT(!pump_ranges_remove(base, &size));
    EXPECT(find(base + 1) == NULL);
    EXPECT(!pump_ranges_remove(base - 4 * MiB + 1, &size)); /* only exact bases */

    /* Memory handed out again over stale entries drops them. */
    EXPECT(pump_ranges_drop(base - 5 * MiB, 20 * MiB) == 4 * MiB + 1);
    EXPECT(pump_ranges_empty());
    EXPECT(pump_ranges_drop(base, MiB) == 0);
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
            pump_ranges_insert(RACE_BASE + (uint64_t)i * 4 * MiB, (1 + (uint64_t)(i + round) % 4) * MiB, 1);
        for (int i = 0; i < 64; i += 2) {
            uint64_t size;
            pump_ranges_remove(RACE_BASE + (uint64_t)i * 4 * MiB, &size);
        }
        pump_ranges_drop(RACE_BASE, 64 * 4 * MiB);
    }
    atomic_store(&stop, true);
    for (int i = 0; i < 3; i++)
        pthread_join(readers[i], NULL);
    EXPECT(atomic_load(&bad_reads) == 0);
    EXPECT(pump_ranges_empty());
}

int main(void)
{
    test_capacity_grammar();
    test_range_table();
    test_readers_race_writer();
    printf("units: %d passed, %d failed\n", passed, failed);
    return failed != 0;
}
