/* ranges.c: the range table (see ranges.h).
 *
 * Most words a launch scan checks are not managed pointers, so a word first
 * meets a filter: a table of counters indexed by a hash of its 2 MiB chunk,
 * each counting the allocations that cover a chunk hashing there. A zero
 * means "no allocation here" for sure, with one load.
 *
 * Sorted arrays of [start, end) with a slot index into a fixed array of
 * records, guarded by a seqlock: a writer (under a mutex) makes the sequence
 * odd, edits, makes it even; a reader searches and retries if the sequence
 * moved. Every shared word is accessed atomically, so readers never
 * see torn values and the sanitizers see no data race. Records never move
 * and the arrays are never freed, so a reader racing a free can at worst use
 * a stale record: a wrong residency belief, not a crash.
 *
 * A segment carved into tensors (pump_ranges_insert_tensor) leaves the sorted
 * arrays for a small sorted list of its own, writer-only: launches find its
 * tensors, and its free finds it there. A freed tensor stays in the arrays,
 * marked dead, until a tensor of the same extent takes it over or another
 * overlapping it replaces it (what of it lies outside the new one stays, dead):
 * with thousands of live tensors, moving the arrays on every tensor's
 * allocation and free would cost microseconds each.
 */
#include <pthread.h>

#include "locks.h"
#include "ranges.h"

/* Shared words are stored with release and loaded with acquire: a reader
 * that sees a writer's data then sees its odd sequence, without fences
 * (which ThreadSanitizer cannot model). Both are plain moves on x86. */
#define LOAD(x) __atomic_load_n(&(x), __ATOMIC_ACQUIRE)
#define STORE(x, v) __atomic_store_n(&(x), (v), __ATOMIC_RELEASE)

static uint64_t starts[PUMP_RANGES_MAX];
static uint64_t ends[PUMP_RANGES_MAX];
static uint32_t slots[PUMP_RANGES_MAX];
static struct pump_range records[PUMP_RANGES_MAX];
static uint32_t count;
static uint64_t lowest = UINT64_MAX, highest;  /* bounds of all ranges: the cheap first test */
static _Atomic uint32_t sequence;

#define CHUNK_SHIFT 21        /* 2 MiB */
#define CHUNK_SLOTS 65536     /* power of two */
static uint16_t chunk_refs[CHUNK_SLOTS];

static pthread_mutex_t writer = PTHREAD_MUTEX_INITIALIZER;
static struct pump_range_observer observer;          /* set before any record */
static uint32_t free_slots[PUMP_RANGES_MAX];   /* writer-only */
static uint32_t free_count, slots_used;

/* Carved segments [start, end), sorted by start (writer-only). */
static uint64_t carved_starts[PUMP_CARVED_MAX];
static uint64_t carved_ends[PUMP_CARVED_MAX];
static bool carved_host_touchable[PUMP_CARVED_MAX];  /* its allocation's, for its tensors */
static int32_t carved_devices[PUMP_CARVED_MAX];      /* likewise */
static uint32_t carved_flags[PUMP_CARVED_MAX];       /* likewise: whether they are a managed pool's (0) */
static uint32_t carved_count;

static void write_begin(void)
{
    pump_mutex_lock(&writer);
    atomic_fetch_add_explicit(&sequence, 1, memory_order_acquire);  /* odd: edits follow */
}

static void write_end(void)
{
    uint32_t n = LOAD(count);
    STORE(lowest, n ? LOAD(starts[0]) : UINT64_MAX);
    STORE(highest, n ? LOAD(ends[n - 1]) : 0);
    uint32_t s = atomic_load_explicit(&sequence, memory_order_relaxed);
    atomic_store_explicit(&sequence, s + 1, memory_order_release);
    pump_mutex_unlock(&writer);
}

static uint32_t chunk_slot(uint64_t chunk)
{
    return (uint32_t)((chunk * 0x9E3779B97F4A7C15ull) >> 48) & (CHUNK_SLOTS - 1);
}

/* Adds delta to the filter counters of every chunk of [start, end) (writer). */
static void count_chunks(uint64_t start, uint64_t end, int delta)
{
    for (uint64_t chunk = start >> CHUNK_SHIFT; chunk <= (end - 1) >> CHUNK_SHIFT; chunk++) {
        uint16_t *ref = &chunk_refs[chunk_slot(chunk)];
        STORE(*ref, (uint16_t)(LOAD(*ref) + delta));
    }
}

/* Index of the first range whose start is > addr (writer or reader). */
static uint32_t upper_bound(uint32_t n, uint64_t addr)
{
    uint32_t lo = 0, hi = n;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (LOAD(starts[mid]) <= addr)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static void release_slot(uint32_t slot)
{
    free_slots[free_count++] = slot;
}

/* Takes entry i out of the arrays (writer); its record and slot stay, the caller's to end. */
static struct pump_range *unlink_at(uint32_t i)
{
    uint32_t n = LOAD(count), slot = LOAD(slots[i]);
    count_chunks(LOAD(starts[i]), LOAD(ends[i]), -1);
    for (uint32_t j = i; j + 1 < n; j++) {
        STORE(starts[j], LOAD(starts[j + 1]));
        STORE(ends[j], LOAD(ends[j + 1]));
        STORE(slots[j], LOAD(slots[j + 1]));
    }
    STORE(count, n - 1);
    return &records[slot];
}

static void end_record(struct pump_range *r)
{
    observer.gone(r);
    release_slot((uint32_t)(r - records));
}

static void erase_at(uint32_t i)
{
    end_record(unlink_at(i));
}

/* Index of the first carved segment whose start is > addr (writer). */
static uint32_t carved_upper_bound(uint64_t addr)
{
    uint32_t lo = 0, hi = carved_count;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (carved_starts[mid] <= addr)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static void carved_erase(uint32_t i)
{
    for (uint32_t j = i; j + 1 < carved_count; j++) {
        carved_starts[j] = carved_starts[j + 1];
        carved_ends[j] = carved_ends[j + 1];
        carved_host_touchable[j] = carved_host_touchable[j + 1];
        carved_devices[j] = carved_devices[j + 1];
        carved_flags[j] = carved_flags[j + 1];
    }
    carved_count--;
}

/* Erases the range at index i (writer): its bytes where it is counted, told to `dropped`
 * (NULL: nobody) with its device; 0 for a tensor. */
static uint64_t erase_counted(uint32_t i, void (*dropped)(int device, uint64_t bytes))
{
    const struct pump_range *r = &records[LOAD(slots[i])];
    uint64_t bytes = LOAD(r->counted) ? LOAD(ends[i]) - LOAD(starts[i]) : 0;
    if (bytes != 0 && dropped != NULL)
        dropped(LOAD(r->device), bytes);
    erase_at(i);
    return bytes;
}

/* Erases the ranges overlapping [base, end) (writer); the bytes of the counted ones, each
 * told to `dropped` (NULL: nobody) with its device. */
static uint64_t erase_overlapping(uint64_t base, uint64_t end, void (*dropped)(int device, uint64_t bytes))
{
    uint64_t counted = 0;
    uint32_t i = upper_bound(LOAD(count), base);
    if (i > 0 && LOAD(ends[i - 1]) > base)
        i--;
    while (i < LOAD(count) && LOAD(starts[i]) < end)
        counted += erase_counted(i, dropped);
    return counted;
}

/* Drops carved segment i and its tensors (writer): its bytes, told to `dropped`. */
static uint64_t drop_carved(uint32_t i, void (*dropped)(int device, uint64_t bytes))
{
    uint64_t bytes = carved_ends[i] - carved_starts[i];
    if (dropped != NULL)
        dropped(carved_devices[i], bytes);
    erase_overlapping(carved_starts[i], carved_ends[i], NULL);
    carved_erase(i);
    return bytes;
}

PUMP_HIDDEN uint64_t pump_ranges_drop_device(int device, void (*dropped)(int device, uint64_t bytes))
{
    uint64_t total = 0;
    write_begin();
    for (uint32_t i = carved_count; i-- > 0;)
        if (carved_devices[i] == device)
            total += drop_carved(i, dropped);
    for (uint32_t i = LOAD(count); i-- > 0;)
        if (LOAD(records[LOAD(slots[i])].device) == device)
            total += erase_counted(i, dropped);
    write_end();
    return total;
}

PUMP_HIDDEN uint64_t pump_ranges_drop(uint64_t base, uint64_t size, void (*dropped)(int device, uint64_t bytes))
{
    uint64_t end = base + size < base ? UINT64_MAX : base + size, total = 0;
    write_begin();
    if (end > LOAD(lowest) && base < LOAD(highest))
        total = erase_overlapping(base, end, dropped);
    uint32_t i = carved_upper_bound(base);
    if (i > 0 && carved_ends[i - 1] > base)
        i--;
    while (i < carved_count && carved_starts[i] < end)
        total += drop_carved(i, dropped);
    write_end();
    return total;
}

static uint64_t lives; /* atomic: the last record life handed out */

/* A record's state of a new allocation or tensor: nothing resident, announced or used. */
static void start_life(struct pump_range *r)
{
    STORE(r->life, __atomic_add_fetch(&lives, 1, __ATOMIC_RELAXED));
    STORE(r->resident_stamp, 0);
    STORE(r->announced, 0);
    STORE(r->accounted_on, 0);
    STORE(r->used_tick, 0);
    STORE(r->last_use, 0);
    STORE(r->dead, 0);
    STORE(r->launched, 0);
    STORE(r->unprefetchable, 0);
    STORE(r->name, 0);
}

/* Adds [base, base+size) at its place in the arrays (writer; nothing overlaps it). */
static struct pump_range *insert_locked(uint64_t base, uint64_t size, uint32_t flags, uint32_t counted,
                                        bool host_touchable, int device)
{
    uint32_t n = LOAD(count);
    if (n >= PUMP_RANGES_MAX || (free_count == 0 && slots_used >= PUMP_RANGES_MAX))
        return NULL;
    uint32_t i = upper_bound(n, base);
    uint32_t slot = free_count > 0 ? free_slots[--free_count] : slots_used++;
    STORE(records[slot].base, base);
    STORE(records[slot].size, size);
    STORE(records[slot].flags, flags);
    STORE(records[slot].counted, counted);
    STORE(records[slot].host_touchable, (uint32_t)host_touchable);
    STORE(records[slot].device, (int32_t)device);
    start_life(&records[slot]);
    count_chunks(base, base + size, +1);
    for (uint32_t j = n; j > i; j--) {
        STORE(starts[j], LOAD(starts[j - 1]));
        STORE(ends[j], LOAD(ends[j - 1]));
        STORE(slots[j], LOAD(slots[j - 1]));
    }
    STORE(starts[i], base);
    STORE(ends[i], base + size);
    STORE(slots[i], slot);
    STORE(count, n + 1);
    return &records[slot];
}

static void log_full(void)
{
    pump_log_once("more than %d managed allocations: the newest are not prefetched", PUMP_RANGES_MAX);
}

PUMP_HIDDEN struct pump_range *pump_ranges_insert(uint64_t base, uint64_t size, uint32_t flags,
                                                  bool host_touchable, int device)
{
    if (size == 0 || base + size < base)
        return NULL;
    write_begin();
    struct pump_range *inserted = insert_locked(base, size, flags, 1, host_touchable, device);
    write_end();
    if (!inserted)
        log_full();
    return inserted;
}

PUMP_HIDDEN enum pump_removed pump_ranges_remove(uint64_t base, uint64_t *size, int *device)
{
    enum pump_removed removed = PUMP_REMOVED_NOTHING;
    write_begin();
    uint32_t i = upper_bound(LOAD(count), base);
    uint32_t c = carved_upper_bound(base);
    if (i > 0 && LOAD(starts[i - 1]) == base && LOAD(records[LOAD(slots[i - 1])].counted)) {
        *size = LOAD(ends[i - 1]) - base;
        *device = LOAD(records[LOAD(slots[i - 1])].device);
        erase_at(i - 1);
        removed = PUMP_REMOVED_ALLOCATION;
    } else if (c > 0 && carved_starts[c - 1] == base) {
        *size = carved_ends[c - 1] - base;
        *device = carved_devices[c - 1];
        erase_overlapping(base, carved_ends[c - 1], NULL);  /* tensors whose frees pump missed */
        carved_erase(c - 1);
        removed = PUMP_REMOVED_CARVED;
    }
    write_end();
    return removed;
}

/* Carves the allocation at index i (writer): out of the arrays, into the carved list. Its
 * record, unlinked, for the tensor carved from it to replace (what pump knew of the memory
 * goes to the tensor and the freed rest of the segment); NULL when the list is full. */
static struct pump_range *carve_at(uint32_t i)
{
    if (carved_count == PUMP_CARVED_MAX) {
        pump_log_once("more than %d segments carved into tensors: the newest stay whole", PUMP_CARVED_MAX);
        return NULL;
    }
    uint64_t start = LOAD(starts[i]), end = LOAD(ends[i]);
    uint32_t c = carved_upper_bound(start);
    for (uint32_t j = carved_count; j > c; j--) {
        carved_starts[j] = carved_starts[j - 1];
        carved_ends[j] = carved_ends[j - 1];
        carved_host_touchable[j] = carved_host_touchable[j - 1];
        carved_devices[j] = carved_devices[j - 1];
        carved_flags[j] = carved_flags[j - 1];
    }
    carved_starts[c] = start;
    carved_ends[c] = end;
    carved_host_touchable[c] = LOAD(records[LOAD(slots[i])].host_touchable) != 0;
    carved_devices[c] = LOAD(records[LOAD(slots[i])].device);
    carved_flags[c] = LOAD(records[LOAD(slots[i])].flags);
    carved_count++;
    return unlink_at(i);
}

/* The records a tensor replaces (writer-only), kept until those made in their place took over. */
static struct pump_range *replaced[PUMP_RANGES_MAX];

/* A dead record of [start, end), what is left outside a new tensor of one it replaced (writer):
 * freed memory of the segment, still where it was. NULL when the table is full. */
static struct pump_range *insert_leftover(uint64_t start, uint64_t end, uint32_t flags, bool host_touchable,
                                          int device)
{
    if (start >= end)
        return NULL;
    struct pump_range *r = insert_locked(start, end - start, flags, 0, host_touchable, device);
    if (r != NULL)
        STORE(r->dead, 1);
    return r;
}

/* The tensor [base, end) in place of the records it overlaps (freed tensors, and stale ones whose
 * frees were missed; writer). What of those lies outside it stays, as freed tensors, and every
 * record made takes over what pump knew of their memory (observer.replaced) before they go: the
 * caching allocator splits and merges its blocks from step to step, and the memory stays on the
 * GPU all along. The new tensor, or NULL when the table is full. */
static struct pump_range *replace_locked(uint64_t base, uint64_t end, uint32_t flags, bool host_touchable,
                                         int device, struct pump_range *carved)
{
    uint32_t i = upper_bound(LOAD(count), base), n = 0;
    if (i > 0 && LOAD(ends[i - 1]) > base)
        i--;
    uint64_t left = base, right = end;  /* what the records replaced spanned, with the tensor */
    if (carved != NULL) {  /* it holds the tensor whole (pump_ranges_insert_tensor) */
        left = LOAD(carved->base);
        right = left + LOAD(carved->size);
        replaced[n++] = carved;
    }
    while (i < LOAD(count) && LOAD(starts[i]) < end) {
        if (n == 0 && LOAD(starts[i]) < base)
            left = LOAD(starts[i]);
        if (LOAD(ends[i]) > right)
            right = LOAD(ends[i]);
        replaced[n++] = unlink_at(i);
    }
    struct pump_range *made[3];
    uint32_t m = 0;
    struct pump_range *tensor = insert_locked(base, end - base, flags, 0, host_touchable, device);
    if (tensor != NULL)
        made[m++] = tensor;
    if ((made[m] = insert_leftover(left, base, flags, host_touchable, device)) != NULL)
        m++;
    if ((made[m] = insert_leftover(end, right, flags, host_touchable, device)) != NULL)
        m++;
    if (n > 0)
        observer.replaced(made, m, replaced, n);
    for (uint32_t k = 0; k < n; k++)
        end_record(replaced[k]);
    return tensor;
}

/* The carved segment holding [base, end) whole, or -1 (writer). */
static int64_t carved_holding(uint64_t base, uint64_t end)
{
    uint32_t c = carved_upper_bound(base);
    return c > 0 && carved_ends[c - 1] >= end ? (int64_t)c - 1 : -1;
}

PUMP_HIDDEN struct pump_range *pump_ranges_insert_tensor(uint64_t base, uint64_t size, uint64_t *carved_base,
                                                         uint64_t *carved_size)
{
    *carved_base = *carved_size = 0;
    uint64_t end = base + size;
    if (size == 0 || end < base)
        return NULL;
    struct pump_range *inserted = NULL, *carved = NULL;
    write_begin();
    uint32_t i = upper_bound(LOAD(count), base);
    bool held = carved_holding(base, end) >= 0;
    if (!held && i > 0 && LOAD(records[LOAD(slots[i - 1])].counted) && LOAD(ends[i - 1]) >= end) {
        uint64_t start = LOAD(starts[i - 1]), stop = LOAD(ends[i - 1]);
        carved = carve_at(i - 1);
        held = carved != NULL;
        if (held) {
            *carved_base = start;
            *carved_size = stop - start;
        }
    }
    int64_t segment = held ? carved_holding(base, end) : -1;
    bool host_touchable = held && carved_host_touchable[segment];
    int device = held ? carved_devices[segment] : -1;
    uint32_t flags = held ? carved_flags[segment] : 0;
    i = upper_bound(LOAD(count), base);  /* carving moved the arrays */
    struct pump_range *same = i > 0 && LOAD(starts[i - 1]) == base && LOAD(ends[i - 1]) == end
                                  ? &records[LOAD(slots[i - 1])]
                                  : NULL;
    if (held && carved == NULL && same != NULL && LOAD(same->dead) && !LOAD(same->counted)) {
        /* The same memory handed out again: what pump knows of it (residency, last use) stays. */
        STORE(same->life, __atomic_add_fetch(&lives, 1, __ATOMIC_RELAXED));
        STORE(same->announced, 0);
        STORE(same->dead, 0);
        STORE(same->name, 0);
        inserted = same;
    } else if (held) {
        inserted = replace_locked(base, end, flags, host_touchable, device, carved);
    }
    write_end();
    if (held && !inserted)
        log_full();
    return inserted;
}

PUMP_HIDDEN bool pump_ranges_remove_tensor(uint64_t base, uint64_t *size)
{
    bool found = false;
    write_begin();
    uint32_t i = upper_bound(LOAD(count), base);
    struct pump_range *r = i > 0 ? &records[LOAD(slots[i - 1])] : NULL;
    if (r != NULL && LOAD(starts[i - 1]) == base && !LOAD(r->counted) && !LOAD(r->dead)) {
        *size = LOAD(ends[i - 1]) - base;
        STORE(r->dead, 1);  /* kept in place, its residency too: see ranges.h */
        observer.freed(r);
        found = true;
    }
    write_end();
    return found;
}

PUMP_HIDDEN void pump_ranges_observe(struct pump_range_observer o)
{
    observer = o;
}

/* The allocation holding addr, or NULL, read from the arrays as they stand: consistent only where
 * no writer edits them meanwhile (the caller checks the sequence, or holds the writer's mutex). */
static struct pump_range *read_span(uint64_t addr, uint64_t *start, uint64_t *end, bool kept)
{
    uint32_t i = upper_bound(LOAD(count), addr);
    uint64_t e;
    if (i > 0 && addr < (e = LOAD(ends[i - 1])) && (kept || !LOAD(records[LOAD(slots[i - 1])].dead))) {
        *start = LOAD(starts[i - 1]);
        *end = e;
        return &records[LOAD(slots[i - 1])];
    }
    return NULL;
}

/* The allocation holding addr, or NULL: the seqlock-guarded search; where found, its bounds as
 * the same consistent reading saw them in [*start, *end). With kept, a freed tensor kept in
 * place (dead) is found too. */
static struct pump_range *search_span(uint64_t addr, uint64_t *start, uint64_t *end, bool kept)
{
    for (int attempt = 0; attempt < 64; attempt++) {
        uint32_t before = atomic_load_explicit(&sequence, memory_order_acquire);
        if (before & 1) {
            pump_cpu_relax();  /* a writer is mid-edit */
            continue;
        }
        uint64_t s = 0, e = 0;
        struct pump_range *found = read_span(addr, &s, &e, kept);
        if (atomic_load_explicit(&sequence, memory_order_relaxed) == before) {
            if (found != NULL) {
                *start = s;
                *end = e;
            }
            return found;
        }
    }
    /* A writer stayed mid-edit: on a loaded machine, preempted there. Giving up would miss this
     * word and, within microseconds, every later one of the launch (a live tensor left to fault).
     * Wait for the writer on its mutex, where this thread holds no pump lock: a lock it holds
     * may be one the writer's observers take next, and one it holds may be the writer's own. */
    if (pump_lock_depth != 0) {
        PUMP_COUNT(range_finds_missed, 1);
        return NULL;  /* a missed find, never a deadlock */
    }
    pump_mutex_lock(&writer);
    struct pump_range *found = read_span(addr, start, end, kept);
    pump_mutex_unlock(&writer);
    return found;
}

/* search_span after the cheap test against the bounds of every range. */
static struct pump_range *search(uint64_t addr, bool kept)
{
    uint64_t start, end;
    if (addr - LOAD(lowest) >= LOAD(highest) - LOAD(lowest))
        return NULL;
    return search_span(addr, &start, &end, kept);
}

PUMP_HIDDEN uint32_t pump_ranges_lookup(const uint64_t *words, uint32_t n, struct pump_range **found,
                                        uint32_t found_count, uint32_t found_max, uint64_t *hits)
{
    uint64_t lo = LOAD(lowest), span = LOAD(highest) - lo;
    /* The allocation the last hit fell in, as its search saw it: a by-value struct's pointers
     * (a foreach kernel's tensor lists) fall into one allocation many times in a row. */
    struct pump_range *last = NULL;
    uint64_t last_start = 0, last_span = 0;
    for (uint32_t w = 0; w < n; w++) {
        uint64_t addr = words[w];
        if (addr - lo >= span)
            continue;  /* outside every range (also when the table is empty) */
        struct pump_range *r = last;
        if (addr - last_start >= last_span) {
            if (LOAD(chunk_refs[chunk_slot(addr >> CHUNK_SHIFT)]) == 0)
                continue;  /* no allocation covers this 2 MiB chunk */
            uint64_t start, end;
            if ((r = search_span(addr, &start, &end, false)) == NULL)
                continue;
            last = r;
            last_start = start;
            last_span = end - start;
        }
        (*hits)++;
        uint32_t i = 0;
        while (i < found_count && found[i] != r)
            i++;
        if (i == found_count && found_count < found_max)
            found[found_count++] = r;
    }
    return found_count;
}

PUMP_HIDDEN struct pump_range *pump_ranges_find(uint64_t addr)
{
    return search(addr, false);
}

PUMP_HIDDEN struct pump_range *pump_ranges_find_kept(uint64_t addr)
{
    return search(addr, true);
}

PUMP_HIDDEN struct pump_range *pump_ranges_find_freed(uint64_t addr)
{
    pump_mutex_lock(&writer);
    uint32_t i = upper_bound(LOAD(count), addr);
    struct pump_range *found = i > 0 ? &records[LOAD(slots[i - 1])] : NULL;
    if (found != NULL && (!LOAD(found->dead) || LOAD(found->base) != addr))
        found = NULL;
    pump_mutex_unlock(&writer);
    return found;
}

PUMP_HIDDEN void pump_ranges_bounds(uint64_t *lowest_out, uint64_t *span)
{
    *lowest_out = LOAD(lowest);
    *span = LOAD(highest) - *lowest_out;
}

PUMP_HIDDEN bool pump_ranges_empty(void)
{
    return LOAD(count) == 0;
}

PUMP_HIDDEN void pump_ranges_each(void (*fn)(struct pump_range *range, void *arg), void *arg)
{
    pump_mutex_lock(&writer);
    uint32_t n = LOAD(count);
    for (uint32_t i = 0; i < n; i++)
        if (!LOAD(records[LOAD(slots[i])].dead))
            fn(&records[LOAD(slots[i])], arg);
    pump_mutex_unlock(&writer);
}

PUMP_HIDDEN void pump_ranges_before_fork(void)
{
    pump_mutex_lock(&writer);
}

PUMP_HIDDEN void pump_ranges_after_fork(void)
{
    pump_mutex_unlock(&writer);
}
