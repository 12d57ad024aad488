/* prefetch.h: the migration engine: per-context streams and events, and the
 * driver calls that move managed memory to a GPU (prefetch) or back to the
 * host (eviction). What to move is decided in residency.c. */
#ifndef PUMP_PREFETCH_H
#define PUMP_PREFETCH_H

#include "discard_marks.h"
#include "shim.h"

struct pump_context;

/* The context `stream` belongs to (the NULL and per-thread streams: the
 * calling thread's current one), set up on first use; NULL when there is
 * none or pump could not make its streams there. Its device is the stream's. */
PUMP_HIDDEN struct pump_context *pump_context_of(CUstream stream);
/* The context was destroyed or reset, and pump's streams and events there
 * with it: they are never used again. The context's next use (the same
 * handle: a primary context after its reset) makes new ones in the same
 * place; tokens and marks from before count as done. */
PUMP_HIDDEN void pump_context_forget(CUcontext ctx);
PUMP_HIDDEN int pump_context_device(const struct pump_context *c);
/* The device of the context pump set up for ctx, or -1 (none: no launch there yet). */
PUMP_HIDDEN int pump_context_device_of(CUcontext ctx);
/* Whether pump has a context on `device` that has not gone. */
PUMP_HIDDEN bool pump_context_live_on(int device);
/* The memory of c's device (cuMemGetInfo in c's context, in relaxed capture
 * mode): false when it cannot be read. */
PUMP_HIDDEN bool pump_context_memory(struct pump_context *c, size_t *free_bytes, size_t *total_bytes);

/* True when `stream` is being captured into a graph (or cannot be asked):
 * pump then adds nothing to it. The driver is asked only while a capture may
 * be open in the process (captures.h). */
PUMP_HIDDEN bool pump_stream_capturing(CUstream stream);

/* Enqueues the move of n ranges to c's device on its prefetch stream. timeable: each byte
 * is on the host (pump evicted it), so the GPU may time the move for pumpd (link_rate.h). */
PUMP_HIDDEN bool pump_prefetch_to_device(struct pump_context *c, CUdeviceptr *ptrs, size_t *sizes, size_t n,
                                         bool timeable);
/* Makes `stream` wait (on the GPU) for everything on c's prefetch stream. */
PUMP_HIDDEN void pump_prefetch_wait(struct pump_context *c, CUstream stream);
/* ... on c's populate stream (discard_marks.h). */
PUMP_HIDDEN void pump_populate_wait(struct pump_context *c, CUstream stream);

/* Records a "use" event on `stream` (after the kernel just enqueued there)
 * and returns its token (0: none could be recorded). Evictions wait on it.
 * Of two tokens, the later use has the greater token >> this shift. */
#define PUMP_USE_SEQUENCE_SHIFT 24
PUMP_HIDDEN uint64_t pump_use_record(struct pump_context *c, CUstream stream);
/* Makes `stream` wait (on the GPU) for the point a token names. */
PUMP_HIDDEN void pump_use_wait(CUstream stream, uint64_t token);
/* Whether the GPU has passed the point a token names: PUMP_USE_PASSED, PUMP_USE_AHEAD (not yet),
 * or PUMP_USE_UNKNOWN (no token, a slot recorded again since, or the driver cannot say). */
enum pump_use_state { PUMP_USE_PASSED, PUMP_USE_AHEAD, PUMP_USE_UNKNOWN };
PUMP_HIDDEN enum pump_use_state pump_use_passed(uint64_t token);
/* Makes c's eviction stream wait for the use named by a token. */
PUMP_HIDDEN void pump_evict_after(struct pump_context *c, uint64_t token);
/* A token for everything enqueued so far on c's prefetch stream (0: none):
 * a kernel that needs a block of a planned prefetch waits on it. */
PUMP_HIDDEN uint64_t pump_prefetch_record(struct pump_context *c);
/* Enqueues the move of n ranges to the host on c's eviction stream. */
PUMP_HIDDEN bool pump_evict_to_host(struct pump_context *c, CUdeviceptr *ptrs, size_t *sizes, size_t n);
/* Makes `stream` wait (on the GPU) for everything on c's eviction stream. */
PUMP_HIDDEN void pump_evictions_wait(struct pump_context *c, CUstream stream);
/* Makes c's prefetch stream wait for the evictions enqueued so far. */
PUMP_HIDDEN void pump_prefetch_after_evictions(struct pump_context *c);

#endif
