/* residency_discard.c: a dead tensor's blocks leave pump's belief for a discard
 * (pump_residency_discard, residency.h; in two halves for one made on pump's worker,
 * held_discards.c): which whole blocks go, marked until the discard is made, and what they are
 * believed after it. The discard itself, and the mark that orders pump's
 * later moves after it, are discard_marks.c's. */
#include "discard_marks.h"
#include "residency.h"
#include "residency_blocks.h"
#include "residency_rank.h"

/* Runs of a dead tensor's blocks one discard takes at most; blocks past them are left alone. */
#define DISCARD_RUNS 16

/* Of range's whole 2 MiB blocks inside [start, end), those believed resident on `device` with no
 * planned prefetch of theirs pending leave the belief now, marked PUMP_DISCARD_UNORDERED until
 * their discard is made: no decision moves them meanwhile (residency.c skips a prefetch of such
 * a block, residency_evict.c an eviction). Their runs, in address order and at most `room` of
 * them, go to ptrs and sizes. */
static uint32_t take_dead(struct pump_range *range, uint64_t start, uint64_t end, int device, CUdeviceptr *ptrs,
                          size_t *sizes, uint32_t room)
{
    uint32_t n = 0;
    pump_shape_write();  /* no rule in flight: blocks leave their devices' orders */
    struct pump_blocks *a = range->blocks;
    for (uint32_t i = 0; a != NULL && i < a->count; i++) {
        struct pump_block *b = &a->block[i];
        uint64_t first = pump_block_start(a, i);
        if (first % PUMP_BLOCK_SIZE != 0 || pump_block_bytes(a, i) != PUMP_BLOCK_SIZE || first < start ||
            first + PUMP_BLOCK_SIZE > end || b->device != device || b->ready != 0)
            continue;
        if (n > 0 && ptrs[n - 1] + sizes[n - 1] == first)
            sizes[n - 1] += PUMP_BLOCK_SIZE;
        else if (n < room) {
            ptrs[n] = first;
            sizes[n++] = PUMP_BLOCK_SIZE;
        } else
            continue;
        pump_block_count_out(a, i);
        b->discarded = PUMP_DISCARD_UNORDERED;
    }
    pump_blocks_publish();
    pump_shape_write_end();
    return n;
}

/* The blocks take_dead took: discarded under `mark`, or, where no discard was made (0),
 * believed resident on `device` again, where they are. */
static void settle_dead(struct pump_range *range, const CUdeviceptr *ptrs, const size_t *sizes, uint32_t n,
                        uint64_t mark, int device)
{
    pump_shape_write();
    struct pump_blocks *a = range->blocks;
    for (uint32_t k = 0; a != NULL && k < n; k++) {
        if (mark != 0)
            pump_rank_dead_left(device, sizes[k], true);
        for (uint64_t p = ptrs[k]; p < ptrs[k] + sizes[k]; p += PUMP_BLOCK_SIZE) {
            uint32_t i = (uint32_t)(p / PUMP_BLOCK_SIZE - a->base / PUMP_BLOCK_SIZE);
            a->block[i].discarded = mark;
            if (mark == 0)
                pump_block_count_in(a, i, device);
        }
    }
    pump_blocks_publish();
    pump_shape_write_end();
}

PUMP_HIDDEN uint64_t pump_residency_discard(struct pump_range *range, struct pump_context *c, CUstream stream)
{
    CUdeviceptr ptrs[DISCARD_RUNS];
    size_t sizes[DISCARD_RUNS];
    if (!pump_discard_possible(stream))
        return 0;  /* asked before any block leaves the belief */
    int device = pump_context_device(c);
    uint64_t base = __atomic_load_n(&range->base, __ATOMIC_RELAXED);
    uint32_t n = take_dead(range, base, base + __atomic_load_n(&range->size, __ATOMIC_RELAXED), device, ptrs, sizes,
                           DISCARD_RUNS);
    if (n == 0)
        return 0;
    uint64_t mark = pump_discard_freed(c, ptrs, sizes, n, stream);
    settle_dead(range, ptrs, sizes, n, mark, device);
    return mark;
}

PUMP_HIDDEN uint32_t pump_residency_discard_take(struct pump_range *range, int device, CUdeviceptr *ptrs,
                                                 size_t *sizes, uint32_t room)
{
    uint64_t base = __atomic_load_n(&range->base, __ATOMIC_RELAXED);
    return take_dead(range, base, base + __atomic_load_n(&range->size, __ATOMIC_RELAXED), device, ptrs, sizes, room);
}

PUMP_HIDDEN void pump_residency_discard_settle(struct pump_range *range, const CUdeviceptr *ptrs, const size_t *sizes,
                                               uint32_t n, uint64_t mark, int device)
{
    settle_dead(range, ptrs, sizes, n, mark, device);
}
