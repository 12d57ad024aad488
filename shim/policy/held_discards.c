/* held_discards.c: the dead tensors of blocks pump keeps for placement (managed_all_cache.h),
 * discarded without waiting on the program's streams (issue 41, item 2).
 *
 * PyTorch frees most tensors on the legacy default stream, where the driver refuses a discard;
 * on another stream a discard is made only once the freeing stream has drained (discard_marks.c:
 * the driver's discard on a busy stream lands after the work queued behind it), which holds the
 * program's thread until the GPU catches up. A block pump keeps needs neither: nothing of the
 * program's touches it until pump hands it out again, and once the GPU has passed its free (the
 * use token recorded there, which comes after every stream's uses: stream_users.c) nothing is
 * left to. So the freeing thread only asks whether the oldest dead blocks' frees have run (an
 * event query each), takes their whole blocks out of the belief, and hands the discard to the
 * device's worker (prefetch_worker.h), which makes it on a stream of pump's that carries nothing
 * but discards (pump_discard_held). The blocks stay claimed until the worker has made it: no
 * allocation takes them meanwhile, nor are they given back; whoever takes one next waits for its
 * mark. As with the caching allocator's discards (torch_trace.c), only where pump's budget presses
 * on the device: kept resident, dead blocks are the next copied out; where nothing is evicted, the
 * tensor placed on one next finds it resident, where a discarded one is populated again.
 *
 * Off by default (PUMP_HELD_DISCARDS=1 makes them; PUMP_TORCH_DISCARDS=poison writes 0xFF in
 * their place): discards made on busy streams computed another loss on the H100 and the H200
 * (torch_trace.c), and this order of them, on a stream of pump's after the free has run, has not
 * yet run on a GPU. On the real-client tier (GPT-2 small under lookahead on a full 1.6 GB card)
 * they cut the bytes each way by about a fifth, at no better step time there: fakecuda writes
 * its poison into every discarded byte, on the discarding stream (docs/limits.md).
 */
#include <stdlib.h>

#include "discard_marks.h"
#include "held_discards.h"
#include "managed_all_cache.h"
#include "prefetch.h"
#include "prefetch_worker.h"
#include "ranges.h"
#include "residency.h"

/* Dead blocks one discard takes at most, and the runs of their whole 2 MiB blocks. */
#define HELD_PER_DISCARD 4
#define HELD_RUNS 16

struct held_discard {
    struct pump_job job;  /* first: the job is the discard's */
    struct pump_context *c;
    int device;
    uint32_t held, runs;
    uint64_t mark;
    struct {
        struct pump_kept_claim claim;
        struct pump_range *range;  /* its freed tensor (ranges.h: dead) */
        uint32_t first, count;     /* its runs among runs[] */
    } block[HELD_PER_DISCARD];
    CUdeviceptr ptrs[HELD_RUNS];
    size_t sizes[HELD_RUNS];
};

static void discard_calls(struct pump_job *job)
{
    struct held_discard *d = (struct held_discard *)job;
    d->mark = pump_discard_held(d->c, d->ptrs, d->sizes, d->runs);
}

/* The blocks are believed discarded under the mark, or resident again where none was made (another
 * discard of the context's was being made, or the job was dropped: dead still, asked again later). */
static void settle(struct held_discard *d, bool made)
{
    uint64_t mark = made ? d->mark : 0;
    for (uint32_t k = 0; k < d->held; k++) {
        pump_residency_discard_settle(d->block[k].range, d->ptrs + d->block[k].first, d->sizes + d->block[k].first,
                                      d->block[k].count, mark, d->device);
        pump_kept_dead_settle(&d->block[k].claim, mark == 0, mark);
    }
    PUMP_COUNT(held_discards, mark != 0 ? d->held : 0);
}

static void discard_finish(struct pump_job *job, bool made)
{
    settle((struct held_discard *)job, made);
    free(job);
}

/* Claims the device's oldest dead blocks whose frees the GPU has passed, into d, with their whole
 * blocks taken out of the belief; the first not passed yet ends the search. A block with none
 * believed resident is dead no more. */
static void claim_passed(struct held_discard *d)
{
    struct pump_kept_claim claim;
    while (d->held < HELD_PER_DISCARD && d->runs < HELD_RUNS && pump_kept_dead_claim(d->device, &claim)) {
        enum pump_use_state free_ran = pump_use_passed(claim.token);
        struct pump_context *c = free_ran == PUMP_USE_PASSED ? pump_context_of(claim.stream) : NULL;
        struct pump_range *range = c != NULL ? pump_ranges_find_freed(claim.ptr) : NULL;
        uint32_t n = 0;
        if (range != NULL && pump_context_device(c) == d->device && (d->c == NULL || d->c == c))
            n = pump_residency_discard_take(range, d->device, d->ptrs + d->runs, d->sizes + d->runs,
                                            HELD_RUNS - d->runs);
        if (n == 0) {
            pump_kept_dead_settle(&claim, free_ran == PUMP_USE_AHEAD, 0);
            if (free_ran == PUMP_USE_AHEAD)
                return;
            continue;
        }
        d->c = c;
        d->block[d->held].claim = claim;
        d->block[d->held].range = range;
        d->block[d->held].first = d->runs;
        d->block[d->held++].count = n;
        d->runs += n;
    }
}

PUMP_HIDDEN void pump_held_discards(int device)
{
    if (!pump_config.held_discards || pump_config.torch_discards == PUMP_DISCARDS_OFF ||
        !pump_residency_pressed(device) ||
        !pump_discard_possible(NULL))
        return;
    /* Claimed on the stack: most frees find no block passed, and allocate nothing. */
    struct held_discard claimed = {.job = {.unordered = true, .calls = discard_calls, .finish = discard_finish},
                                   .device = device};
    claim_passed(&claimed);
    if (claimed.held == 0)
        return;
    struct held_discard *d = malloc(sizeof *d);
    if (d != NULL)
        *d = claimed;
    if (d == NULL || !pump_worker_submit(device, &d->job)) {  /* no worker, or no memory: made here */
        discard_calls(&claimed.job);
        settle(&claimed, true);
        free(d);
    }
}
