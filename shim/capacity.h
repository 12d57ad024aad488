/* capacity.h: the cap on the process's managed footprint (PUMP_CAPACITY). */
#ifndef PUMP_CAPACITY_H
#define PUMP_CAPACITY_H

#include "shim.h"

/* Counts `bytes` of new managed memory against the cap; false (and one clear
 * line, the first time) when it would go past it. */
PUMP_HIDDEN bool pump_capacity_reserve(uint64_t bytes);
/* Counts memory that is managed whatever the cap says (a managed pool's). */
PUMP_HIDDEN void pump_capacity_add(uint64_t bytes);
PUMP_HIDDEN void pump_capacity_release(uint64_t bytes);

#endif
