/* discard_races.c: why it exists: a discard that may run while a migration of the same pages
 * is under way is undefined behaviour; here it is caught, counted, and made to cost the worst
 * it may cost, so that a test of a program that lets it happen fails.
 *
 * cuda.h, cuMemDiscardBatchAsync: "any reads, writes or prefetches to any part of the memory
 * range that occur simultaneously with the discard operation result in undefined behavior".
 * uvm.h, UvmDiscard (open-gpu-kernel-modules 595.45.04): "UvmDiscard can happen concurrently
 * with memory migrations. Therefore, the caller is responsible for serializing page accesses
 * and/or migrations and discard operations" (uvm_api_discard takes the va_space lock for
 * reading, as uvm_api_migrate does: "even using a write lock will still result in undesirable
 * results").
 *
 * Which pairs race. Each migration (a prefetch's stream op, to a device or to the host) is
 * known here from its enqueue until it completes, with its enqueue number. When a discard
 * runs, a migration of any of its pages on another stream that was enqueued before the discard
 * and has not completed is unordered with it: had the discard's stream waited for it, it would
 * be complete, and nothing enqueued before the discard can wait for the discard. (A migration
 * enqueued after it and under way while it runs would race it too; a discard runs at once
 * here, so that case is not caught. Kernels' and the host's accesses are not known ahead of
 * time and are not checked.)
 *
 * What a race costs. uvm.h says of a discard that leaves pages mapped (without
 * UVM_DISCARD_FLAGS_UNMAP) that writes there "will not clear the discard status" and "if
 * discarded memory is evicted, the data in the pages ... is not copied"; a migration API call
 * clears the status without copying (uvm_va_block.c: block_copy_resident_pages leaves
 * discarded pages out). The worst a race may leave is that state, and the model takes it: once
 * the racing migration completes, the pages both named keep a stuck discard status
 * (FC_BIT_DISCARD_STUCK, migrate.c): what is written there later is lost, poisoned, at the
 * page's next move, and only a prefetch (an API migration) clears it. Counted: discard_races
 * (discards that raced a migration or their stream's later work), bytes_lost_to_discard_races.
 *
 * A discard asked for on a busy stream races that stream's later work. UVM's discard is an
 * ioctl without a semaphore (uvm_ioctl.h, UVM_DISCARD), so the CUDA driver runs it once the
 * stream's earlier work is done, and on the H200 (driver 580) the work queued behind it did not
 * wait for it: a discard asked for behind 200 kernels, then a memset of the same memory and its
 * move to the host on that stream, lost every element the memset wrote, every round; a stream
 * that waited for an event recorded after the discard lost nothing, even where its write left
 * half the range to a later memset on the first stream (bench/gpu/probes/discard_late.py,
 * bench/results/gpu-20261127-nvidia-h200/discard-variants). The model takes the worse side of
 * both: such a discard runs in its turn and then leaves its pages the stuck status, as if it had
 * landed after whatever writes them next, until a prefetch clears it (fc_discard_late).
 */
#include "memory_pages.h"

#include <stdlib.h>

typedef struct migration {
    uint64_t number;        /* its enqueue number */
    CUstream stream;
    const fc_range *r;      /* the op's own ranges: the op lives until it completes */
    size_t n;
    fc_range *raced;        /* the parts discards raced: stuck once it completes */
    size_t nraced;
} migration;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static migration *pending;
static size_t npending, cap;
static uint64_t enqueued;

uint64_t fc_race_number(void)
{
    pthread_mutex_lock(&mu);
    uint64_t number = ++enqueued;
    pthread_mutex_unlock(&mu);
    return number;
}

uint64_t fc_migration_enqueued(CUstream s, const fc_range *r, size_t n)
{
    pthread_mutex_lock(&mu);
    uint64_t number = ++enqueued;
    if (npending == cap) {
        size_t grown = cap ? 2 * cap : 64;
        migration *m = realloc(pending, grown * sizeof *m);
        if (!m) { /* not tracked: no race is found with it (counted nowhere: memory is gone) */
            pthread_mutex_unlock(&mu);
            return 0;
        }
        pending = m;
        cap = grown;
    }
    pending[npending++] = (migration){ .number = number, .stream = s, .r = r, .n = n };
    pthread_mutex_unlock(&mu);
    return number;
}

/* [lo, hi): the whole pages both ranges cover, or an empty one. */
static fc_range overlap(const fc_range *a, const fc_range *b)
{
    uintptr_t lo = a->ptr > b->ptr ? a->ptr : b->ptr;
    uintptr_t hi = a->ptr + a->size < b->ptr + b->size ? a->ptr + a->size : b->ptr + b->size;
    lo = (lo + FAKECUDA_PAGE - 1) / FAKECUDA_PAGE * FAKECUDA_PAGE;
    hi = hi / FAKECUDA_PAGE * FAKECUDA_PAGE;
    return (fc_range){ lo, hi > lo ? hi - lo : 0, 0 };
}

static void remember_raced(migration *m, fc_range part)
{
    fc_range *grown = realloc(m->raced, (m->nraced + 1) * sizeof *grown);
    if (!grown) return; /* the race is counted; its cost is not taken */
    m->raced = grown;
    m->raced[m->nraced++] = part;
}

void fc_discard_runs(CUstream s, uint64_t number, const fc_range *r, size_t n)
{
    int raced = 0;
    pthread_mutex_lock(&mu);
    for (size_t k = 0; k < npending; k++) {
        migration *m = &pending[k];
        if (m->number > number || m->stream == s) continue;
        for (size_t i = 0; i < n; i++)
            for (size_t j = 0; j < m->n; j++) {
                fc_range part = overlap(&r[i], &m->r[j]);
                if (part.size == 0) continue;
                raced = 1;
                remember_raced(m, part);
            }
    }
    pthread_mutex_unlock(&mu);
    if (raced) FC_COUNT(discard_races, 1);
}

void fc_migration_completed(uint64_t number)
{
    if (number == 0) return;
    fc_range *raced = NULL;
    size_t nraced = 0;
    pthread_mutex_lock(&mu);
    for (size_t k = 0; k < npending; k++) {
        if (pending[k].number != number) continue;
        raced = pending[k].raced;
        nraced = pending[k].nraced;
        pending[k] = pending[--npending];
        break;
    }
    pthread_mutex_unlock(&mu);
    for (size_t i = 0; i < nraced; i++) fc_pages_discard_stuck(raced[i].ptr, raced[i].size);
    free(raced);
}

void fc_discard_late(const fc_range *r, size_t n)
{
    FC_COUNT(discard_races, 1);
    for (size_t i = 0; i < n; i++) fc_pages_discard_stuck(r[i].ptr, r[i].size);
}
