/* torch_trace.c: tensors' extents and deaths from PyTorch's own caching allocator, the
 * default (`[memory] torch_allocator = "caching"`).
 *
 * Under managed_all the caching allocator's segments are managed allocations, but kernels
 * use the tensors inside them: a launch naming one small tensor would prefetch its whole
 * 20 MiB segment, and a dead tensor would still be written back. The allocator reports
 * every block it hands out and takes back to its trace trackers; the bridge
 * (pump/boot/torch_trace.cpp, built against the job's PyTorch) forwards them here. A
 * segment's first tensor carves it (ranges.h): from then on launches, budgets and the
 * daemon see its tensors, each announced to the daemon as an allocation of its own, and
 * the segment's bytes stay counted against the capacity until its cuMemFree.
 *
 * A freed tensor is not discarded, unlike pump's own allocator's: a discard goes in the
 * block's stream's order, and the bridge forwards no stream (PyTorch's default stream is
 * the legacy one, where the driver refuses a discard anyway). The free still tells the
 * daemon the tensor is dead.
 */
#include "channel.h"
#include "hooks_common.h"
#include "pump_torch_trace.h"
#include "residency.h"

#define PUMP_EXPORT __attribute__((visibility("default")))

PUMP_EXPORT void pump_torch_trace(int event, uint64_t addr, uint64_t size, int flags);

static void tensor_alloc(uint64_t addr, uint64_t size)
{
    uint64_t carved_base, carved_size;
    struct pump_range *range = pump_ranges_insert_tensor(addr, size, &carved_base, &carved_size);
    if (range == NULL)
        return;  /* not managed memory (managed_all off, or left device memory) */
    if (carved_size != 0)
        pump_channel_free(carved_base, carved_size);  /* the daemon sees its tensors instead */
    pump_residency_attach(range);
    PUMP_COUNT(torch_tensor_allocs, 1);
    pump_channel_alloc(range, addr, size, CU_MEM_ATTACH_GLOBAL);
}

static void tensor_free(uint64_t addr)
{
    uint64_t tracked;
    if (pump_ranges_remove_tensor(addr, &tracked)) {
        PUMP_COUNT(torch_tensor_frees, 1);
        pump_channel_free(addr, tracked);
    }
}

void pump_torch_trace(int event, uint64_t addr, uint64_t size, int flags)
{
    /* A graph's private pool stays whole segments: its replays reuse the blocks freed
     * during capture without the allocator, and the graph's scan must find them. */
    if (!pump_active() || (flags & PUMP_TORCH_PRIVATE_POOL))
        return;
    if (event == PUMP_TORCH_TENSOR_ALLOC)
        tensor_alloc(addr, size);
    else if (event == PUMP_TORCH_TENSOR_FREE)
        tensor_free(addr);
}
