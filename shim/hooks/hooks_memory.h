/* hooks_memory.h: the stream-ordered allocation and free of hooks_memory.c, for pump's
 * allocator for PyTorch (torch_allocator.c), which places tensors (placement.h). */
#ifndef PUMP_HOOKS_MEMORY_H
#define PUMP_HOOKS_MEMORY_H

#include "placement.h"

/* cuMemAllocAsync as the program's own call would make it (managed_all's managed pool), but a
 * block pump keeps goes first, the one `place` names where it can (place NULL: as the hook). */
PUMP_HIDDEN CUresult pump_torch_alloc_async(CUdeviceptr *dptr, size_t bytesize, CUstream stream,
                                            const struct pump_place *place);
/* cuMemFreeAsync as the program's own call would make it; placing: pump keeps the block, a
 * managed pool's too, for an allocation to come, and what it knows of its memory with it
 * (a discard made at the free included: pump_residency_discard). */
PUMP_HIDDEN CUresult pump_torch_free_async(CUdeviceptr dptr, CUstream stream, bool placing);

#endif
