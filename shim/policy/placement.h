/* placement.h: where pump's allocator for PyTorch puts each tensor: where the same allocation
 * went in an earlier training step, so that a step's launch keys repeat (see placement.c). */
#ifndef PUMP_PLACEMENT_H
#define PUMP_PLACEMENT_H

#include "shim.h"

/* One allocation's place in its step: its number there, and the address the same allocation
 * had in the latest earlier step that agrees with this one so far (0: none). */
struct pump_place {
    int device;
    uint32_t ordinal;       /* UINT32_MAX: not placed (no step marked yet, or the step is too long) */
    uint32_t record;        /* the agreeing step's slot, for pump_placement_reserved */
    uint64_t generation;    /* the device's steps ended when it was asked: an end since voids it */
    CUdeviceptr preferred;
};

/* The optimizer finished a step: this step's allocations become the newest earlier step.
 * Returns the steps marked so far. */
PUMP_HIDDEN uint64_t pump_placement_step(void);
/* The steps marked so far (0: placement has not begun). */
PUMP_HIDDEN uint64_t pump_placement_steps(void);

/* The next allocation on `device`, of `size` bytes on `stream` (legacy-ABI handle): numbered,
 * with the address it is wanted at. */
PUMP_HIDDEN struct pump_place pump_placement_want(int device, uint64_t size, CUstream stream);
/* Whether `ptr` is where the agreeing step put a later allocation than `place`'s: a block
 * that allocation should find free, not one for `place` to take. */
PUMP_HIDDEN bool pump_placement_reserved(const struct pump_place *place, CUdeviceptr ptr);
/* The allocation went to ptr (0: it failed). */
PUMP_HIDDEN void pump_placement_made(const struct pump_place *place, CUdeviceptr ptr);

#endif
