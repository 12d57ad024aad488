/* ranges.h: the table of the process's managed allocations.
 *
 * Written on allocation and free (rare), read on every launch from any
 * thread (hot): readers take no lock; a sequence counter tells them to retry
 * if a writer moved entries under them.
 */
#ifndef PUMP_RANGES_H
#define PUMP_RANGES_H

#include "shim.h"

/* At most this many managed allocations are tracked at once; beyond, new
 * ones still work but are invisible to prefetching (logged once). */
#define PUMP_RANGES_MAX 65536

struct pump_blocks;

struct pump_range {
    uint64_t base;
    uint64_t size;
    /* Where pump believes the allocation is resident: pump_resident_stamp()
     * of the epoch and device it was prefetched for, 0 for nowhere. Read and
     * written with relaxed atomics: a stale belief costs faults, never values. */
    uint64_t resident_stamp;
    /* cuMemAllocManaged's flags; 0: a managed pool's memory (hooks_memory.c), whose prefetches
     * the driver may refuse (prefetch_ranges.c). A tensor has its segment's. */
    uint32_t flags;
    /* The device whose capacity counts it (devices.h; -1: none): a free releases it there. A
     * tensor has its segment's. */
    int32_t device;
    /* 1: memory the program allocated as managed itself (or a tensor of such a segment): the
     * host may touch it after a synchronisation, so pump's beliefs of it expire there. 0:
     * memory managed_all made managed, which the program believes is device memory and never
     * touches from the host (residency.h). */
    uint32_t host_touchable;
    /* 1 once its ALLOC event went to the daemon (whoever sets it first,
     * the allocating thread or the channel's attach, writes the event). */
    uint32_t announced;
    /* Device + 1 when every block is believed resident there (the budget's
     * accounting, which epochs do not expire), 0 otherwise: lets a launch
     * under policy off skip the residency lock. */
    uint32_t accounted_on;
    /* The last launch that used it, for eviction order and ordering:
     * used_tick is that launch's number among managed launches; last_use
     * names the event recorded after it (residency.c; 0: none recorded). */
    uint64_t used_tick;
    uint64_t last_use;
    /* Per-block residency (residency.c), under its lock; NULL until attached. */
    struct pump_blocks *blocks;
    /* 1: an allocation, its bytes counted against the capacity; 0: a tensor a framework's
     * allocator handed out of a carved segment, whose bytes are the segment's. */
    uint32_t counted;
    /* 1: a freed tensor, kept in place (invisible to lookups) so that the next tensor at
     * its address and size, the caching allocator's steady state, takes it over without
     * moving the table, and with what pump knows of its memory: its blocks stay (residency
     * belongs to the memory, which the caching allocator keeps on the GPU), first to go
     * under a budget (its observer's freed). */
    uint32_t dead;
    /* 1 once a scanned kernel launch named it (stream_users.c: only such memory is discarded). */
    uint32_t launched;
    /* 1 once the driver refused to prefetch it (prefetch.c): not asked again. */
    uint32_t unprefetchable;
    /* Which allocation or tensor the record holds: a new number each time one takes it (a
     * record, and an address, outlive their allocation: a refusal of a freed range must not
     * mark the allocation made there since, prefetch_ranges.c). */
    uint64_t life;
    /* What pumpd knows a tensor by (names.h): its name's address, or 0 (its base). */
    uint64_t name;
};

/* At most this many segments are carved into tensors at once; beyond, a segment stays
 * one allocation to pump (logged once). */
#define PUMP_CARVED_MAX 16384

/* Adds an allocation; call pump_ranges_drop() on its range first. Returns
 * its record, or NULL when the table is full. host_touchable, device: see pump_range. */
PUMP_HIDDEN struct pump_range *pump_ranges_insert(uint64_t base, uint64_t size, uint32_t flags,
                                                  bool host_touchable, int device);
/* Removes everything overlapping [base, base+size): memory the driver just
 * handed out cannot still be an allocation, a carved segment or a tensor (pump
 * missed a free). Returns the bytes they held against the capacity, and tells each
 * allocation's to `dropped` (NULL: nobody) with its device, under the table's lock. */
PUMP_HIDDEN uint64_t pump_ranges_drop(uint64_t base, uint64_t size, void (*dropped)(int device, uint64_t bytes));
/* Drops every allocation and tensor of `device` (its context went, and their memory with it),
 * each counted one told to `dropped`; returns their bytes. */
PUMP_HIDDEN uint64_t pump_ranges_drop_device(int device, void (*dropped)(int device, uint64_t bytes));

/* What pump_ranges_remove found at a base. */
enum pump_removed {
    PUMP_REMOVED_NOTHING = 0,
    PUMP_REMOVED_ALLOCATION,  /* an allocation: the daemon has yet to hear of its free */
    PUMP_REMOVED_CARVED       /* a carved segment, with any tensor left in it: its end was
                                 announced when it was carved */
};
/* Removes the allocation or carved segment starting at base (a free of the
 * memory the driver handed out); the bytes it held against the capacity in
 * *size, on *device. */
PUMP_HIDDEN enum pump_removed pump_ranges_remove(uint64_t base, uint64_t *size, int *device);

/* Tensors: what a framework's caching allocator hands out of its segments
 * (torch_trace.c). A tensor must lie inside an allocation, which is then
 * carved: it leaves the lookup (its tensors stand there instead) and its bytes
 * stay counted until its own free. Adds the tensor [base, base+size), dropping
 * stale tensors it overlaps; NULL (nothing changed) where no allocation or
 * carved segment holds it whole, or a table is full. A tensor of the extent of a freed
 * one gets its record back, residency included; one over other records replaces them,
 * what of them lies outside it staying as freed tensors, and takes what residency knew
 * of its memory from them (pump_range_observer.replaced). *carved_size: the bytes of
 * the allocation this call carved, starting at *carved_base (0: none). */
PUMP_HIDDEN struct pump_range *pump_ranges_insert_tensor(uint64_t base, uint64_t size, uint64_t *carved_base,
                                                         uint64_t *carved_size);
/* Ends the tensor starting at base; its size in *size. Its residency stays with its record
 * (its observer's freed) until a tensor of the same extent takes it over
 * or the record is erased. */
PUMP_HIDDEN bool pump_ranges_remove_tensor(uint64_t base, uint64_t *size);
/* Looks up n words (candidate pointers): each distinct allocation one of
 * them points into is appended to found[found_count..found_max), and every
 * word inside an allocation counts in *hits. Returns the new found_count. */
PUMP_HIDDEN uint32_t pump_ranges_lookup(const uint64_t *words, uint32_t n, struct pump_range **found,
                                        uint32_t found_count, uint32_t found_max, uint64_t *hits);
/* The cheap first test: a word can fall inside an allocation only if word - *lowest < *span
 * (with none, only an all-ones word passes, and finds nothing). */
PUMP_HIDDEN void pump_ranges_bounds(uint64_t *lowest, uint64_t *span);
PUMP_HIDDEN bool pump_ranges_empty(void);
/* The allocation holding addr, or NULL (lock-free; may be stale, as above). */
PUMP_HIDDEN struct pump_range *pump_ranges_find(uint64_t addr);
/* The same, or the freed tensor kept in place (`dead`) holding addr: memory whose residency
 * pump still knows, which the next tensor at its extent takes over (a plan's ranges). */
PUMP_HIDDEN struct pump_range *pump_ranges_find_kept(uint64_t addr);
/* The freed tensor kept in place (`dead`) that starts at addr, or NULL; under the writers' lock. */
PUMP_HIDDEN struct pump_range *pump_ranges_find_freed(uint64_t addr);
/* Whether range is memory managed_all took from a managed pool for the program (flags 0, not
 * host-touchable: not cuMemAllocManaged's, nor the program's own pool's). */
static inline bool pump_range_is_converted_pool(const struct pump_range *range)
{
    return __atomic_load_n(&range->flags, __ATOMIC_RELAXED) == 0 &&
           !__atomic_load_n(&range->host_touchable, __ATOMIC_RELAXED);
}
/* Calls fn on every allocation, in address order, with the table locked
 * against changes (fn must not change it). */
PUMP_HIDDEN void pump_ranges_each(void (*fn)(struct pump_range *range, void *arg), void *arg);

/* Who keeps state of each record above this table (residency, which knows
 * what is resident): told, under the writer lock, when a record's allocation
 * is gone (its slot is reused after) and when a tensor is freed (its record
 * kept). Set once, when libpump loads (lifecycle.c), before any record. The
 * table calls up only through these, so it knows nothing above it. */
struct pump_range_observer {
    void (*gone)(struct pump_range *range);
    void (*freed)(struct pump_range *range);
    /* made[0 .. m) (a tensor, and dead records of what is left outside it) take the place of
     * old[0 .. n) (address order), which are gone right after. */
    void (*replaced)(struct pump_range *const *made, uint32_t m, struct pump_range *const *old, uint32_t n);
};
PUMP_HIDDEN void pump_ranges_observe(struct pump_range_observer observer);

PUMP_HIDDEN void pump_ranges_before_fork(void);
PUMP_HIDDEN void pump_ranges_after_fork(void);

#endif
