/* scan.c: the launch scan.
 *
 * Every 8-byte-aligned word of every parameter (in the device-side layout
 * the driver reports) is looked up in the range table; pointers inside
 * struct arguments count the same as bare pointer arguments. kernelParams
 * carries no length: the layout, the driver's answer for this handle (asked
 * again after any unload, layouts.c), is the only bound on what is read.
 *
 * The extent rule: a word that points anywhere inside a managed allocation
 * stands for the WHOLE allocation. A kernel may index anywhere from a pointer
 * (negative offsets included), and nothing at launch time says how far, so
 * the allocation is the tightest range that is always right. What it costs
 * is counted: bytes prefetched that no kernel used (fakecuda measures them)
 * and words that only looked like pointers (an integer argument whose value
 * happens to fall inside an allocation prefetches it for nothing).
 *
 * Most launches name a few allocations: their words are looked up in batches
 * and kept in the scan itself. A launch that fills those PUMP_SCAN_INLINE
 * places (a foreach kernel's tensor lists) is scanned again, wide: word by
 * word, each allocation kept once through a hash set, in a buffer its thread
 * allocates on its first wide launch and keeps until it exits. No launch
 * allocates, and none pays for the wide ones.
 *
 * PyTorch's tensor lists (multi_tensor_apply's by-value metadata, its foreach ops' and fused
 * optimizers' first parameter) are the one exception: of that parameter, only the slots of the
 * tensors the launch's blocks work on are read (tensor_lists.h); the rest of its slots hold an
 * earlier launch's tensors.
 *
 * TMA descriptors (CUtensorMap) hide their address: once the program has made one
 * (tensor_maps.h), each 64-byte-aligned 128-byte span of a by-value argument is looked
 * up among the descriptors pump saw made, and one found adds the first and last byte of
 * the region it covers as two words.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "layouts.h"
#include "scan.h"
#include "tensor_lists.h"
#include "tensor_maps.h"

/* How many (key, value) pairs of an `extra` array are read at most. */
#define PUMP_EXTRA_MAX_PAIRS 8
/* Words are gathered and looked up in batches of this many. */
#define PUMP_SCAN_BATCH 256
/* A wide scan's hash set: a power of two, at least twice PUMP_SCAN_MAX_RANGES. */
#define WIDE_SLOTS 8192

/* A thread's room for the allocations of its wide launches. */
struct wide {
    struct pump_range *range[PUMP_SCAN_MAX_RANGES];
    struct pump_range *set[WIDE_SLOTS];  /* empty between scans */
};

static pthread_key_t wide_key;
static pthread_once_t wide_once = PTHREAD_ONCE_INIT;
static bool wide_key_made;

static void make_wide_key(void)
{
    wide_key_made = pthread_key_create(&wide_key, free) == 0;
}

/* The calling thread's buffer (freed when it exits), or NULL. */
static struct wide *wide_of_thread(void)
{
    pthread_once(&wide_once, make_wide_key);
    if (!wide_key_made) {
        pump_log_once("cannot keep a buffer per thread: launches naming more than %d managed allocations are "
                      "prefetched in part", PUMP_SCAN_INLINE);
        return NULL;
    }
    struct wide *w = pthread_getspecific(wide_key);
    if (w != NULL)
        return w;
    w = calloc(1, sizeof *w);
    if (w != NULL && pthread_setspecific(wide_key, w) != 0) {
        free(w);
        w = NULL;
    }
    if (w == NULL)
        pump_log_once("no memory to scan a launch naming more than %d managed allocations: it is prefetched in "
                      "part", PUMP_SCAN_INLINE);
    return w;
}

struct gather {
    struct pump_scan *out;
    bool full;           /* the scan's own places filled up: scan again, wide */
    uint64_t lowest, span;  /* the range table's bounds: a word outside them is not looked up */
    uint64_t words, hits, maps;
    uint32_t pending;
    uint64_t batch[PUMP_SCAN_BATCH];
};

static size_t wide_slot(const struct pump_range *r)
{
    return (size_t)(((uintptr_t)r >> 3) * 0x9E3779B97F4A7C15ull >> 40) & (WIDE_SLOTS - 1);
}

/* Keeps each allocation the batch's words point into once, in argument order. */
static void wide_flush(struct gather *g, struct wide *wide)
{
    struct pump_scan *out = g->out;
    for (uint32_t w = 0; w < g->pending && out->found < PUMP_SCAN_MAX_RANGES; w++) {
        struct pump_range *r;
        if (pump_ranges_lookup(&g->batch[w], 1, &r, 0, 1, &g->hits) == 0)
            continue;
        size_t slot = wide_slot(r);
        while (wide->set[slot] != NULL && wide->set[slot] != r)
            slot = (slot + 1) & (WIDE_SLOTS - 1);
        if (wide->set[slot] == NULL) {
            wide->set[slot] = r;
            out->range[out->found++] = r;
        }
    }
}

/* Empties the set, newest first: each entry's probe path then still holds the older
 * entries it was placed past. */
static void wide_clear(struct wide *w, const struct pump_scan *out)
{
    for (uint32_t i = out->found; i-- > 0;) {
        size_t slot = wide_slot(out->range[i]);
        while (w->set[slot] != out->range[i])
            slot = (slot + 1) & (WIDE_SLOTS - 1);
        w->set[slot] = NULL;
    }
}

/* The scan runs on every launch: these are inlined into it, once for the scan into its
 * own places (wide NULL), once for the wide one. */
#define SCAN_INLINE inline __attribute__((always_inline))

/* Looks up the pending words: into the scan's own places, or with `wide`, its thread's. */
static SCAN_INLINE void flush(struct gather *g, struct wide *wide)
{
    if (wide != NULL) {
        wide_flush(g, wide);
    } else {
        g->out->found = pump_ranges_lookup(g->batch, g->pending, g->out->range, g->out->found, PUMP_SCAN_INLINE,
                                           &g->hits);
        g->full = g->out->found == PUMP_SCAN_INLINE;
    }
    g->pending = 0;
}

/* Adds `count` words from p on; false once the scan must start again, wide. A word outside
 * every range (most of a by-value struct's: counts, indices, flags) costs a load and a
 * compare, and no lookup. */
static SCAN_INLINE bool add_words(struct gather *g, struct wide *wide, const char *p, size_t count)
{
    const uint64_t lowest = g->lowest, span = g->span;
    g->words += count;
    for (size_t w = 0; w < count; w++) {
        uint64_t word;
        memcpy(&word, p + 8 * w, sizeof word);  /* host copies need not be aligned */
        if (word - lowest >= span)
            continue;
        g->batch[g->pending++] = word;
        if (PUMP_UNLIKELY(g->pending == PUMP_SCAN_BATCH)) {
            flush(g, wide);
            if (g->full)
                return false;
        }
    }
    return true;
}

/* The packed argument buffer of the `extra` form, or NULL. */
static const char *extra_buffer(void **extra, size_t *size)
{
    const char *buffer = NULL;
    *size = 0;
    for (int i = 0; i < 2 * PUMP_EXTRA_MAX_PAIRS && extra[i] != CU_LAUNCH_PARAM_END; i += 2) {
        if (extra[i] == CU_LAUNCH_PARAM_BUFFER_POINTER)
            buffer = extra[i + 1];
        else if (extra[i] == CU_LAUNCH_PARAM_BUFFER_SIZE && extra[i + 1] != NULL)
            *size = *(const size_t *)extra[i + 1];
    }
    return *size > 0 ? buffer : NULL;
}

/* A TMA descriptor among the arguments stands for the first and last byte it covers. */
static bool add_tensor_map(struct gather *g, struct wide *wide, const char *p)
{
    uint64_t ends[2];
    if (!pump_tensor_map_find(p, &ends[0], &ends[1]))
        return true;
    g->maps++;
    ends[1] = ends[0] + ends[1] - 1;
    return add_words(g, wide, (const char *)ends, 2);
}

/* Looks the launch's 64-byte-aligned 128-byte spans up among the descriptors pump saw
 * made (tensor_maps.h); false when the scan's own places filled up first. */
static bool gather_tensor_maps(struct gather *g, struct wide *wide, const struct pump_layout *layout, void **params,
                               const char *buffer, size_t size)
{
    const struct pump_word *window = layout->word + layout->runs;
    if (params != NULL) {
        for (uint32_t w = 0; w < layout->windows; w++)
            if (!add_tensor_map(g, wide, (const char *)params[window[w].param] + window[w].offset_in_param))
                return false;
    } else if (layout->known) {
        for (uint32_t w = 0; w < layout->windows; w++)
            if (window[w].buffer_offset + PUMP_TENSOR_MAP_BYTES <= size &&
                !add_tensor_map(g, wide, buffer + window[w].buffer_offset))
                return false;
    } else {
        for (size_t o = 0; o + PUMP_TENSOR_MAP_BYTES <= size; o += PUMP_TENSOR_MAP_ALIGN)
            if (!add_tensor_map(g, wide, buffer + o))
                return false;
    }
    return true;
}

/* Adds the words of one list of slots (8 bytes each from `slots`) whose read[] is set. */
static bool add_slots(struct gather *g, struct wide *wide, const char *slots, const uint8_t *read, uint32_t count)
{
    for (uint32_t t = 0; t < count; t++)
        if (read[t] && !add_words(g, wide, slots + 8 * (size_t)t, 1))
            return false;
    return true;
}

/* Adds the words of PyTorch's tensor list `meta` that a launch over grid_x blocks reads
 * (tensor_lists.h), list by list; false once the scan must start again, wide. */
static bool gather_list(struct gather *g, struct wide *wide, const struct pump_tensor_list *list, const char *meta,
                        unsigned grid_x)
{
    uint8_t read[PUMP_TENSOR_LIST_SLOTS];
    pump_tensor_list_read(list, meta, grid_x, read);
    for (uint32_t d = 0; d < list->depth; d++)
        if (!add_slots(g, wide, meta + 8 * (size_t)d * list->tensors, read, list->tensors))
            return false;
    return list->steps_at == 0 || add_slots(g, wide, meta + list->steps_at, read, list->tensors);
}

/* Looks up the launch's words (kernelParams `params` in the layout, else the `extra`
 * buffer): false when the scan's own places filled up first. */
static SCAN_INLINE bool gather(struct gather *g, struct wide *wide, const struct pump_layout *layout, void **params,
                               const char *buffer, size_t size, unsigned grid_x)
{
    if (layout->listed) {  /* the first parameter, by its slots: a foreach launch's tensors */
        const char *meta = params != NULL ? params[0] : size >= layout->list.size ? buffer : NULL;
        if (meta != NULL && !gather_list(g, wide, &layout->list, meta, grid_x))
            return false;
    }
    if (params != NULL) {
        for (uint32_t r = 0; r < layout->runs; r++) {
            const struct pump_word *run = &layout->word[r];
            if (!add_words(g, wide, (const char *)params[run->param] + run->offset_in_param, run->count))
                return false;
        }
    } else if (layout->known) {
        for (uint32_t r = 0; r < layout->runs; r++) {
            const struct pump_word *run = &layout->word[r];
            size_t fit = run->buffer_offset + 8 <= size ? (size - run->buffer_offset) / 8 : 0;  /* words inside it */
            if (!add_words(g, wide, buffer + run->buffer_offset, run->count < fit ? run->count : fit))
                return false;
        }
    } else if (!add_words(g, wide, buffer, size / 8)) {
        return false;
    }
    /* Descriptors are looked for only once a program made one: no cost to others. */
    if (PUMP_UNLIKELY(atomic_load_explicit(&pump_tensor_maps_seen, memory_order_relaxed)) &&
        !gather_tensor_maps(g, wide, layout, params, buffer, size))
        return false;
    flush(g, wide);
    return !g->full;
}

static SCAN_INLINE void gather_start(struct gather *g, struct pump_scan *out, struct wide *wide)
{
    out->found = 0;
    out->range = wide != NULL ? wide->range : out->inline_range;
    g->out = out;
    g->full = false;
    pump_ranges_bounds(&g->lowest, &g->span);
    g->words = g->hits = g->maps = 0;
    g->pending = 0;
}

PUMP_HIDDEN void pump_scan_launch(CUfunction f, void **params, void **extra, unsigned grid_x, struct pump_scan *out)
{
    out->found = 0;
    out->own = 0;
    out->unscanned = false;
    out->range = out->inline_range;
    const struct pump_layout *layout = pump_layout_of(f);
    const char *buffer = NULL;
    size_t size = 0;
    if (params != NULL && !layout->known) {
        out->unscanned = true;  /* without a layout, kernelParams' length is unknown */
        return;
    }
    if (params == NULL && (extra == NULL || (buffer = extra_buffer(extra, &size)) == NULL))
        return;
    struct gather g;  /* not zero-initialised: the batch is 2 KiB */
    gather_start(&g, out, NULL);
    struct wide *wide;
    if (PUMP_UNLIKELY(!gather(&g, NULL, layout, params, buffer, size, grid_x)) && (wide = wide_of_thread()) != NULL) {
        gather_start(&g, out, wide);
        gather(&g, wide, layout, params, buffer, size, grid_x);
        wide_clear(wide, out);
    }
    out->own = out->found;
    if (g.words > 0)
        PUMP_COUNT(scan_words, g.words);
    if (g.hits > 0)
        PUMP_COUNT(scan_hits, g.hits);
    if (g.maps > 0)
        PUMP_COUNT(tensor_map_args, g.maps);
}
