/* discard_marks.h: memory discarded when it dies (CUDA 13's cuMemDiscardBatchAsync), and the
 * marks that order pump's later moves of it after the discard (discard_marks.c). */
#ifndef PUMP_DISCARD_MARKS_H
#define PUMP_DISCARD_MARKS_H

#include "shim.h"

struct pump_context;

/* Whether memory freed on `stream` may be discarded there (pump_discard_freed): not on a
 * per-thread stream, nor while a capture may be open and the stream is the legacy one or
 * captured, nor where the driver lacks what it takes. */
PUMP_HIDDEN bool pump_discard_possible(CUstream stream);
/* Discards n runs of whole 2 MiB blocks (address order) of c's device, memory dead from this
 * point of `stream` on, in that stream's order: neither written back to the host nor migrated
 * in again. `stream` is the one a framework's allocator hands the memory out again on; NULL or
 * CU_STREAM_LEGACY, where the driver refuses a discard: on c's legacy peer, ordered after the
 * legacy stream's work so far and before its work to come, by events. Made in c's context,
 * whatever the calling thread's, where pump_discard_possible(stream) said so. The caller sees
 * to it that none of pump's moves of the runs is under way (pump_residency_discard). Returns its mark (0: nothing
 * discarded): pump's moves of memory allocated again over it must come after it on the GPU. */
PUMP_HIDDEN uint64_t pump_discard_freed(struct pump_context *c, CUdeviceptr *ptrs, size_t *sizes, uint32_t n,
                                        CUstream stream);
/* Discards n runs of whole 2 MiB blocks (address order) of c's device that nothing of the
 * program's touches until they are handed out again (a block pump keeps whose free the GPU has
 * passed: managed_all_cache.h; a caching allocator's dead tensor the same, whose stream then
 * waits for the mark: passed_discards.h), on c's legacy peer, which carries nothing but
 * discards: the program's streams are neither drained nor waited for. Made in c's context. Returns its mark
 * as pump_discard_freed does (0: nothing discarded); whoever uses the memory next waits for it
 * (pump_stream_after_discard, pump_discard_wait_host); one no stream can wait for
 * (PUMP_DISCARD_UNORDERED) was waited for here. */
PUMP_HIDDEN uint64_t pump_discard_held(struct pump_context *c, CUdeviceptr *ptrs, size_t *sizes, uint32_t n);
/* Whether c's legacy peer has nothing queued now: a discard made there (pump_discard_held) then
 * waits for no earlier one to drain. */
PUMP_HIDDEN bool pump_discard_peer_idle(struct pump_context *c);
/* Makes `stream` wait (on the GPU) for the marked discard, where it may still be running. */
PUMP_HIDDEN void pump_stream_after_discard(CUstream stream, uint64_t mark);
/* Waits on the host until the marked discard has run. */
PUMP_HIDDEN void pump_discard_wait_host(uint64_t mark);
/* Whether the marked discard was made on c's legacy peer: memory allocated again over it is
 * then populated on c's populate stream (pump_populate), made to wait for the discard, instead
 * of on c's prefetch stream, where that wait would hold every prefetch queued behind it until
 * the legacy stream reaches the free. */
PUMP_HIDDEN bool pump_discard_on_peer(uint64_t mark, const struct pump_context *c);
/* Prefetches n ranges of discarded memory to c's device on its populate stream, after the
 * evictions enqueued so far, which make its room (and after the discards
 * pump_populate_after_discard made it wait for): a prefetch that moves no byte. The kernel that
 * needs them waits for pump_populate_wait. */
PUMP_HIDDEN bool pump_populate(struct pump_context *c, CUdeviceptr *ptrs, size_t *sizes, size_t n);
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
/* ... or c's populate stream (pump_populate). */
PUMP_HIDDEN void pump_populate_after_discard(struct pump_context *c, uint64_t mark);

#endif
