/* scan.h: from a launch's arguments to the managed allocations it touches. */
#ifndef PUMP_SCAN_H
#define PUMP_SCAN_H

#include "ranges.h"

/* Distinct allocations one launch can name before the rest are ignored. */
#define PUMP_SCAN_MAX_RANGES 64

struct pump_scan {
    uint32_t found;                /* distinct managed allocations */
    uint32_t own;                  /* range[0 .. own) are the launch's own; the rest came from the plan */
    bool unscanned;                /* the arguments could not be read */
    struct pump_range *range[PUMP_SCAN_MAX_RANGES];
};

/* Fills *out for a launch of f with kernelParams `params` or the `extra`
 * buffer form (at most one of them is non-NULL for a valid launch). */
PUMP_HIDDEN void pump_scan_launch(CUfunction f, void **params, void **extra, struct pump_scan *out);

#endif
