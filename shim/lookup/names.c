/* names.c: tensors named by their place in the training step (see names.h).
 *
 * A name is (size, n): the n-th tensor of that size handed out since the optimizer's last step.
 * Its entry, made the first time the name is met, holds its address in the name space and the
 * live tensor that holds it now. Entries are only ever added, at rising addresses, so the array
 * is sorted: a translation finds a plan range's entry by binary search, with no lock, from the
 * count published after each entry is written. Two open-addressing tables under the lock map a
 * name to its entry and a size to its count in the current step (a count from an earlier step
 * reads as 0).
 */
#include <pthread.h>

#include "locks.h"
#include "names.h"

#define NAMES_MAX 65536u                 /* names in all; beyond, tensors go by their addresses */
#define NAME_SLOTS (2 * NAMES_MAX)       /* (size, n) -> entry, at most half full */
#define SIZE_SLOTS (2 * NAMES_MAX)       /* size -> its count this step, at most half full */
#define NAME_SPACING (2ull << 20)        /* names' addresses are 2 MiB aligned, one such gap between two */

struct name {
    uint64_t address, size;
    struct pump_range *live;             /* atomic: the tensor holding it, or NULL */
};

struct name_slot {
    uint64_t size;
    uint32_t n;
    uint32_t entry;                      /* entry index + 1; 0: empty */
};

struct size_count {
    uint64_t size;                       /* 0: empty */
    uint64_t step;                       /* the step `count` counts in */
    uint32_t count;
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct name entries[NAMES_MAX];
static uint32_t entry_count;             /* atomic: entries written, published with release */
static struct name_slot name_slots[NAME_SLOTS];
static struct size_count size_slots[SIZE_SLOTS];
static uint32_t sizes_used;
static uint64_t next_address = PUMP_NAMES_BASE;
static uint64_t steps;                   /* atomic: optimizer steps so far */

static uint32_t hash(uint64_t size, uint32_t n, uint32_t slots)
{
    return (uint32_t)(((size ^ (uint64_t)n << 48) * 0x9E3779B97F4A7C15ull) >> 40) & (slots - 1);
}

PUMP_HIDDEN void pump_names_step(void)
{
    __atomic_add_fetch(&steps, 1, __ATOMIC_RELAXED);
}

/* The number of this tensor among the step's tensors of its size, counted; -1: the table is full. */
static int64_t count_size(uint64_t size, uint64_t step)
{
    for (uint32_t i = hash(size, 0, SIZE_SLOTS);; i = (i + 1) & (SIZE_SLOTS - 1)) {
        struct size_count *s = &size_slots[i];
        if (s->size == 0) {
            if (sizes_used >= SIZE_SLOTS / 2)
                return -1;
            sizes_used++;
            *s = (struct size_count){.size = size, .step = step, .count = 0};
        }
        if (s->size != size)
            continue;
        if (s->step != step)
            s->step = step, s->count = 0;
        return s->count++;
    }
}

/* The entry of name (size, n), made if new; NULL: the table is full. */
static struct name *entry_of(uint64_t size, uint32_t n)
{
    for (uint32_t i = hash(size, n, NAME_SLOTS);; i = (i + 1) & (NAME_SLOTS - 1)) {
        struct name_slot *s = &name_slots[i];
        if (s->entry != 0 && s->size == size && s->n == n)
            return &entries[s->entry - 1];
        if (s->entry != 0)
            continue;
        uint32_t count = __atomic_load_n(&entry_count, __ATOMIC_RELAXED);
        if (count >= NAMES_MAX)
            return NULL;
        struct name *e = &entries[count];
        e->address = next_address;
        e->size = size;
        __atomic_store_n(&e->live, NULL, __ATOMIC_RELAXED);
        next_address += (size + NAME_SPACING - 1) / NAME_SPACING * NAME_SPACING + NAME_SPACING;
        *s = (struct name_slot){.size = size, .n = n, .entry = count + 1};
        __atomic_store_n(&entry_count, count + 1, __ATOMIC_RELEASE);
        return e;
    }
}

/* Whether e's holder still is the tensor that took it (a record outlives its tensor: one pump
 * dropped unseen, its record reused for another tensor, holds another name or none). */
static struct pump_range *holder(const struct name *e)
{
    struct pump_range *r = __atomic_load_n(&e->live, __ATOMIC_ACQUIRE);
    return r != NULL && __atomic_load_n(&r->name, __ATOMIC_RELAXED) == e->address ? r : NULL;
}

PUMP_HIDDEN void pump_names_bind(struct pump_range *r, uint64_t size)
{
    /* r->name is 0: the range table clears it whenever a record takes a tensor (ranges.c) */
    uint64_t step = __atomic_load_n(&steps, __ATOMIC_RELAXED);
    if (!pump_config.torch_names || step == 0 || size == 0)
        return;
    pump_mutex_lock(&lock);
    int64_t n = count_size(size, step);
    struct name *e = n >= 0 && n <= UINT32_MAX ? entry_of(size, (uint32_t)n) : NULL;
    bool taken = e != NULL && holder(e) != NULL;
    if (e != NULL && !taken) {
        __atomic_store_n(&r->name, e->address, __ATOMIC_RELAXED);
        __atomic_store_n(&e->live, r, __ATOMIC_RELEASE);
    }
    pump_mutex_unlock(&lock);
    if (e == NULL)
        pump_notice_once("more than %u tensor names (sizes and places in a step): later tensors go to pumpd by "
                         "their addresses, which change from step to step, and lookahead may not learn them",
                         NAMES_MAX);
    PUMP_COUNT(tensor_names_bound, e != NULL && !taken);
    PUMP_COUNT(tensor_names_taken, taken);
}

/* The entry whose name space holds address, or NULL. */
static struct name *entry_at(uint64_t address)
{
    uint32_t lo = 0, hi = __atomic_load_n(&entry_count, __ATOMIC_ACQUIRE);
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (entries[mid].address <= address)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo == 0)
        return NULL;
    struct name *e = &entries[lo - 1];
    return address - e->address < e->size ? e : NULL;
}

PUMP_HIDDEN uint64_t pump_names_release(struct pump_range *r)
{
    uint64_t name = __atomic_load_n(&r->name, __ATOMIC_RELAXED);
    if (name == 0)
        return 0;
    pump_mutex_lock(&lock);
    struct name *e = entry_at(name);
    if (e != NULL && __atomic_load_n(&e->live, __ATOMIC_RELAXED) == r)
        __atomic_store_n(&e->live, NULL, __ATOMIC_RELEASE);
    __atomic_store_n(&r->name, 0, __ATOMIC_RELAXED);
    pump_mutex_unlock(&lock);
    return name;
}

PUMP_HIDDEN void pump_names_translate(struct pump_plan_range *range)
{
    uint64_t address = range->address;
    if (address < PUMP_NAMES_BASE)
        return;
    struct name *e = entry_at(address);
    struct pump_range *r = e != NULL ? holder(e) : NULL;
    if (r == NULL) {
        range->bytes = 0;  /* no tensor holds the name now: nothing of it to move */
        PUMP_COUNT(tensor_names_unheld, 1);
        return;
    }
    uint64_t offset = address - e->address, left = e->size - offset;
    range->address = __atomic_load_n(&r->base, __ATOMIC_RELAXED) + offset;
    range->bytes = range->bytes < left ? range->bytes : left;
}

PUMP_HIDDEN void pump_names_before_fork(void)
{
    pump_mutex_lock(&lock);
}

PUMP_HIDDEN void pump_names_after_fork(void)
{
    pump_mutex_unlock(&lock);  /* in the child too: the forking thread, its only one, holds it */
}
