/* budget.h: the budget in force on each device, the cap on the managed bytes pump believes
 * resident there (residency.h holds its belief to it; 0: none). Three sources: the daemon's
 * plan's budget, else PUMP_BUDGET's (bytes, or a percentage of the device's memory); and,
 * where managed memory can exceed what the device holds (the capacity is above the device's
 * free memory: --capacity host, or more bytes than it has), pump's own default under either:
 *
 *     min(configured, the device's memory - foreign memory - margin)
 *
 * (pumpd's plans are told the same room: budget.c's PLANS), the
 * foreign memory a ledger of what in use is not this job's managed memory (budget.c),
 * read at the first launch that needs it and again at synchronisations, so that pump makes
 * room itself instead of the driver evicting behind its back. Only under policy launch (pump
 * prefetches: what it brings in pushes the rest out); policy off stays naive Unified Memory.
 * Read by the hooks, which pass the figure to residency.h's rules. */
#ifndef PUMP_BUDGET_H
#define PUMP_BUDGET_H

#include "prefetch.h"

/* A budget may be in force: PUMP_BUDGET is set, the plan has one, or pump's default may
 * apply. Cheap: read on every launch under policy off. */
PUMP_HIDDEN bool pump_budget_possible(void);

/* The budget in force on c's device (0: none), kept in the stats record's budget_bytes (and
 * pump's default in default_budget_bytes). Its first call on a device where pump's default
 * applies reads the device's memory (one driver call); later calls make none. */
PUMP_HIDDEN uint64_t pump_budget_for(struct pump_context *c);

/* After a synchronisation on `stream` (NULL: the calling thread's current context): where
 * pump's default is in force on the stream's device, its memory is read again and the default
 * follows it (with hysteresis). Elsewhere no driver call is made. */
PUMP_HIDDEN void pump_budget_synchronised(CUstream stream);

#endif
