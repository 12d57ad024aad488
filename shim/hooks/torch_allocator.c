/* torch_allocator.c: pump's allocator for PyTorch, opt-in (`[memory] torch_allocator =
 * "pump"`; pump/boot/sitecustomize.py installs it through CUDAPluggableAllocator).
 *
 * PyTorch's caching allocator hands tensors out of large segments, so pump sees segments:
 * the extent of a launch's tensors and their deaths stay inside PyTorch. Here each tensor
 * is its own stream-ordered allocation, made through pump's own cuMemAllocAsync hook (under
 * managed_all: the stream device's managed pool, or cuMemAllocManaged memory freed in stream
 * order where the driver will not prefetch the pool's, within the capacity; in a capture: as
 * the program asked), so the range table, the budget and the daemon's ALLOC/FREE events see
 * exact tensors. At a free the tensor is dead from that point of its stream on: the 2 MiB
 * blocks wholly inside it that pump believes on the device are discarded in that stream's
 * order before the stream-ordered free, so dead memory is neither written back to the host nor migrated in again. The pool
 * may hand it out again at once: pump moves the new tensor's memory only after that
 * discard (prefetch.h's discard marks, residency.c).
 *
 * PyTorch calls these with the stream the tensor was allocated on, and never passes on
 * record_stream: a tensor may still be read on another stream when it is freed. So the
 * freeing stream first waits (on the GPU) for every other stream pump saw launches on, and
 * the discard is made only for a tensor pump saw all uses of (stream_users.c).
 *
 * A training step's tensors get the addresses they had the step before (placement.h), so that
 * pumpd's plans, keyed by addresses, hold from one step to the next: once the optimizer marked
 * a step (pump_torch_step, which pump's start-up hook calls after each optimizer step), a freed
 * tensor's block is kept by pump (managed_all_cache.h) instead of going back to the pool, and
 * each allocation takes the block the same allocation had, where it is free.
 *
 * PyTorch calls these as it would cudaMallocAsync, from any thread, naming the device: its
 * autograd engine runs backward on threads of its own, where nothing has made a context
 * current yet (c10::cuda::SetDevice skips cudaSetDevice when cudaGetDevice already answers
 * the device). The runtime makes the device's primary context current at such a thread's
 * first call; the driver's cuMemAllocAsync answers CUDA_ERROR_INVALID_CONTEXT there. So
 * pump's calls run in the device's primary context whenever none is current.
 */
#include <sys/types.h>

#include "channel.h"
#include "devices.h"
#include "held_discards.h"
#include "hooks_common.h"
#include "hooks_memory.h"
#include "managed_all.h"
#include "managed_all_cache.h"
#include "placement.h"
#include "prefetch.h"
#include "residency.h"
#include "stream_users.h"

#define PUMP_EXPORT __attribute__((visibility("default")))

PUMP_EXPORT void *pump_torch_alloc(ssize_t size, int device, CUstream stream);
PUMP_EXPORT void pump_torch_free(void *ptr, size_t size, int device, CUstream stream);
PUMP_EXPORT void pump_torch_step(void);

/* PyTorch's own allocators keep what they free: the caching allocator its segments, the
 * cudaMallocAsync backend its pool, whose release threshold it raises to UINT64_MAX before a
 * device's first allocation (c10/cuda/CUDAMallocAsyncAllocator.cpp, lazy_init_device). In
 * their place pump does the same at its first tensor on a device, through its own hook, so
 * that the managed pool standing in under managed_all follows (hooks_pool.c); at threshold 0
 * every tensor freed in a step would go back to the driver at the step's synchronisation and
 * be populated again the next step. */
#define KEEP_DEVICES 64
static _Atomic bool keeps_freed[KEEP_DEVICES];

static void keep_freed_memory(int device)
{
    if (device < 0 || device >= KEEP_DEVICES || pump_driver.device_get_default_mem_pool == NULL ||
        atomic_exchange_explicit(&keeps_freed[device], true, memory_order_acq_rel))
        return;
    CUmemoryPool pool;
    cuuint64_t keep_all = UINT64_MAX;
    if (pump_driver.device_get_default_mem_pool(&pool, device) != CUDA_SUCCESS ||
        pump_mem_pool_set_attribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep_all) != CUDA_SUCCESS)
        pump_log_once("torch_allocator: the device's memory pool keeps no freed memory: it is given back at "
                      "synchronisations and populated again");
}

/* The device's primary context, retained once (the runtime too keeps it for the process's
 * life), where the calling thread has no current context; else NULL: nothing to push. */
static _Atomic(CUcontext) primaries[KEEP_DEVICES];

static CUcontext context_needed(int device)
{
    CUcontext current = NULL;
    if (pump_driver.ctx_get_current == NULL || pump_driver.ctx_get_current(&current) != CUDA_SUCCESS ||
        current != NULL || device < 0 || device >= KEEP_DEVICES)
        return NULL;
    CUcontext primary = atomic_load_explicit(&primaries[device], memory_order_acquire);
    if (primary == NULL && pump_driver.primary_ctx_retain != NULL &&
        pump_driver.primary_ctx_retain(&primary, device) == CUDA_SUCCESS) {
        CUcontext none = NULL;
        if (!atomic_compare_exchange_strong_explicit(&primaries[device], &none, primary, memory_order_acq_rel,
                                                     memory_order_acquire))
            primary = none;  /* another thread's retain came first: one reference is enough */
    }
    return primary;
}

/* Whether tensors on `stream` are placed (once a step is marked): not on a stream being captured
 * (a graph keeps its own memory), nor without managed_all (device memory: nothing to plan). */
static bool placing(CUstream stream)
{
    return pump_config.torch_placement && pump_placement_steps() > 0 && pump_managed_all() &&
           !pump_stream_capturing(stream);
}

/* NULL is an out-of-memory answer: pump's bridge (pump/boot/torch_allocator.cpp) raises
 * PyTorch's OutOfMemoryError for it (PyTorch's CUDAPluggableAllocator would hand the NULL
 * to the tensor). */
void *pump_torch_alloc(ssize_t size, int device, CUstream stream)
{
    CUdeviceptr ptr = 0;
    pump_stream_users_start();
    if (size <= 0)
        return NULL;
    bool pushed, placed = pump_active() && placing(stream);
    struct pump_place place = placed ? pump_placement_want(device, (uint64_t)size, stream)
                                     : (struct pump_place){.ordinal = UINT32_MAX};
    CUresult r = CUDA_ERROR_INVALID_CONTEXT;
    if (pump_context_push(context_needed(device), &pushed)) {
        r = pump_torch_alloc_async(&ptr, (size_t)size, stream, placed ? &place : NULL);
        pump_context_pop(pushed);
    }
    pump_placement_made(&place, r == CUDA_SUCCESS ? ptr : 0);
    if (r != CUDA_SUCCESS)
        return NULL;
    keep_freed_memory(device);  /* the driver is loaded now; nothing was released yet */
    PUMP_COUNT(torch_allocs, 1);
    return (void *)(uintptr_t)ptr;
}

/* A dead tensor's blocks discarded on its own stream (pump_residency_discard, which refuses a
 * captured one: a replay would not free it again); never on the legacy stream. */
static void discard_dead(struct pump_range *range, CUstream stream)
{
    if (range == NULL || stream == NULL || stream == CU_STREAM_LEGACY)
        return;
    struct pump_context *c = pump_context_of(stream);
    if (c != NULL)
        (void)pump_residency_discard(range, c, stream);
}

void pump_torch_free(void *ptr, size_t size, int device, CUstream stream)
{
    (void)size;  /* the tensor's record has its extent */
    if (ptr == NULL)
        return;
    bool pushed;
    (void)pump_context_push(context_needed(device), &pushed);  /* not pushed: the free says why */
    CUdeviceptr dptr = (CUdeviceptr)(uintptr_t)ptr;
    bool placed = false, dead = false;
    if (pump_active()) {
        struct pump_range *range = pump_ranges_find(dptr);
        if (range != NULL && __atomic_load_n(&range->base, __ATOMIC_RELAXED) != dptr)
            range = NULL;  /* not a managed tensor */
        placed = placing(stream);
        /* memory the driver refused to prefetch is refused a discard too (cuda.h, same contract) */
        bool refused = range != NULL && __atomic_load_n(&range->unprefetchable, __ATOMIC_RELAXED);
        dead = pump_stream_users_order_free(stream, range) && !refused && range != NULL;
        if (dead && !(placed && pump_config.held_discards))  /* else at once, on its stream, drained */
            discard_dead(range, stream);
        else if (!dead && range != NULL)
            PUMP_COUNT(discards_declined, 1);
    }
    if (pump_torch_free_async(dptr, stream, placed) == CUDA_SUCCESS)
        PUMP_COUNT(torch_frees, 1);
    if (placed && dead && pump_config.held_discards) {  /* kept: discarded once the GPU passed the free */
        pump_kept_dead(dptr);
        pump_held_discards(device);
    }
    pump_context_pop(pushed);
}

/* The optimizer finished a step: a marker for placement, for pumpd and for traces (STEP). The
 * pools' blocks kept for placement and not taken again since go back to their pools (in their
 * contexts; no lock of pump's is held here). */
void pump_torch_step(void)
{
    if (!pump_driver_was_used() || !pump_active() || !pump_config.torch_placement)
        return;
    uint64_t steps = pump_placement_step();
    PUMP_COUNT(placement_steps, 1);
    pump_channel_step(steps);
    pump_kept_release_unplaced(steps, PUMP_REAL(mem_free), PUMP_REAL(mem_free_async));
}
