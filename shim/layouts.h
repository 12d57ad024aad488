/* layouts.h: each kernel's parameter layout, asked of the driver once per
 * function handle and cached. The launch scan reads it on every launch.
 */
#ifndef PUMP_LAYOUTS_H
#define PUMP_LAYOUTS_H

#include "shim.h"

/* One 8-byte-aligned word (in the device-side layout) that may hold a pointer. */
struct pump_word {
    uint32_t param;            /* parameter index: kernelParams[param] */
    uint32_t offset_in_param;  /* byte offset inside that parameter */
    uint32_t buffer_offset;    /* byte offset in the packed `extra` buffer */
};

struct pump_layout {
    bool known;                /* false: the driver could not tell us */
    uint32_t params;
    uint32_t words;
    struct pump_word word[];   /* `words` entries */
};

/* The layout of f (a CUfunction, or a CUkernel cast to one); never NULL. */
PUMP_HIDDEN const struct pump_layout *pump_layout_of(CUfunction f);

/* Sends pumpd a FUNCTION event for every function whose layout was built
 * before the channel was attached (each function is announced once, by
 * whoever gets there first: the thread building its layout, or this). */
struct pump_channel;
PUMP_HIDDEN void pump_layouts_announce(struct pump_channel *channel);

#endif
