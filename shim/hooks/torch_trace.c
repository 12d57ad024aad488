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
 * A freed tensor is dead: the free tells the daemon so, and, with PUMP_TORCH_DISCARDS=1 (the default), where
 * pump's budget presses on the device (it evicted there lately, freed tensors' blocks first:
 * residency.h; under the launch rule: discards_here), the 2 MiB
 * blocks wholly inside it that pump believes on the device are discarded, so that no eviction
 * writes them back and the next tensor there is not brought in from the host (issue 41, item
 * 2). On a device the job's memory exceeds, once the GPU has passed the free, at a later hook of
 * the allocator (passed_discards.h); on one with room for it, at the free, as follows. The
 * discard goes in the order of the block's stream, the one the allocator hands the
 * memory out again on (it keeps a free block per stream; a use on another stream holds the
 * free back until that use is done, by record_stream, so the free is told only once it
 * completes): on that stream, or, for the legacy default stream, where the driver refuses a
 * discard, on a stream of pump's that events order after the legacy stream's work so far and
 * before its work to come (discard_marks.h). Every later use of the memory is on that stream,
 * after the discard; pump's moves of it wait for the discard (its mark), and none of pump's
 * earlier moves of it is under way (pump_residency_discard). Where nothing is evicted, nothing
 * is discarded: the caching allocator keeps the memory on the GPU, and a discard would make the
 * next tensor's first use populate it again.
 *
 * On by default (PUMP_TORCH_DISCARDS=0 keeps them): the first H100 run that discarded here
 * (bench/results/gpu-20261126-nvidia-h100-80gb-hbm3, case c) computed another loss than the job
 * without pump, and an H200 run (bench/results/gpu-20261126-nvidia-h200) NaN in most runs;
 * discarding on drained streams, the H200's case c (bench/results/gpu-20261127-nvidia-h200) was
 * bit-identical over 3 processes of 10 steps and 1.49x faster (docs/limits.md). The GPU suite's
 * case c runs it as launch-discards; bench/gpu/probes/discard_order.py checks both halves of the
 * order.
 */
#include "capacity.h"
#include "channel.h"
#include "hooks_common.h"
#include "names.h"
#include "passed_discards.h"
#include "pump_torch_trace.h"
#include "residency.h"

#define PUMP_EXPORT __attribute__((visibility("default")))

PUMP_EXPORT void pump_torch_trace(int event, uint64_t addr, uint64_t size, int flags, CUstream stream);
PUMP_EXPORT void pump_torch_trace_step(void);

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
    pump_names_bind(range, size);
    pump_channel_alloc(range, addr, size, CU_MEM_ATTACH_GLOBAL);
    /* after the insert: a dead tensor this one took over is not discarded under it */
    pump_passed_discards_make(__atomic_load_n(&range->device, __ATOMIC_RELAXED));
}

/* The live tensor starting at addr, or NULL. */
static struct pump_range *live_tensor(uint64_t addr)
{
    struct pump_range *range = pump_ranges_find(addr);
    return range != NULL && __atomic_load_n(&range->base, __ATOMIC_RELAXED) == addr &&
                   !__atomic_load_n(&range->counted, __ATOMIC_RELAXED)
               ? range
               : NULL;
}

/* Where the dead tensor `range` is discarded: where PUMP_TORCH_DISCARDS asks for it, under the
 * launch rule, within a budget set by PUMP_BUDGET or pump's own on a device the job's memory
 * exceeds; while a plan of pumpd's has triggers, only a named tensor (names.h).
 * Measured on bench-steady (docs/limits.md): there it cut the bytes each way 40% and the
 * launching thread's time 28%, at the same step time. A plan counts a dead
 * name's room free at its free (pump/foresight.py gives it no eviction), which only its discard
 * makes so: without one the plan's prefetches did not fit beside the dead blocks and the launch
 * rule made their room, writing the dead bytes back (the H200 case c replay's planned steps,
 * 9.7 GB in and 10.5 out against 5.5 and 6.1 with them). A plan on addresses (pump's allocator,
 * bench-steady's step) does not count on it, and there the discards' waits for the freeing
 * stream to drain made the planned step 2.8x slower for no byte less. */
static bool discards_here(const struct pump_range *range, int device)
{
    struct pump_channel *channel = pump_channel_get();
    return pump_config.torch_discards != PUMP_DISCARDS_OFF && pump_config.policy == PUMP_POLICY_LAUNCH &&
           (pump_config.budget_kind != PUMP_CAP_DEFAULT || pump_capacity_beyond_device(device)) &&
           (channel == NULL || channel->plan == NULL ||
            __atomic_load_n(&channel->plan->trigger_count, __ATOMIC_ACQUIRE) == 0 ||
            __atomic_load_n(&range->name, __ATOMIC_RELAXED) != 0);
}

/* Discards a dead tensor's whole blocks where pump's budget presses on their device: at its free,
 * on a device with room for the job's memory; on one it exceeds, once the GPU has passed the free
 * (passed_discards.h), where a discard at the free would wait for the freeing stream to drain. */
static void discard_dead(struct pump_range *range, CUstream stream)
{
    int device = __atomic_load_n(&range->device, __ATOMIC_RELAXED);
    /* memory the driver refused to prefetch is refused a discard too (cuda.h, same contract) */
    if (!pump_residency_pressed(device) || !discards_here(range, device) ||
        __atomic_load_n(&range->unprefetchable, __ATOMIC_RELAXED))
        return;
    if (pump_capacity_beyond_device(device)) {
        pump_passed_discards_note(range, stream);
        return;
    }
    struct pump_context *c = pump_context_of(stream);  /* NULL: the calling thread's context */
    if (c != NULL && pump_context_device(c) == device)
        PUMP_COUNT(torch_tensor_discards, pump_residency_discard(range, c, stream) != 0);
}

static void tensor_free(uint64_t addr, CUstream stream)
{
    struct pump_range *range = live_tensor(addr);
    int device = range != NULL ? __atomic_load_n(&range->device, __ATOMIC_RELAXED) : -1;
    uint64_t tracked;
    if (range != NULL)
        discard_dead(range, stream);
    if (pump_ranges_remove_tensor(addr, &tracked)) {
        PUMP_COUNT(torch_tensor_frees, 1);
        uint64_t name = range != NULL ? pump_names_release(range) : 0;
        pump_channel_free(name != 0 ? name : addr, tracked);
    }
    pump_passed_discards_make(device);
}

void pump_torch_trace(int event, uint64_t addr, uint64_t size, int flags, CUstream stream)
{
    /* A graph's private pool stays whole segments: its replays reuse the blocks freed
     * during capture without the allocator, and the graph's scan must find them. */
    if (!pump_active() || (flags & PUMP_TORCH_PRIVATE_POOL))
        return;
    if (event == PUMP_TORCH_TENSOR_ALLOC)
        tensor_alloc(addr, size);
    else if (event == PUMP_TORCH_TENSOR_FREE)
        tensor_free(addr, stream);
}

/* The optimizer finished a step (pump's start-up hook, beside the bridge): a STEP record, so that
 * a trace of a job on the caching allocator, whose tensors move from step to step and whose
 * launches repeat no key, still says where its steps end (the GPU suite's bound takes them: it had
 * none for GPT-2 on the H200, bench/results/gpu-20261126-nvidia-h200). pump's allocator marks its
 * own steps (pump_torch_step). */
void pump_torch_trace_step(void)
{
    static uint64_t steps;
    if (pump_driver_was_used() && pump_active()) {
        pump_names_step();
        pump_channel_step(__atomic_add_fetch(&steps, 1, __ATOMIC_RELAXED));
    }
}
