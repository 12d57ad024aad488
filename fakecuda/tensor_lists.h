/* tensor_lists.h: which pointer words of PyTorch's multi_tensor_apply tensor lists a
 * launch's kernel reads (see tensor_lists.c). */
#ifndef FAKECUDA_TENSOR_LISTS_H
#define FAKECUDA_TENSOR_LISTS_H

#include <stddef.h>

/* The layout of a multi_tensor_apply kernel's first parameter, as its name and size give it. */
typedef struct fc_tensor_list {
    unsigned depth;           /* address lists: addresses[depth][tensors] from byte 0 */
    unsigned tensors;         /* slots per list */
    size_t steps_at;          /* a fused optimizer's state_steps_addresses[tensors]; 0: none */
    size_t block_to_tensor_at;  /* its entries: which tensor each block works on */
    unsigned blocks;          /* block_to_tensor's entries */
    unsigned entry_bytes;     /* each one's: 2 (2240 blocks) or 1 (320) */
} fc_tensor_list;

/* Whether the kernel `name`, whose first parameter is `size` bytes, is PyTorch's
 * multi_tensor_apply_kernel over a tensor list in a layout of its builds (out: it). */
int fc_tensor_list_of(const char *name, size_t size, fc_tensor_list *out);

/* The byte offsets, in the first parameter `meta`, of the pointer words the kernel reads when
 * launched over `grid_x` blocks, ascending, into `offsets` (room for depth + 1 times tensors):
 * how many. */
size_t fc_tensor_list_reads(const fc_tensor_list *tl, const unsigned char *meta, unsigned grid_x, size_t *offsets);

#endif
