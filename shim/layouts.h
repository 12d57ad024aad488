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
    uint32_t windows;          /* 64-byte-aligned 128-byte spans inside a parameter: where a TMA
                                  descriptor (CUtensorMap, alignas(64)) may sit (tensor_maps.h) */
    struct pump_word word[];   /* `words` entries, then `windows` (the spans' starts) */
};

/* The layout of f (a CUfunction, or a CUkernel cast to one); never NULL. */
PUMP_HIDDEN const struct pump_layout *pump_layout_of(CUfunction f);

/* From now on, fn hears of every function whose layout is built, and now of
 * those built before: each once, by whoever gets there first (the thread
 * building its layout, or this call). fn answers false when it could not
 * take it (the function is then offered again to a later announcer). The
 * channel announces them to pumpd this way; this cache knows nothing of it. */
PUMP_HIDDEN void pump_layouts_announce(bool (*fn)(CUfunction f));

#endif
