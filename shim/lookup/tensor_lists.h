/* tensor_lists.h: the slots of PyTorch's multi_tensor_apply tensor lists a launch fills
 * (see tensor_lists.c). */
#ifndef PUMP_TENSOR_LISTS_H
#define PUMP_TENSOR_LISTS_H

#include "shim.h"

/* A kernel's first parameter, as PyTorch lays its tensor list out. */
struct pump_tensor_list {
    uint16_t depth;              /* addresses[depth][tensors] from byte 0 */
    uint16_t tensors;            /* slots per list */
    uint32_t steps_at;           /* a fused optimizer's state_steps_addresses[tensors]; 0: none */
    uint32_t block_to_tensor_at; /* its entries: the tensor each block works on */
    uint16_t blocks;             /* block_to_tensor's entries */
    uint8_t entry_bytes;         /* each one's: 2 (2240 blocks) or 1 (320) */
    uint32_t size;               /* the struct's bytes */
};

/* Whether kernel `name`, whose first parameter is `size` bytes at offset 0, is PyTorch's
 * multi_tensor_apply_kernel over a tensor list it lays out (*out: how). */
PUMP_HIDDEN bool pump_tensor_list_of(const char *name, size_t size, struct pump_tensor_list *out);

/* The most slots a list has (a depth-1 list's). */
#define PUMP_TENSOR_LIST_SLOTS 770

/* Marks in read[slot] (PUMP_TENSOR_LIST_SLOTS entries, cleared here) the tensors a launch of
 * the list `meta` over `grid_x` blocks works on: the slots of every list its kernel reads. */
PUMP_HIDDEN void pump_tensor_list_read(const struct pump_tensor_list *list, const char *meta, unsigned grid_x,
                                       uint8_t *read);

#endif
