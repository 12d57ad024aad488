/* prefetch_ranges.h: the migration engine's driver calls for a list of
 * ranges (prefetch.h decides the stream and the destination). */
#ifndef PUMP_PREFETCH_RANGES_H
#define PUMP_PREFETCH_RANGES_H

#include "shim.h"

/* r is CUDA_SUCCESS; else counted as an error and logged with what failed. */
PUMP_HIDDEN bool pump_call_ok(CUresult r, const char *what);
/* Moves n ranges to `to` on `stream`, skipping allocations the driver refused
 * before; ptrs and sizes are compacted in place. False when a call failed. */
PUMP_HIDDEN bool pump_move_ranges(CUstream stream, CUmemLocation to, CUdeviceptr *ptrs, size_t *sizes, size_t n);
/* The CUresult with which the driver first refused to prefetch memory that managed_all took from
 * `device`'s managed pool (CUDA_SUCCESS: none refused so far). */
PUMP_HIDDEN CUresult pump_pool_refusal_of(int device);

#endif
