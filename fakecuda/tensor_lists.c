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
 * Recognised by the kernel's name and its first parameter's exact size, in either layout of
 * PyTorch's builds (MultiTensorApply.cuh; the two never have one size): for CUDA 13 and newer
 * in recent torch (2.14's header and 2.15's), 770, 448, 336, 252 and 210 tensors for depths 1
 * to 5 (a scalar list 672 at depth 1; of complex<double>, 504 and 420 at depths 1 and 2), 2240
 * blocks, 16-bit entries; within CUDA's older 4 KB of kernel arguments (every build of torch
 * 2.11, the GPU machine's 2.11.0+cu130 too, and any build for CUDA 12), 110, 64, 48, 36 and 30
 * tensors (a scalar list 96 at depth 1; of complex<double>, 72 and 60), 320 blocks, 8-bit
 * entries. A fused optimizer's state_steps_addresses has a scalar list's slots in 2.11's header,
 * a tensor list's in 2.14's. */
#include <stdlib.h>
#include <string.h>

#include "tensor_lists.h"

enum kind { PLAIN, SCALAR_LIST, FUSED };

/* One header's depth_to_max_tensors, _scalarlist and _scalarlist_of_complex_double,
 * depth_to_max_blocks, block_to_tensor's entry width, and whether state steps count as a scalar
 * list. */
typedef struct limits {
    unsigned tensors[5], scalar_list[5], complex_double[2], blocks, entry_bytes, steps_as_scalar_list;
} limits;
static const limits builds[] = {
    {{770, 448, 336, 252, 210}, {672, 448, 336, 252, 210}, {504, 420}, 2240, 2, 0},
    {{110, 64, 48, 36, 30}, {96, 64, 48, 36, 30}, {72, 60}, 320, 1, 1},
};

static size_t align_up(size_t n, size_t a)
{
    return (n + a - 1) / a * a;
}

/* The struct's size in build b's layout; its block_to_tensor and state steps' places set in out. */
static size_t layout(const limits *b, enum kind kind, unsigned depth, unsigned tensors, size_t scalar,
                     fc_tensor_list *out)
{
    size_t at = 8 * (size_t)(depth + 1) * tensors, align = 8;
    out->steps_at = 0;
    if (kind == FUSED) {
        out->steps_at = at;
        at += 8 * (size_t)(b->steps_as_scalar_list ? b->scalar_list[depth - 1] : tensors);
    } else if (kind == SCALAR_LIST) {
        at = align_up(at, scalar) + scalar * tensors;
        align = scalar > align ? scalar : align;
    }
    out->depth = depth;
    out->tensors = tensors;
    out->block_to_tensor_at = at;
    out->blocks = b->blocks;
    out->entry_bytes = b->entry_bytes;
    at = align_up(at + b->entry_bytes * (size_t)b->blocks, 4) + 4 * (size_t)b->blocks;
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
        for (size_t i = 0; depth && i < sizeof builds / sizeof builds[0]; i++) {
            const limits *b = &builds[i];
            if (kinds[k].kind != SCALAR_LIST) {
                if (layout(b, kinds[k].kind, depth, b->tensors[depth - 1], 8, out) == size)
                    return 1;
                continue;
            }
            for (size_t scalar = 1; scalar <= 16; scalar *= 2) {  /* the scalars' type: its size */
                unsigned tensors = scalar == 16 && depth <= 2 ? b->complex_double[depth - 1] : b->scalar_list[depth - 1];
                if (layout(b, SCALAR_LIST, depth, tensors, scalar, out) == size)
                    return 1;
            }
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
    unsigned blocks = grid_x < tl->blocks ? grid_x : tl->blocks;
    for (unsigned b = 0; b < blocks; b++) {
        const unsigned char *entry = meta + tl->block_to_tensor_at + tl->entry_bytes * (size_t)b;
        unsigned t = entry[0] | (tl->entry_bytes == 2 ? (unsigned)entry[1] << 8 : 0u);  /* little-endian */
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
