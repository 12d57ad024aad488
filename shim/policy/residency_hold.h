/* residency_hold.h: the budget held after a kernel (residency.c's after-use step). */
#ifndef PUMP_RESIDENCY_HOLD_H
#define PUMP_RESIDENCY_HOLD_H

#include "residency_moves.h"

/* Policy off with a budget: the launch's blocks over ranges[0 .. n) are counted in (the kernel
 * faults in what it touches), then the oldest others leave until it holds. */
PUMP_HIDDEN void pump_off_rule(struct pump_context *c, int device, struct pump_range *const *ranges, uint32_t n,
                               uint64_t budget, uint64_t token);
/* Over the budget although every rule kept to it: the budget was lowered (the arbiter, `pump`
 * set) or a rule could not help it (policy off's launch larger than the budget). The oldest
 * blocks but those of ranges[0 .. n) leave. */
PUMP_HIDDEN void pump_hold_budget(struct pump_context *c, int device, struct pump_range *const *ranges, uint32_t n,
                                  uint64_t budget, uint64_t token);

#endif
