/* passed_discards.h: PyTorch's caching allocator's dead tensors, discarded once the GPU has passed
 * their frees, where the job's memory is beyond its device (passed_discards.c). */
#ifndef PUMP_PASSED_DISCARDS_H
#define PUMP_PASSED_DISCARDS_H

#include "ranges.h"

/* The tensor `range`, live, is freed at this point of `stream` (the caching allocator's free,
 * before its record is removed): its free is marked there, to be discarded once the GPU passes
 * the mark. Called by the freeing thread, inside the allocator's hook. */
PUMP_HIDDEN void pump_passed_discards_note(struct pump_range *range, CUstream stream);
/* Discards the dead tensors of `device` whose frees the GPU has passed, oldest first, that no
 * tensor has taken over since; each freeing stream waits for its discard. Called only inside the
 * allocator's hooks of that device (torch_trace.c), which it runs holding its lock: no tensor is
 * handed out there meanwhile. */
PUMP_HIDDEN void pump_passed_discards_make(int device);
/* The program destroys `stream`: frees noted on it are dropped (pump never names it again). */
PUMP_HIDDEN void pump_passed_discards_forget(CUstream stream);
PUMP_HIDDEN void pump_passed_discards_before_fork(void);
/* In the child, the parent's frees are dropped: their streams and events are not the child's. */
PUMP_HIDDEN void pump_passed_discards_after_fork(bool child);

#endif
