/* layouts.h: each kernel's parameter layout, asked of the driver once per
 * function handle and cached. The launch scan reads it on every launch.
 */
#ifndef PUMP_LAYOUTS_H
#define PUMP_LAYOUTS_H

#include "shim.h"
#include "tensor_lists.h"

/* `count` 8-byte-aligned words in a row inside one parameter (in the device-side layout),
 * each of which may hold a pointer; or, for a window, the start of one span. The scan reads a
 * parameter's words as one run: a by-value struct of thousands of words (PyTorch's
 * multi_tensor_apply) costs a load and a compare per word, not a table entry each. */
struct pump_word {
    uint32_t param;            /* parameter index: kernelParams[param] */
    uint32_t offset_in_param;  /* byte offset inside that parameter (of the first word) */
    uint32_t buffer_offset;    /* byte offset in the packed `extra` buffer (of the first word) */
    uint32_t count;            /* words in the run (1 for a window) */
};

struct pump_layout {
    bool known;                /* false: the driver could not tell us */
    uint32_t epoch;            /* the unload epoch it was (last) asked in (layouts.c) */
    struct pump_layout *retired_next;  /* once replaced: the list of those replaced */
    uint32_t params;
    uint32_t runs;             /* one per parameter of at least one word */
    uint32_t windows;          /* 64-byte-aligned 128-byte spans inside a parameter: where a TMA
                                  descriptor (CUtensorMap, alignas(64)) may sit (tensor_maps.h) */
    bool listed;               /* the first parameter is PyTorch's tensor list `list` (tensor_lists.h):
                                  read by its slots, and in no run */
    struct pump_tensor_list list;
    struct pump_word word[];   /* `runs` entries, then `windows` (the spans' starts) */
};

/* The layout of f (a CUfunction, or a CUkernel cast to one); never NULL. */
PUMP_HIDDEN const struct pump_layout *pump_layout_of(CUfunction f);

/* A module or library is about to be unloaded (and again once it was): its handles'
 * addresses may name other kernels from now on, so every layout is asked again at its
 * next launch. Lock-free, no driver call. */
PUMP_HIDDEN void pump_layouts_forget(void);

/* How many unloads have come (moved on by pump_layouts_forget; never 0): what a cache of
 * anything learned about a handle compares (read relaxed) to know it may be stale. */
extern PUMP_HIDDEN uint32_t pump_layouts_epoch;

/* From now on, fn hears of every function whose layout is built, and now of
 * those built before: each once, by whoever gets there first (the thread
 * building its layout, or this call). fn answers false when it could not
 * take it (the function is then offered again to a later announcer). The
 * channel announces them to pumpd this way; this cache knows nothing of it. */
PUMP_HIDDEN void pump_layouts_announce(bool (*fn)(CUfunction f));

#endif
