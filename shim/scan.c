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

static void note(struct pump_scan *out, uint64_t word, uint64_t *hits)
{
    struct pump_range *r = pump_ranges_find(word);
    if (r == NULL)
        return;
    (*hits)++;
    for (uint32_t i = 0; i < out->found; i++)
        if (out->range[i] == r)
            return;
    if (out->found < PUMP_SCAN_MAX_RANGES)
        out->range[out->found++] = r;
}

static uint64_t read_word(const char *p)
{
    uint64_t v;
    memcpy(&v, p, sizeof v);  /* host copies need not be aligned */
    return v;
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
    out->unscanned = false;
    const struct pump_layout *layout = pump_layout_of(f);
    uint64_t words = 0, hits = 0;

    if (params != NULL) {
        if (!layout->known) {
            out->unscanned = true;  /* without a layout, kernelParams' length is unknown */
            return;
        }
        for (uint32_t w = 0; w < layout->words; w++) {
            const struct pump_word *word = &layout->word[w];
            note(out, read_word((const char *)params[word->param] + word->offset_in_param), &hits);
        }
        words = layout->words;
    } else if (extra != NULL) {
        size_t size;
        const char *buffer = extra_buffer(extra, &size);
        if (buffer == NULL)
            return;
        if (layout->known) {
            for (uint32_t w = 0; w < layout->words; w++)
                if (layout->word[w].buffer_offset + 8 <= size) {
                    note(out, read_word(buffer + layout->word[w].buffer_offset), &hits);
                    words++;
                }
        } else {
            for (size_t o = 0; o + 8 <= size; o += 8, words++)
                note(out, read_word(buffer + o), &hits);
        }
    }
    if (words > 0)
        PUMP_COUNT(scan_words, words);
    if (hits > 0)
        PUMP_COUNT(scan_hits, hits);
}
