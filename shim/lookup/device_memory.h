/* device_memory.h: the device memory pump lets through under managed_all, per device.
 *
 * What stays device memory (a communication library's allocations, a pool's the program
 * chose, stream-ordered allocations on drivers without managed pools: PyTorch's
 * cudaMallocAsync backend on CUDA 12) is held by the process beside its managed footprint:
 * memory queries count it as used (capacity.h), so that free + what the process holds never
 * passes the total they report. */
#ifndef PUMP_DEVICE_MEMORY_H
#define PUMP_DEVICE_MEMORY_H

#include "shim.h"

/* At most this many device allocations are counted at once; beyond, new ones are not
 * (logged once). */
#define PUMP_DEVICE_MEMORY_MAX 65536

/* Counts the allocation [base, base+size) on device (devices.h; -1: not counted). An
 * earlier one at the same base, whose free pump missed, is forgotten. */
PUMP_HIDDEN void pump_device_memory_add(CUdeviceptr base, uint64_t size, int device);
/* Forgets the allocation at base (its free, or memory handed out again there); false when
 * none was counted. */
PUMP_HIDDEN bool pump_device_memory_remove(CUdeviceptr base);
/* The bytes counted on device now. */
/* Forgets every allocation of `device` (its context went, and its memory with it). */
PUMP_HIDDEN void pump_device_memory_drop_device(int device);
PUMP_HIDDEN uint64_t pump_device_memory_held(int device);

PUMP_HIDDEN void pump_device_memory_before_fork(void);
PUMP_HIDDEN void pump_device_memory_after_fork(void);

#endif
