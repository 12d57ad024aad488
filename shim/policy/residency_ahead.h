/* residency_ahead.h: room made ahead of the launches that will need it
 * (residency.c's launch rule, under a budget, where no plan is in force). */
#ifndef PUMP_RESIDENCY_AHEAD_H
#define PUMP_RESIDENCY_AHEAD_H

#include "residency_moves.h"

/* A launch rule's decision brought `brought` bytes to `device`, and evicted or not (under the
 * device's lock), where room may be made ahead: the room the next launches will want, learned
 * (0 where none is to be made: pump_ahead_evict then does nothing). */
PUMP_HIDDEN void pump_ahead_learn(int device, uint64_t brought, bool evicted, uint64_t budget);
/* After a launch on `device` (its kernel's use is `token`), when less room than two recent
 * launches brought is left under `budget`: the least recently used blocks but those of
 * ranges[0 .. n) leave until four launches' worth is free, their calls made by pump's worker. */
PUMP_HIDDEN void pump_ahead_evict(struct pump_context *c, int device, struct pump_range *const *ranges, uint32_t n,
                                  uint64_t budget, uint64_t token);

#endif
