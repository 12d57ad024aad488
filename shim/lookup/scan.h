/* scan.h: from a launch's arguments to the managed allocations it touches. */
#ifndef PUMP_SCAN_H
#define PUMP_SCAN_H

#include "ranges.h"

/* Every word of the driver's 32,764-byte parameter limit can name one allocation. */
#define PUMP_SCAN_MAX_RANGES 4095
/* Distinct allocations a scan holds in itself; a launch naming more (PyTorch's foreach
 * kernels, fused optimizers) is held in its thread's buffer instead. */
#define PUMP_SCAN_INLINE 64

struct pump_scan {
    uint32_t found;                /* distinct managed allocations */
    uint32_t own;                  /* range[0 .. own) are the launch's own; the rest came from the plan */
    bool unscanned;                /* the arguments could not be read */
    /* `found` entries: inline_range, or the calling thread's buffer, which holds them
     * until that thread's next scan (hooks do not nest on a thread). */
    struct pump_range **range;
    struct pump_range *inline_range[PUMP_SCAN_INLINE];
};

/* Fills *out for a launch of f over grid_x blocks (x) with kernelParams `params` or the
 * `extra` buffer form (at most one of them is non-NULL for a valid launch). */
PUMP_HIDDEN void pump_scan_launch(CUfunction f, void **params, void **extra, unsigned grid_x, struct pump_scan *out);

#endif
