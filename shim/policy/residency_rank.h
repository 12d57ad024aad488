/* residency_rank.h: each device's blocks in PUMP_ORDER_USED's victim order
 * (residency_evict.c), kept as they change, so that choosing a victim and
 * ranking a block again cost no sort of the device's blocks.
 *
 * A block's rank is the later of its allocation's last use (range->used_tick;
 * 0 once it is a freed tensor's, pump_residency_freed, but where dead memory is
 * kept: pump_rank_dead_left) and the launch whose
 * plan trigger last named it (planned_for); victims go by rank,
 * ties by migration order (migrated), oldest first. Every function here is
 * called with the device's lock held (residency_blocks.h), or the shape lock
 * written, but pump_rank_dead_left. */
#ifndef PUMP_RESIDENCY_RANK_H
#define PUMP_RESIDENCY_RANK_H

#include "residency_state.h"

/* Block b became believed resident on its device (its migrated set), or
 * left it (before its device is cleared). */
PUMP_HIDDEN void pump_rank_join(struct pump_block *b);
PUMP_HIDDEN void pump_rank_leave(struct pump_block *b);
/* What b's rank is made of changed (planned_for, its allocation's dead, its
 * migrated): b takes its place again. b is believed resident. */
PUMP_HIDDEN void pump_rank_update(struct pump_block *b);

/* a's used_tick changed: its blocks on `device` take their places again at
 * the next pump_rank_settle(device), not now (a launch names whole
 * allocations; a victim search ranks what was named since, once). */
PUMP_HIDDEN void pump_rank_touched(struct pump_blocks *a, int device);
/* Ranks the blocks of the allocations touched on `device` since last time. */
PUMP_HIDDEN void pump_rank_settle(int device);
/* a is going: it leaves the devices' touched lists (the shape lock written). */
PUMP_HIDDEN void pump_rank_forget(struct pump_blocks *a);

/* `bytes` of freed tensors' blocks left `device` (any lock): discarded, or copied out by an
 * eviction. Where discards take more of it than evictions copy out, lately, a freed tensor's
 * blocks rank by their last use (dead memory is kept): a dead block evicted is copied out, and
 * the tensor placed on its memory next copies it back, where one kept is discarded once the
 * GPU has passed its free (passed_discards.h) and copies nothing. Where they do not (the next
 * tensor takes a dead one's memory over before the GPU has passed its free), its blocks are
 * the first victims: kept, they would only crowd out live blocks. */
PUMP_HIDDEN void pump_rank_dead_left(int device, uint64_t bytes, bool discarded);

/* A victim search under the device's lock: pump_rank_walk_next gives its
 * first unprotected block in victim order (with moving_only, also not one
 * left to the driver: pump_block_left_to_driver), or NULL when none is left; the
 * caller evicts each block it is given (pump_rank_leave) before asking again.
 * The blocks passed on the way are put back by pump_rank_walk_end. */
struct pump_rank_walk {
    struct pump_block *next;    /* the next list block to consider */
    struct pump_block *aside;   /* blocks passed over taken off the heap, chained by `newer_used` */
    uint64_t decision;          /* blocks it protects: its allocations' and its marked ones */
    bool moving_only;
    bool left_passed;           /* with moving_only: a block left to the driver was passed over */
};
PUMP_HIDDEN void pump_rank_walk_begin(struct pump_rank_walk *w, int device, uint64_t decision, bool moving_only);
PUMP_HIDDEN struct pump_block *pump_rank_walk_next(struct pump_rank_walk *w, int device);
PUMP_HIDDEN void pump_rank_walk_end(struct pump_rank_walk *w, int device);

#endif
