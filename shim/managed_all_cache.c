/* managed_all_cache.c: stream-ordered managed memory that the driver will prefetch.
 *
 * cuda.h 13.0 says the ranges of cuMemPrefetchAsync, cuMemPrefetchBatchAsync and
 * cuMemDiscardBatchAsync "must refer to managed memory allocated via cuMemAllocManaged or
 * declared via __managed__"; a managed pool's memory (what managed_all takes cuMemAllocAsync
 * from) is neither. Whether the driver refuses it is asked once per device (hooks_memory.c);
 * where it does, converted stream-ordered allocations come from cuMemAllocManaged, and this
 * cache gives them what the pool gave: a free in stream order, with no wait on the host.
 *
 * - A free keeps the block, with a use token (prefetch.h) recorded on the freeing stream: the
 *   point after which nothing may touch it.
 * - An allocation of the same size on the same device takes a kept block: on the stream that
 *   freed it at once (stream order), on another after that stream waits, on the GPU, for the
 *   token (a pool's REUSE_ALLOW_INTERNAL_DEPENDENCIES, on by default). Only the same size is
 *   taken: no block is split.
 * - A synchronisation of the freeing stream, or of its context, shows the free ran. Then, as a
 *   pool does "on the next call to stream, event or context synchronize", a device keeping
 *   more than the release threshold the program set on its default pool (followed as for the
 *   managed pool, managed_all.c; PyTorch's UINT64_MAX keeps everything) gives its oldest such
 *   blocks back (cuMemFree, in the block's context); so does a trim of that pool, down to
 *   what it asks to keep. A block whose free is not known to have run stays (a pool counts it
 *   as outstanding too).
 *
 * Kept blocks are outside the capacity count, as a pool's kept memory is; a context that goes
 * takes its blocks with it. One lock guards the table, never held across a driver call.
 */
#include <pthread.h>
#include <stdlib.h>

#include "capture_mode.h"
#include "locks.h"
#include "context_cache.h"
#include "devices.h"
#include "managed_all.h"
#include "managed_all_cache.h"
#include "prefetch.h"

static _Atomic int answers[PUMP_DEVICES_MAX];

PUMP_HIDDEN enum pump_pool_prefetch pump_pool_prefetch_of(int device)
{
    return device >= 0 && device < PUMP_DEVICES_MAX ? atomic_load_explicit(&answers[device], memory_order_acquire)
                                                   : PUMP_POOL_PREFETCHED;
}

PUMP_HIDDEN void pump_pool_prefetch_decided(int device, enum pump_pool_prefetch answer)
{
    int unasked = PUMP_POOL_UNASKED;
    if (device < 0 || device >= PUMP_DEVICES_MAX ||
        !atomic_compare_exchange_strong_explicit(&answers[device], &unasked, (int)answer, memory_order_acq_rel,
                                                 memory_order_acquire))
        return;
    if (answer == PUMP_POOL_REFUSED)
        pump_log(1, "managed_all: device %d's driver refuses to prefetch managed pool memory: its stream-ordered "
                    "allocations come from cuMemAllocManaged, freed in stream order by pump",
                 device);
    else
        pump_log(1, "managed_all: device %d's driver prefetches managed pool memory: stream-ordered allocations "
                    "come from its managed pool",
                 device);
}

struct kept {
    CUdeviceptr ptr;
    size_t size;
    int device;
    CUstream stream;  /* freed on (legacy-ABI handle) */
    CUcontext ctx;    /* the stream's */
    uint64_t token;   /* the free's point on its stream (0: none could be recorded) */
    uint64_t order;   /* the oldest goes back first */
    bool done;        /* a synchronisation since showed the free ran */
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct kept *kept;
static size_t kept_count, kept_room;
static uint64_t kept_bytes[PUMP_DEVICES_MAX];
static uint64_t kept_order;

/* The per-thread default stream is one handle for as many streams as threads. */
static bool same_stream(CUstream a, CUstream b)
{
    return a == b && a != CU_STREAM_PER_THREAD;
}

/* Under the lock. */
static void drop(size_t i)
{
    kept_bytes[kept[i].device] -= kept[i].size;
    kept[i] = kept[--kept_count];
}

PUMP_HIDDEN CUdeviceptr pump_unpooled_take(size_t size, int device, CUstream stream)
{
    struct kept block = {.ptr = 0};
    pump_mutex_lock(&lock);
    for (size_t i = 0; i < kept_count; i++) {
        struct kept *k = &kept[i];
        if (k->size == size && k->device == device && (k->done || k->token != 0 || same_stream(k->stream, stream))) {
            block = *k;
            drop(i);
            break;
        }
    }
    pump_mutex_unlock(&lock);
    if (block.ptr == 0)
        return 0;
    if (!block.done && !same_stream(block.stream, stream))
        pump_use_wait(stream, block.token);
    PUMP_COUNT(unpooled_reuses, 1);
    return block.ptr;
}

static bool make_room(void)
{
    if (kept_count < kept_room)
        return true;
    size_t room = kept_room != 0 ? 2 * kept_room : 256;
    struct kept *more = realloc(kept, room * sizeof *kept);
    if (more == NULL)
        return false;
    kept = more;
    kept_room = room;
    return true;
}

PUMP_HIDDEN bool pump_unpooled_keep(CUdeviceptr ptr, size_t size, int device, CUstream stream)
{
    if (device < 0 || device >= PUMP_DEVICES_MAX || pump_stream_capturing(stream))
        return false;
    struct pump_context *c = pump_context_of(stream);
    uint64_t token = c != NULL ? pump_use_record(c, stream) : 0;
    CUcontext ctx = pump_stream_context(stream);
    pump_mutex_lock(&lock);
    bool room = make_room();
    if (room) {
        kept[kept_count++] = (struct kept){.ptr = ptr, .size = size, .device = device, .stream = stream,
                                           .ctx = ctx, .token = token, .order = ++kept_order};
        kept_bytes[device] += size;
    }
    pump_mutex_unlock(&lock);
    if (!room)
        pump_log_once("managed_all: no memory to keep a freed block: the driver frees it");
    return room;
}

PUMP_HIDDEN bool pump_unpooled_holds(CUdeviceptr ptr)
{
    bool held = false;
    pump_mutex_lock(&lock);
    for (size_t i = 0; i < kept_count && !held; i++)
        held = kept[i].ptr == ptr;
    pump_mutex_unlock(&lock);
    return held;
}

#define RELEASE_BATCH 64

struct release {
    CUdeviceptr ptr[RELEASE_BATCH];
    CUcontext ctx[RELEASE_BATCH];
    size_t n;
};

/* Under the lock: the device's oldest done blocks, while it keeps more than `above` (and,
 * unless `past`, the block's going leaves at least that much). */
static void pick(int device, uint64_t above, bool past, struct release *out)
{
    while (out->n < RELEASE_BATCH && kept_bytes[device] > above) {
        size_t oldest = kept_count;
        for (size_t i = 0; i < kept_count; i++)
            if (kept[i].device == device && kept[i].done && (past || kept_bytes[device] - kept[i].size >= above) &&
                (oldest == kept_count || kept[i].order < kept[oldest].order))
                oldest = i;
        if (oldest == kept_count)
            return;
        out->ptr[out->n] = kept[oldest].ptr;
        out->ctx[out->n++] = kept[oldest].ctx;
        drop(oldest);
    }
}

static void release(const struct release *out, pump_unpooled_free_fn free_fn)
{
    struct pump_capture_mode mode = pump_capture_relax();
    for (size_t i = 0; i < out->n; i++) {
        bool pushed;
        CUresult r = CUDA_ERROR_INVALID_CONTEXT;
        if (pump_context_push(out->ctx[i], &pushed)) {
            r = free_fn(out->ptr[i]);
            pump_context_pop(pushed);
        }
        if (r == CUDA_SUCCESS)
            PUMP_COUNT(unpooled_releases, 1);
        else
            pump_log_once("managed_all: a kept block could not be given back (CUresult %d)", (int)r);
    }
    pump_capture_restore(&mode);
}

static bool any_kept(void)
{
    pump_mutex_lock(&lock);
    bool any = kept_count > 0;
    pump_mutex_unlock(&lock);
    return any;
}

PUMP_HIDDEN void pump_unpooled_synchronised(CUcontext ctx, CUstream stream, bool stream_only,
                                            pump_unpooled_free_fn free_fn)
{
    if (!any_kept())
        return;
    if (!stream_only && ctx == NULL && pump_driver.ctx_get_current(&ctx) != CUDA_SUCCESS)
        ctx = NULL;
    if (!stream_only && ctx == NULL)
        return;  /* no context: nothing was synchronised */
    struct release out;
    do {
        out.n = 0;
        pump_mutex_lock(&lock);
        for (size_t i = 0; i < kept_count; i++)
            if (stream_only ? same_stream(kept[i].stream, stream) : kept[i].ctx == ctx)
                kept[i].done = true;
        for (int device = 0; device < PUMP_DEVICES_MAX && out.n < RELEASE_BATCH; device++)
            if (kept_bytes[device] > 0)
                pick(device, pump_managed_pool_threshold(device), true, &out);
        pump_mutex_unlock(&lock);
        release(&out, free_fn);
    } while (out.n == RELEASE_BATCH);
}

PUMP_HIDDEN void pump_unpooled_trim(CUmemoryPool program_pool, size_t keep, pump_unpooled_free_fn free_fn)
{
    int device = pump_managed_pool_device(program_pool);
    if (device < 0 || !any_kept())
        return;
    struct release out;
    do {
        out.n = 0;
        pump_mutex_lock(&lock);
        pick(device, keep, false, &out);
        pump_mutex_unlock(&lock);
        release(&out, free_fn);
    } while (out.n == RELEASE_BATCH);
}

PUMP_HIDDEN void pump_unpooled_forget_context(CUcontext ctx)
{
    pump_mutex_lock(&lock);
    for (size_t i = kept_count; i-- > 0;)
        if (kept[i].ctx == ctx)
            drop(i);
    pump_mutex_unlock(&lock);
}
