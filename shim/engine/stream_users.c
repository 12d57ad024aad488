/* stream_users.c: the streams pump saw kernels launched on, so that pump's allocator for
 * PyTorch (torch_allocator.c) orders a free after every one of them.
 *
 * PyTorch's record_stream does not reach a pluggable allocator: a tensor freed on its
 * allocation stream may still be read on another, and the pool hands its memory out again
 * on the freeing stream at once. So before each free, every other stream pump saw a launch
 * on gets an event (the engine's use events) and the freeing stream waits for it: the free,
 * the discard before it and whatever the pool gives the memory to next come after all that
 * stream was given so far. That is all streams, not only those whose launches named the
 * tensor: a kernel reaches memory through pointers kept in device memory (batched GEMM
 * arrays) that no scan sees.
 *
 * What pump cannot see, and so never discards (a discard is undefined behaviour while
 * anything else may touch the memory): copies and memsets (pump does not intercept them),
 * NCCL's copy-engine transfers, graph replays' tensors, pointers kept in device memory.
 * So a dead tensor is discarded only when a scanned launch named it (one used only by
 * copies, memsets, collectives or graphs is not) and no stream but the freeing one that is
 * still alive launched a kernel since the allocator's first tensor (on a second stream, a
 * kernel may hold it through a pointer pump never saw, and that stream may copy it). Copies on a stream that
 * never launches a kernel are invisible, and are not waited for: the program synchronises
 * those, as with any stream-ordered free.
 *
 * A stream the program destroys is forgotten first (hooks_stream.c): pump never names a
 * destroyed stream to the driver. Noted lock-free (a fork cannot leave a lock held): a free
 * slot is claimed, written, then marked ready; two threads may note the same new stream twice
 * (one extra wait), and a reader may meet a slot taken over meanwhile (a wait for another
 * stream: longer, never shorter). A stream that finds no free slot is missed: from then on
 * no discard, and frees are not ordered after it (logged once).
 */
#include <pthread.h>

#include "prefetch.h"
#include "stream_users.h"

#define STREAMS_MAX 64

struct stream_user {
    CUstream stream;   /* NULL as CU_STREAM_LEGACY: the same stream */
    pthread_t thread;  /* for CU_STREAM_PER_THREAD: whose (each thread has its own) */
};

enum { SLOT_FREE, SLOT_WRITING, SLOT_READY };

static struct stream_user users[STREAMS_MAX]; /* fields read and written with relaxed atomics */
static uint32_t state[STREAMS_MAX];           /* atomic: SLOT_* */
static bool missed;                           /* atomic: a stream found no free slot */
static bool watching;                         /* atomic */

static CUstream canonical(CUstream stream)
{
    return stream == NULL ? CU_STREAM_LEGACY : stream;
}

/* The user in slot i, if the slot is ready. */
static bool user_at(uint32_t i, struct stream_user *u)
{
    if (__atomic_load_n(&state[i], __ATOMIC_ACQUIRE) != SLOT_READY)
        return false;
    u->stream = __atomic_load_n(&users[i].stream, __ATOMIC_RELAXED);
    u->thread = __atomic_load_n(&users[i].thread, __ATOMIC_RELAXED);
    return true;
}

static bool same_user(const struct stream_user *u, CUstream stream, pthread_t thread)
{
    return u->stream == stream && (stream != CU_STREAM_PER_THREAD || pthread_equal(u->thread, thread));
}

PUMP_HIDDEN void pump_stream_users_start(void)
{
    if (!__atomic_load_n(&watching, __ATOMIC_RELAXED))
        __atomic_store_n(&watching, true, __ATOMIC_RELEASE);
}

static bool noted(CUstream stream, pthread_t thread)
{
    struct stream_user u;
    for (uint32_t i = 0; i < STREAMS_MAX; i++)
        if (user_at(i, &u) && same_user(&u, stream, thread))
            return true;
    return false;
}

static bool claim(uint32_t i)
{
    uint32_t expected = SLOT_FREE;
    return __atomic_compare_exchange_n(&state[i], &expected, SLOT_WRITING, false, __ATOMIC_ACQUIRE,
                                       __ATOMIC_RELAXED);
}

PUMP_HIDDEN void pump_stream_users_note(CUstream stream, struct pump_range *const *ranges, uint32_t n)
{
    if (PUMP_LIKELY(!__atomic_load_n(&watching, __ATOMIC_ACQUIRE)))
        return;
    for (uint32_t i = 0; i < n; i++)
        if (!__atomic_load_n(&ranges[i]->launched, __ATOMIC_RELAXED))
            __atomic_store_n(&ranges[i]->launched, 1, __ATOMIC_RELAXED);
    stream = canonical(stream);
    pthread_t thread = pthread_self();
    if (noted(stream, thread))
        return;
    uint32_t slot = 0;
    while (slot < STREAMS_MAX && !claim(slot))
        slot++;
    if (slot == STREAMS_MAX) {
        __atomic_store_n(&missed, true, __ATOMIC_RELEASE);
        pump_log_once("more than %d live streams launch kernels: pump's allocator no longer discards dead tensors, "
                      "and orders frees after %d streams only",
                      STREAMS_MAX, STREAMS_MAX);
        return;
    }
    __atomic_store_n(&users[slot].stream, stream, __ATOMIC_RELAXED);
    __atomic_store_n(&users[slot].thread, thread, __ATOMIC_RELAXED);
    __atomic_store_n(&state[slot], SLOT_READY, __ATOMIC_RELEASE);
}

PUMP_HIDDEN void pump_stream_users_forget(CUstream stream)
{
    if (stream == NULL || stream == CU_STREAM_LEGACY || stream == CU_STREAM_PER_THREAD)
        return;  /* never destroyed */
    for (uint32_t i = 0; i < STREAMS_MAX; i++) {
        uint32_t expected = SLOT_READY;
        if (__atomic_load_n(&users[i].stream, __ATOMIC_RELAXED) == stream)
            __atomic_compare_exchange_n(&state[i], &expected, SLOT_FREE, false, __ATOMIC_RELEASE, __ATOMIC_RELAXED);
    }
}

/* Makes `stream` wait for all `other` was given so far; false when it cannot: another
 * thread's per-thread stream, or a stream being captured (a capture's event cannot order work
 * outside it). */
static bool wait_for(CUstream stream, CUstream other)
{
    if (other == CU_STREAM_PER_THREAD)
        return false;
    struct pump_context *c = pump_context_of(other);
    if (c == NULL || pump_stream_capturing(other))
        return false;
    uint64_t token = pump_use_record(c, other);
    if (token == 0)
        return false;
    pump_use_wait(stream, token);
    PUMP_COUNT(torch_free_waits, 1);
    return true;
}

PUMP_HIDDEN bool pump_stream_users_order_free(CUstream stream, const struct pump_range *range)
{
    stream = canonical(stream);
    pthread_t thread = pthread_self();
    bool all_noted = !__atomic_load_n(&missed, __ATOMIC_ACQUIRE);
    bool alone = all_noted, ordered = all_noted, asked = false, capturing = false;
    struct stream_user u;
    for (uint32_t i = 0; i < STREAMS_MAX; i++) {
        if (!user_at(i, &u) || same_user(&u, stream, thread))
            continue;
        if (!asked)  /* once, and only with another stream: a wait would join the capture */
            capturing = pump_stream_capturing(stream);
        asked = true;
        alone = false;
        ordered = !capturing && wait_for(stream, u.stream) && ordered;
    }
    if (!ordered) {
        PUMP_COUNT(torch_frees_unordered, 1);
        pump_log_once("a tensor was freed while a stream pump cannot order the free after may still use it "
                      "(another thread's per-thread default stream, a capture, or more than %d live streams): "
                      "the program must synchronise it, as record_stream cannot reach a pluggable "
                      "allocator",
                      STREAMS_MAX);
    }
    return alone && ordered && range != NULL && __atomic_load_n(&range->launched, __ATOMIC_RELAXED);
}
