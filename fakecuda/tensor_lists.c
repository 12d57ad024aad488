/* tensor_lists.c: which pointer words of PyTorch's multi_tensor_apply tensor lists a launch's
 * kernel reads, for FAKECUDA_LAUNCH_LOG (images.c).
 *
 * PyTorch's foreach and fused-optimizer kernels take their tensors in a by-value struct
 * (aten/src/ATen/native/cuda/MultiTensorApply.cuh): addresses[depth][tensors], then
 * numel_for_tensor[tensors], (a scalar list's scalar_vals[tensors], a fused optimizer's
 * state_steps_addresses[tensors]), block_to_tensor[blocks], block_to_chunk[blocks]. The host
 * fills the slots of one launch's tensors and launches one block per chunk; block b works on
 * tensor block_to_tensor[b], reading its slot in every list. The struct is a local the host
 * reuses from launch to launch without clearing it, so the slots past a launch's tensors hold
 * the tensors of an earlier launch, or whatever the stack held: pointers the kernel never
 * reads. A scan that takes every word takes them too; this says which the kernel reads.
 *
 * Recognised by the kernel's name and its first parameter's exact size, in the layout of
 * PyTorch's builds for CUDA 13 and newer (torch 2.14's header; the tier's builds, 2.11 to 2.15,
 * are all such): 770, 448, 336, 252 and 210 tensors for depths 1 to 5 (a scalar list 672 at
 * depth 1; of complex<double>, 504 and 420 at depths 1 and 2), 2240 blocks, 16-bit entries.
 * Builds for older CUDA hold 110 to 30 tensors in 320 blocks with 8-bit entries: not
 * recognised, as any other name or size, since no build the tier runs would test it. */
#include <stdlib.h>
#include <string.h>

#include "tensor_lists.h"

enum kind { PLAIN, SCALAR_LIST, FUSED };

/* depth_to_max_tensors, _scalarlist and _scalarlist_of_complex_double, depth_to_max_blocks and
 * block_index_t's width of MultiTensorApply.cuh, for CUDA 13 and newer. */
static const unsigned tensors_of[5] = {770, 448, 336, 252, 210}, scalar_list_tensors[5] = {672, 448, 336, 252, 210},
                      complex_double_tensors[2] = {504, 420};
#define BLOCKS 2240  /* block_to_tensor's entries, 16-bit */

static size_t align_up(size_t n, size_t a)
{
    return (n + a - 1) / a * a;
}

/* The struct's size in this layout, its block_to_tensor and state steps' offsets set in out. */
static size_t layout(enum kind kind, unsigned depth, unsigned tensors, size_t scalar, fc_tensor_list *out)
{
    size_t at = 8 * (size_t)(depth + 1) * tensors, align = 8;
    out->steps_at = 0;
    if (kind == FUSED) {
        out->steps_at = at;
        at += 8 * (size_t)tensors;
    } else if (kind == SCALAR_LIST) {
        at = align_up(at, scalar) + scalar * tensors;
        align = scalar > align ? scalar : align;
    }
    out->depth = depth;
    out->tensors = tensors;
    out->block_to_tensor_at = at;
    at = align_up(at + 2 * BLOCKS, 4) + 4 * (size_t)BLOCKS;
    if (kind != SCALAR_LIST)
        at += 4;  /* start_tensor_this_launch */
    return align_up(at, align);
}

/* The depth after `prefix` in name ("...ILi<depth>E" or, for a scalar list, "I<type>Li<depth>E"). */
static unsigned depth_after(const char *name, const char *prefix)
{
    const char *p = strstr(name, prefix);
    if (!p || !(p = strstr(p + strlen(prefix), "Li")))
        return 0;
    char *end;
    unsigned long depth = strtoul(p + 2, &end, 10);
    return *end == 'E' && depth >= 1 && depth <= 5 ? (unsigned)depth : 0;
}

int fc_tensor_list_of(const char *name, size_t size, fc_tensor_list *out)
{
    const char *kernel = name ? strstr(name, "multi_tensor_apply_kernelI") : NULL;
    if (!kernel)
        return 0;
    static const struct { const char *prefix; enum kind kind; } kinds[] = {
        {"18TensorListMetadataI", PLAIN},
        {"28TensorListScalarListMetadataI", SCALAR_LIST},
        {"32FusedOptimizerTensorListMetadataI", FUSED},
    };
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
        unsigned depth = depth_after(kernel, kinds[k].prefix);
        if (!depth)
            continue;
        if (kinds[k].kind != SCALAR_LIST) {
            if (layout(kinds[k].kind, depth, tensors_of[depth - 1], 8, out) == size)
                return 1;
            continue;
        }
        for (size_t scalar = 1; scalar <= 16; scalar *= 2) {  /* the scalars' type: its size */
            unsigned tensors = scalar == 16 && depth <= 2 ? complex_double_tensors[depth - 1]
                                                          : scalar_list_tensors[depth - 1];
            if (layout(SCALAR_LIST, depth, tensors, scalar, out) == size)
                return 1;
        }
    }
    return 0;
}

static int ascending(const void *a, const void *b)
{
    size_t x = *(const size_t *)a, y = *(const size_t *)b;
    return (x > y) - (x < y);
}

size_t fc_tensor_list_reads(const fc_tensor_list *tl, const unsigned char *meta, unsigned grid_x, size_t *offsets)
{
    unsigned char *read = calloc(tl->tensors, 1);
    if (!read)
        return 0;
    unsigned blocks = grid_x < BLOCKS ? grid_x : BLOCKS;
    for (unsigned b = 0; b < blocks; b++) {
        const unsigned char *entry = meta + tl->block_to_tensor_at + 2 * (size_t)b;
        unsigned t = entry[0] | (unsigned)entry[1] << 8;  /* little-endian */
        if (t < tl->tensors)
            read[t] = 1;
    }
    size_t n = 0;
    for (unsigned t = 0; t < tl->tensors; t++) {
        if (!read[t])
            continue;
        for (unsigned d = 0; d < tl->depth; d++)
            offsets[n++] = 8 * ((size_t)d * tl->tensors + t);
        if (tl->steps_at)
            offsets[n++] = tl->steps_at + 8 * (size_t)t;
    }
    free(read);
    qsort(offsets, n, sizeof *offsets, ascending);
    return n;
}
