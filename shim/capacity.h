/* capacity.h: the cap on the process's managed footprint (PUMP_CAPACITY). */
#ifndef PUMP_CAPACITY_H
#define PUMP_CAPACITY_H

#include "shim.h"

/* Counts `bytes` of new managed memory against the cap; false (and one clear
 * line, the first time) when it would go past it. */
PUMP_HIDDEN bool pump_capacity_reserve(uint64_t bytes);
PUMP_HIDDEN void pump_capacity_release(uint64_t bytes);
/* A memory query's answer under managed_all: total = the cap, free = what the
 * footprint leaves of it; the driver's answer stays where no cap is set. */
PUMP_HIDDEN void pump_capacity_info(size_t *free_bytes, size_t *total_bytes);
/* The cap, once resolved, is above the device's free memory it was resolved
 * from (--capacity host, or more bytes than were free): managed memory can exceed
 * what the device holds. False until then, and where the device could not be read. */
PUMP_HIDDEN bool pump_capacity_beyond_device(void);

#endif
