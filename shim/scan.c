/* scan.c: the launch scan.
 *
 * Every 8-byte-aligned word of every parameter (in the device-side layout
 * the driver reports) is looked up in the range table; pointers inside
 * struct arguments count the same as bare pointer arguments.
 *
 * The extent rule: a word that points anywhere inside a managed allocation
 * stands for the WHOLE allocation. A kernel may index anywhere from a pointer
 * (negative offsets included), and nothing at launch time says how far, so
 * the allocation is the tightest range that is always right. What it costs
 * is counted: bytes prefetched that no kernel used (fakecuda measures them)
 * and words that only looked like pointers (an integer argument whose value
 * happens to fall inside an allocation prefetches it for nothing).
 */
#include <string.h>

#include "layouts.h"
#include "scan.h"

/* How many (key, value) pairs of an `extra` array are read at most. */
#define PUMP_EXTRA_MAX_PAIRS 8
/* Words are gathered and looked up in batches of this many. */
#define PUMP_SCAN_BATCH 256

struct gather {
    struct pump_scan *out;
    uint64_t words, hits;
    uint32_t pending;
    uint64_t batch[PUMP_SCAN_BATCH];
};

static void flush(struct gather *g)
{
    g->out->found = pump_ranges_lookup(g->batch, g->pending, g->out->range, g->out->found, PUMP_SCAN_MAX_RANGES,
                                       &g->hits);
    g->words += g->pending;
    g->pending = 0;
}

static void add_word(struct gather *g, const char *p)
{
    memcpy(&g->batch[g->pending++], p, sizeof(uint64_t));  /* host copies need not be aligned */
    if (g->pending == PUMP_SCAN_BATCH)
        flush(g);
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

PUMP_HIDDEN void pump_scan_launch(CUfunction f, void **params, void **extra, struct pump_scan *out)
{
    out->found = 0;
    out->own = 0;
    out->unscanned = false;
    const struct pump_layout *layout = pump_layout_of(f);
    struct gather g;  /* not zero-initialised: the batch is 2 KiB */
    g.out = out;
    g.words = g.hits = 0;
    g.pending = 0;

    if (params != NULL) {
        if (!layout->known) {
            out->unscanned = true;  /* without a layout, kernelParams' length is unknown */
            return;
        }
        for (uint32_t w = 0; w < layout->words; w++)
            add_word(&g, (const char *)params[layout->word[w].param] + layout->word[w].offset_in_param);
    } else if (extra != NULL) {
        size_t size;
        const char *buffer = extra_buffer(extra, &size);
        if (buffer == NULL)
            return;
        if (layout->known) {
            for (uint32_t w = 0; w < layout->words; w++)
                if (layout->word[w].buffer_offset + 8 <= size)
                    add_word(&g, buffer + layout->word[w].buffer_offset);
        } else {
            for (size_t o = 0; o + 8 <= size; o += 8)
                add_word(&g, buffer + o);
        }
    }
    flush(&g);
    out->own = out->found;
    if (g.words > 0)
        PUMP_COUNT(scan_words, g.words);
    if (g.hits > 0)
        PUMP_COUNT(scan_hits, g.hits);
}
