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

struct pump_range {
    uint64_t base;
    uint64_t size;
    /* Where pump believes the allocation is resident: pump_resident_stamp()
     * of the epoch and device it was prefetched for, 0 for nowhere. Read and
     * written with relaxed atomics: a stale belief costs faults, never values. */
    uint32_t resident_stamp;
};

/* Adds an allocation; call pump_ranges_drop() on its range first. */
PUMP_HIDDEN bool pump_ranges_insert(uint64_t base, uint64_t size);
/* Removes every allocation overlapping [base, base+size): memory the driver
 * just handed out cannot still be one (pump missed its free). Returns the
 * bytes they covered. */
PUMP_HIDDEN uint64_t pump_ranges_drop(uint64_t base, uint64_t size);
/* Removes the allocation starting at base; its size in *size. */
PUMP_HIDDEN bool pump_ranges_remove(uint64_t base, uint64_t *size);
/* The allocation holding addr, or NULL. */
PUMP_HIDDEN struct pump_range *pump_ranges_find(uint64_t addr);
PUMP_HIDDEN bool pump_ranges_empty(void);

PUMP_HIDDEN void pump_ranges_before_fork(void);
PUMP_HIDDEN void pump_ranges_after_fork(void);

#endif
