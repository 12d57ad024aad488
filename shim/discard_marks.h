/* discard_marks.h: memory discarded when it dies (CUDA 13's cuMemDiscardBatchAsync), and the
 * marks that order pump's later moves of it after the discard (discard_marks.c). */
#ifndef PUMP_DISCARD_MARKS_H
#define PUMP_DISCARD_MARKS_H

#include "shim.h"

struct pump_context;

/* Discards the 2 MiB blocks wholly inside [ptr, ptr+size) of a managed
 * allocation, memory dead from this point of `stream` on, in that stream's
 * order: neither written back to the host nor migrated in again. Never on the
 * legacy NULL stream (the driver refuses it there) nor in a capture (a replay
 * would not free it again). Returns its mark (0: nothing discarded): pump's
 * moves of memory allocated again over it must come after it on the GPU. */
PUMP_HIDDEN uint64_t pump_discard_dead(CUdeviceptr ptr, size_t size, CUstream stream);
/* A mark no move can be ordered after (its event could not be recorded). */
#define PUMP_DISCARD_UNORDERED UINT64_MAX
/* The mark of the latest discard overlapping [start, start+bytes) that may
 * still be running (0: none). */
PUMP_HIDDEN uint64_t pump_discard_over(uint64_t start, uint64_t bytes);
/* The marked discard has run (never for PUMP_DISCARD_UNORDERED). */
PUMP_HIDDEN bool pump_discard_done(uint64_t mark);
/* Makes c's prefetch stream, or its eviction stream, wait for a marked discard. */
PUMP_HIDDEN void pump_prefetch_after_discard(struct pump_context *c, uint64_t mark);
PUMP_HIDDEN void pump_evict_after_discard(struct pump_context *c, uint64_t mark);

#endif
