/* residency_moves.c: a decision's locks, its moves written down, and their
 * driver calls made after the locks (see residency_moves.h).
 *
 * A decision's moves are handed over as a job in the order of its turn,
 * taken under the device's lock, and their calls made by whichever thread
 * takes the job first: its prefetch and eviction streams take the moves in
 * the order the belief assumed (an eviction before the prefetch that needs
 * its room; a prefetch of a block after its eviction), though no lock or
 * turn is held across a driver call (a turn is held only while its job is
 * queued: issue 42, risk 4). A prefetch the driver refused leaves the belief
 * again, unless a later decision took its blocks meanwhile; a plan's
 * prefetch records the token a kernel that needs its blocks waits for.
 *
 * A decision made after its kernel (policy off's evictions, a lowered
 * budget's, the daemon's plan) goes to pump's worker for the device
 * (prefetch_worker.h): the launching thread only decides. A decision whose
 * kernel waits for it goes to the launchers' lane and is made before its
 * kernel, by its own thread or another launching thread draining the lane,
 * never waiting for the worker's calls; unless its calls must follow the
 * worker's on pump's streams (an eviction before a prefetch, a planned
 * prefetch before an eviction or a kernel): it then goes to the worker's
 * queue, which it drains, making what the worker has not begun and waiting
 * for the job under way. A kernel whose planned prefetch the worker made
 * waits on that prefetch's token. A thread that waits for another's calls
 * holds nothing, so one long call holds up only the decisions that must
 * follow it.
 */
#include <stdlib.h>

#include "channel.h"
#include "prefetch_worker.h"
#include "residency_moves.h"
#include "residency_rank.h"

static _Atomic uint64_t decisions;

PUMP_HIDDEN void pump_decision_turn(struct pump_decision *dn)
{
    if (dn->turn == 0)
        dn->turn = pump_turn_take(dn->device) + 1;
}

PUMP_HIDDEN bool pump_decision_write(struct pump_decision *dn, const struct pump_move *m)
{
    struct pump_move *grown = realloc(dn->moves, (dn->n + 1) * sizeof *grown);
    if (grown == NULL) {
        pump_log_once("no memory for a decision's moves: some are not made");
        return false;
    }
    dn->moves = grown;
    dn->moves[dn->n++] = *m;
    pump_decision_turn(dn);
    return true;
}

/* pump_decision_plan_blocks, adding the keepers it lacks to *want (NULL: none). A range may lie
 * in a freed tensor kept in place: a plan names memory a step uses, and the tensor that uses it
 * is often allocated only after the trigger (pump's allocator places it there again, the caching
 * allocator's steady state hands it out again); its blocks are the memory's. Skipping such
 * ranges left 1,054 of GPT-2 small's plan ranges a step to the need rule (issue 41). */
static struct pump_blocks *plan_blocks(struct pump_decision *dn, const struct pump_plan_range *range, uint32_t *first,
                                       uint32_t *last, uint64_t *want)
{
    uint64_t address = range->address, bytes = range->bytes, unused = 0;
    if (bytes == 0 || address + bytes < address)
        return NULL;
    struct pump_range *r = pump_ranges_find_kept(address);
    struct pump_blocks *a = r != NULL ? r->blocks : NULL;
    if (a == NULL || address < a->base || address + bytes > a->base + a->size ||
        !pump_blocks_claim(a, dn->device, dn->held, want != NULL ? want : &unused))
        return NULL;
    *first = (uint32_t)(address / PUMP_BLOCK_SIZE - a->base / PUMP_BLOCK_SIZE);
    *last = (uint32_t)((address + bytes - 1) / PUMP_BLOCK_SIZE - a->base / PUMP_BLOCK_SIZE);
    return a;
}

PUMP_HIDDEN struct pump_blocks *pump_decision_plan_blocks(struct pump_decision *dn,
                                                          const struct pump_plan_range *range, uint32_t *first,
                                                          uint32_t *last)
{
    return plan_blocks(dn, range, first, last, NULL);
}

PUMP_HIDDEN bool pump_decision_begin(struct pump_decision *dn, struct pump_range *const *ranges, uint32_t n,
                                     const struct pump_plan_range *plan, uint32_t plan_n)
{
    if (!pump_blocks_enter(dn->device))
        return false;
    uint64_t want = 1ull << dn->device;
    for (;;) {
        for (uint32_t r = 0; r < n; r++)
            if (ranges[r]->blocks != NULL)
                pump_blocks_keepers(ranges[r]->blocks, &want);
        for (uint32_t k = 0; k < plan_n; k++) {
            struct pump_range *r = plan[k].bytes != 0 ? pump_ranges_find_kept(plan[k].address) : NULL;
            if (r != NULL && r->blocks != NULL)
                pump_blocks_keepers(r->blocks, &want);
        }
        dn->held = want;
        pump_devices_lock(dn->held);
        bool all = true;
        for (uint32_t r = 0; r < n; r++)
            if (ranges[r]->blocks != NULL)
                all = pump_blocks_claim(ranges[r]->blocks, dn->device, dn->held, &want) && all;
        for (uint32_t k = 0; k < plan_n; k++) {
            uint32_t first, last;
            plan_blocks(dn, &plan[k], &first, &last, &want);
        }
        if (all && want == dn->held)
            break;
        pump_devices_unlock(dn->held);  /* a block moved to a device not locked: again, with it */
    }
    pump_rank_settle(dn->device);  /* the uses since the last rule take their places first */
    dn->number = atomic_fetch_add_explicit(&decisions, 1, memory_order_relaxed) + 1;
    for (uint32_t r = 0; r < n; r++)
        if (ranges[r]->blocks != NULL)
            ranges[r]->blocks->mark = dn->number;
    return true;
}

PUMP_HIDDEN void pump_decision_unlock(struct pump_decision *dn)
{
    pump_blocks_publish();
    pump_devices_unlock(dn->held);
    pump_blocks_leave();
}

/* ---- the driver calls, after the locks ---- */

static void after_discards(struct pump_context *c, const struct pump_move *m)
{
    for (uint32_t k = 0; k < m->discards; k++) {
        if (pump_discard_done(m->discard[k]))
            continue;
        if (m->evict) {
            pump_evict_after_discard(c, m->discard[k]);
        } else {
            if (m->populate)
                pump_populate_after_discard(c, m->discard[k]);
            else
                pump_prefetch_after_discard(c, m->discard[k]);
            PUMP_COUNT(prefetch_discard_waits, 1);
        }
    }
}

/* Makes one move's driver calls: true when the driver took it. */
static bool make_move(struct pump_decision *dn, struct pump_move *m, uint64_t *ready)
{
    struct pump_context *c = dn->c;
    after_discards(c, m);
    if (m->evict) {
        if (m->after_fallback && dn->fallback != 0)  /* recorded by job_of */
            pump_evict_after(c, dn->fallback);
        if (m->after_prefetches)
            pump_evict_after(c, pump_prefetch_record(c));
        for (uint32_t k = 0; k < m->waits; k++)
            pump_evict_after(c, m->wait[k]);
        bool ok = pump_evict_to_host(c, m->ptr, m->size, m->n);
        __atomic_fetch_add(&pump_devices[dn->device].evicted_made, m->bytes, __ATOMIC_RELEASE);
        if (ok) {
            PUMP_COUNT(bytes_evicted, m->bytes);
            PUMP_COUNT(evictions, m->blocks);
            PUMP_COUNT(bytes_evicted_dead, m->dead_bytes);
            if (m->from_plan)
                PUMP_COUNT(plan_bytes_evicted, m->bytes);
        }
        return ok;
    }
    /* A populate waits for every eviction enqueued so far (pump_populate): the prefetch stream's
     * wait for those that make its room is not the populate stream's. */
    if ((m->after_evictions || m->after_made) && !m->populate)
        pump_prefetch_after_evictions(c);
    bool ok = m->populate ? pump_populate(c, m->ptr, m->size, m->n)
                          : pump_prefetch_to_device(c, m->ptr, m->size, m->n, m->timeable);
    /* A kernel waits for a populate through pump_populate_wait; under a plan nothing is
     * discarded on the peer (torch_trace.c), so no plan's populate has a token. */
    *ready = ok && m->from_plan && !m->populate ? pump_prefetch_record(c) : 0;
    PUMP_COUNT(prefetch_ranges, m->n);
    PUMP_COUNT(prefetch_bytes, m->bytes);
    if (m->from_plan)
        PUMP_COUNT(plan_prefetch_ranges, m->n);
    return ok;
}

/* The blocks a prefetch brought that are still its own: out of the belief
 * again when the driver refused it, else a plan's get the token recorded
 * after it (0: none could be). Under the decision's device lock. */
static void settle(struct pump_decision *dn, const struct pump_move *m)
{
    for (uint32_t r = 0; r < m->n; r++) {
        struct pump_blocks *a = m->run[r].a;
        if (m->run[r].range->blocks != a)
            continue;  /* freed since */
        for (uint32_t i = m->run[r].first; i < m->run[r].first + m->run[r].count; i++) {
            struct pump_block *b = &a->block[i];
            if (__atomic_load_n(&b->keeper, __ATOMIC_RELAXED) != dn->device || b->device != dn->device ||
                b->brought != dn->turn)
                continue;
            if (!m->taken)
                pump_block_count_out(a, i);
            else
                b->ready = m->token;
        }
    }
}

/* Makes the moves' driver calls; *settle: some prefetch's blocks need settling. */
static void make_calls(struct pump_decision *dn, bool *settle_needed)
{
    for (uint32_t k = 0; k < dn->n; k++) {
        struct pump_move *m = &dn->moves[k];
        m->taken = make_move(dn, m, &m->token);
        *settle_needed = *settle_needed || (!m->evict && (!m->taken || m->from_plan));
    }
}

static void settle_all(struct pump_decision *dn)
{
    if (!pump_blocks_enter(dn->device))
        return;
    pump_devices_lock(1ull << dn->device);
    for (uint32_t k = 0; k < dn->n; k++)
        if (!dn->moves[k].evict)
            settle(dn, &dn->moves[k]);
    pump_blocks_publish();
    pump_devices_unlock(1ull << dn->device);
    pump_blocks_leave();
}

/* ---- the calls handed over (prefetch_worker.h) ---- */

struct made_later {
    struct pump_job job;  /* first: the job is the decision's */
    struct pump_decision dn;
    bool settle;
};

static void made_later_calls(struct pump_job *job)
{
    struct made_later *d = (struct made_later *)job;
    make_calls(&d->dn, &d->settle);
}

static void made_later_finish(struct pump_job *job, bool made)
{
    struct made_later *d = (struct made_later *)job;
    if (made && d->settle)
        settle_all(&d->dn);
    free(d->dn.moves);
    free(d);
}

/* The decision's moves as a job any thread can make: the use recorded on the program's stream
 * that its evictions may wait for is recorded here first (on the deciding thread, the stream's
 * own: the per-thread default stream is the calling thread's). NULL without memory for it. */
static struct made_later *job_of(struct pump_decision *dn)
{
    for (uint32_t k = 0; k < dn->n && dn->fallback == 0 && dn->stream != NULL; k++)
        if (dn->moves[k].evict && dn->moves[k].after_fallback)
            dn->fallback = pump_use_record(dn->c, dn->stream);
    struct made_later *d = malloc(sizeof *d);
    if (d == NULL) {
        pump_log_once("no memory to hand a decision's moves over: its calls are made out of their turn");
        return NULL;
    }
    *d = (struct made_later){.job = {.calls = made_later_calls, .finish = made_later_finish}, .dn = *dn};
    dn->moves = NULL;
    dn->n = 0;
    return d;
}

/* Whether the decision's calls must come after those handed to the worker: a
 * prefetch after the evictions, an eviction after the planned prefetches, a
 * kernel after a planned prefetch not made yet (all in pump's streams' order). */
static bool after_deferred(const struct pump_decision *dn)
{
    if (!pump_worker_pending(dn->device))
        return false;
    bool after = dn->kernel_waits && dn->ready == PUMP_READY_PENDING;
    for (uint32_t k = 0; k < dn->n && !after; k++)
        after = dn->moves[k].after_evictions || dn->moves[k].after_prefetches;
    return after;
}

/* Where a decision's moves went. */
enum handed { MADE_HERE, TO_WORKER, TO_LAUNCHERS };

/* Hands the job over in the decision's turn: to the worker when it is made after its kernel or
 * must follow the worker's jobs, else to the launchers' lane; MADE_HERE when neither takes it
 * (no job, no memory for one, a forked child). */
static enum handed hand_over(struct pump_decision *dn, struct made_later *job, bool deferred, bool after)
{
    enum handed to = MADE_HERE;
    if (dn->turn != 0)
        pump_turn_wait(dn->device, dn->turn - 1);
    if (job != NULL && deferred && pump_worker_submit(dn->device, &job->job))
        to = TO_WORKER;
    else if (job != NULL && after && pump_worker_submit_to_drain(dn->device, &job->job))
        to = TO_WORKER;
    else if (job != NULL && pump_launchers_submit(dn->device, &job->job))
        to = TO_LAUNCHERS;
    if (dn->turn != 0)
        pump_turn_end(dn->device);
    return to;
}

/* The kernel waits for the prefetches it made, else for the planned
 * prefetch `ready` names. */
PUMP_HIDDEN bool pump_decision_make(struct pump_decision *dn)
{
    uint64_t start = pump_channel_now_ns();
    bool prefetched = false, populates = false;
    for (uint32_t k = 0; k < dn->n; k++) {
        prefetched = prefetched || !dn->moves[k].evict;
        populates = populates || dn->moves[k].populate;
    }
    /* Made after its kernel (its evictions after that kernel, a plan's prefetches for
     * launches to come): nothing on the launch's stream waits for it. */
    bool deferred = !dn->kernel_waits && dn->stream == NULL && dn->n > 0, after = after_deferred(dn);
    struct made_later *job = dn->n > 0 ? job_of(dn) : NULL;
    enum handed to = hand_over(dn, job, deferred, after);
    /* Its calls, and the worker's it must follow, are made on return, by whichever thread
     * takes them first, while this one waits holding no lock or turn; a deferred job the
     * worker took is its own to make. */
    if (to == TO_WORKER ? !deferred : after)
        pump_worker_finish(pump_worker_drain(dn->device));
    if (to == TO_LAUNCHERS)
        pump_worker_finish(pump_launchers_drain(dn->device));
    if (to == MADE_HERE && job != NULL) {
        made_later_calls(&job->job);
        made_later_finish(&job->job, true);
    } else if (to == MADE_HERE && dn->n > 0) {  /* no memory for a job */
        bool settle_needed = false;
        make_calls(dn, &settle_needed);
        if (settle_needed)
            settle_all(dn);
    }
    if (dn->kernel_waits && (prefetched || dn->ready == PUMP_READY_PENDING))
        pump_prefetch_wait(dn->c, dn->stream);
    else if (dn->kernel_waits && dn->ready != 0 && pump_config.wait)
        pump_use_wait(dn->stream, dn->ready);
    if (dn->kernel_waits && populates)
        pump_populate_wait(dn->c, dn->stream);
    free(dn->moves);
    pump_channel_own_time(pump_channel_now_ns() - start);  /* not kernel time: pumpd must not read it as such */
    return prefetched;
}
