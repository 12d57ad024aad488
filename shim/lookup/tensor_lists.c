/* tensor_lists.c: which words of PyTorch's multi_tensor_apply tensor lists a launch fills.
 *
 * PyTorch's foreach ops and fused optimizers (aten/src/ATen/native/cuda/MultiTensorApply.cuh)
 * pass their tensors to multi_tensor_apply_kernel in a by-value struct: addresses[depth][tensors],
 * numel_for_tensor[tensors], then a scalar list's scalar_vals[tensors] or a fused optimizer's
 * state_steps_addresses[tensors], block_to_tensor[blocks] and block_to_chunk[blocks]. The host
 * fills the slots of one launch's tensors from slot 0 and launches a block per chunk; block b
 * works on tensor block_to_tensor[b]. The struct is reused from launch to launch without being
 * cleared, so the slots past a launch's tensors still hold an earlier launch's: live tensors
 * the kernel never reads. The scan's rule, every word that points into an allocation, took
 * them all: on GPT-2 small, 3,858 allocations in 6 steps that only such slots pointed into,
 * and launches naming more than a LAUNCH record carries (docs/limits.md). Here the scan
 * takes, of such a launch's first parameter, the slots of the tensors its blocks work on, and
 * nothing else of it.
 *
 * Known by the kernel's name and its first parameter's exact size, in either layout PyTorch's
 * builds use: for CUDA 13 and newer in recent torch (2.14, 2.15), 770, 448, 336, 252 and 210
 * tensors at depths 1 to 5 (a scalar list 672 at depth 1, of complex<double> 504 and 420 at
 * depths 1 and 2), 2240 blocks of 16-bit entries; in CUDA's older 4 KB of kernel arguments
 * (torch 2.11 for any CUDA, the GPU machine's 2.11.0+cu130 too; any build for CUDA 12), 110, 64,
 * 48, 36 and 30 tensors (a scalar list 96, of complex<double> 72 and 60), 320 blocks of 8-bit
 * entries, a fused optimizer's state steps as many as a scalar list's slots. Any other name or
 * size (a PyTorch that changes the struct) is scanned word by word, as before. fakecuda reads
 * the same structs for its launch log (fakecuda/tensor_lists.c), on its own: tests/c/
 * units_tensor_lists.c and the real-client tier check one against the other.
 */
#include <string.h>

#include "tensor_lists.h"

enum list_kind { PLAIN, SCALAR_LIST, FUSED };

/* One header's limits (MultiTensorApply.cuh): depth_to_max_tensors, _scalarlist and
 * _scalarlist_of_complex_double, depth_to_max_blocks and block_to_tensor's entry width. */
struct header {
    uint16_t tensors[5], scalar_list[5], complex_double[2], blocks;
    uint8_t entry_bytes;
    bool steps_as_scalar_list;
};

static const struct header headers[] = {
    {{770, 448, 336, 252, 210}, {672, 448, 336, 252, 210}, {504, 420}, 2240, 2, false},
    {{110, 64, 48, 36, 30}, {96, 64, 48, 36, 30}, {72, 60}, 320, 1, true},
};

static size_t round_up(size_t n, size_t to)
{
    return (n + to - 1) / to * to;
}

/* The struct's size in header h for this kind, depth, slot count and scalar size; *out set to
 * its layout. */
static size_t list_size(const struct header *h, enum list_kind kind, unsigned depth, unsigned tensors, size_t scalar,
                        struct pump_tensor_list *out)
{
    size_t at = 8 * (size_t)(depth + 1) * tensors, align = 8;  /* past the addresses and numels */
    out->steps_at = 0;
    if (kind == FUSED) {
        out->steps_at = (uint32_t)at;
        at += 8 * (size_t)(h->steps_as_scalar_list ? h->scalar_list[depth - 1] : tensors);
    } else if (kind == SCALAR_LIST) {
        at = round_up(at, scalar) + scalar * tensors;
        align = scalar > align ? scalar : align;
    }
    out->depth = (uint16_t)depth;
    out->tensors = (uint16_t)tensors;
    out->block_to_tensor_at = (uint32_t)at;
    out->blocks = h->blocks;
    out->entry_bytes = h->entry_bytes;
    at = round_up(at + h->entry_bytes * (size_t)h->blocks, 4) + 4 * (size_t)h->blocks;  /* block_to_tensor, _chunk */
    if (kind != SCALAR_LIST)
        at += 4;  /* start_tensor_this_launch */
    out->size = (uint32_t)round_up(at, align);
    return out->size;
}

/* The depth named after `kind_name` ("...I" then "Li<depth>E", a scalar list's type between). */
static unsigned depth_in(const char *name, const char *kind_name)
{
    const char *p = strstr(name, kind_name);
    if (p == NULL || (p = strstr(p + strlen(kind_name), "Li")) == NULL)
        return 0;
    unsigned depth = (unsigned)(p[2] - '0');
    return depth >= 1 && depth <= 5 && p[3] == 'E' ? depth : 0;
}

PUMP_HIDDEN bool pump_tensor_list_of(const char *name, size_t size, struct pump_tensor_list *out)
{
    static const struct {
        const char *name;
        enum list_kind kind;
    } kinds[] = {
        {"18TensorListMetadataI", PLAIN},
        {"28TensorListScalarListMetadataI", SCALAR_LIST},
        {"32FusedOptimizerTensorListMetadataI", FUSED},
    };
    const char *kernel = name != NULL ? strstr(name, "multi_tensor_apply_kernelI") : NULL;
    if (kernel == NULL)
        return false;
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
        unsigned depth = depth_in(kernel, kinds[k].name);
        if (depth == 0)
            continue;
        for (size_t i = 0; i < sizeof headers / sizeof headers[0]; i++) {
            const struct header *h = &headers[i];
            if (kinds[k].kind != SCALAR_LIST) {
                if (list_size(h, kinds[k].kind, depth, h->tensors[depth - 1], 8, out) == size)
                    return true;
                continue;
            }
            for (size_t scalar = 1; scalar <= 16; scalar *= 2) {  /* the scalars' type, by its size */
                unsigned tensors = scalar == 16 && depth <= 2 ? h->complex_double[depth - 1] : h->scalar_list[depth - 1];
                if (list_size(h, SCALAR_LIST, depth, tensors, scalar, out) == size)
                    return true;
            }
        }
        return false;
    }
    return false;
}

PUMP_HIDDEN void pump_tensor_list_read(const struct pump_tensor_list *list, const char *meta, unsigned grid_x,
                                       uint8_t *read)
{
    memset(read, 0, PUMP_TENSOR_LIST_SLOTS);
    unsigned blocks = grid_x < list->blocks ? grid_x : list->blocks;
    for (unsigned b = 0; b < blocks; b++) {
        uint16_t tensor = 0;
        memcpy(&tensor, meta + list->block_to_tensor_at + list->entry_bytes * (size_t)b, list->entry_bytes);  /* LE */
        if (tensor < list->tensors)
            read[tensor] = 1;
    }
}
