/* capacity.h: the cap on the process's managed footprint (PUMP_CAPACITY), one on each device. */
#ifndef PUMP_CAPACITY_H
#define PUMP_CAPACITY_H

#include "shim.h"

/* Counts `bytes` of new managed memory on `device` (devices.h) against that device's cap;
 * false (and one clear line, the first time) when it would go past it. Memory of no known
 * device (-1) is not counted. ctx: a context of that device, in which the cap is resolved at
 * its first use (NULL: the calling thread's current one). */
PUMP_HIDDEN bool pump_capacity_reserve(int device, CUcontext ctx, uint64_t bytes);
PUMP_HIDDEN void pump_capacity_release(int device, uint64_t bytes);
/* A memory query's answer under managed_all, for the current context's `device`: total = the
 * cap (or what the process holds there, where device memory took it past), free = what the
 * managed footprint and the device memory pump let through (device_memory.h) leave of it; the
 * driver's answer stays where no cap is set. */
PUMP_HIDDEN void pump_capacity_info(int device, size_t *free_bytes, size_t *total_bytes);
/* The cap of `device`, once resolved, is above the device's free memory it was resolved from
 * (--capacity host, or more bytes than were free): managed memory there can exceed what the
 * device holds. False until then, and where the device could not be read. device < 0: any. */
PUMP_HIDDEN bool pump_capacity_beyond_device(int device);
/* The managed bytes the process has allocated on `device` now (its footprint). */
PUMP_HIDDEN uint64_t pump_capacity_footprint(int device);
/* The device's memory in use when its cap was resolved (its first managed allocation, or under
 * managed_all its first memory query) beside the device memory the process held then: others'
 * (a neighbour's, the driver's), none of it this job's managed memory, which had not reached the
 * device yet. False until then, and where the device could not be read. */
PUMP_HIDDEN bool pump_capacity_others_before(int device, uint64_t *bytes);
/* The device memory the process holds on `device` beside its managed footprint: what pump lets
 * through (device_memory.h) and what its pools keep (pool_memory.h). */
PUMP_HIDDEN uint64_t pump_capacity_held(int device);

#endif
