/* residency_blocks.h: pump's belief, per 2 MiB block of each managed
 * allocation, of the GPU it is resident on, each device's migration order and
 * accounting, and the locks that guard them: one per device, so that threads
 * launching on different GPUs never wait for each other (issue 15 item 5).
 * The rules that change the belief (residency.c) take the locks here, decide
 * under them, and make their driver calls after leaving them.
 *
 * Locks. A block is kept by one device (its keeper): the one it is believed
 * resident on, or else the last that held it or claimed it; its fields are
 * written under its keeper's lock, and a device's order and accounting under
 * its own. A rule on a device takes that device's lock and the locks of the
 * keepers of every block of the allocations it names, in ordinal order, and
 * claims for its device the blocks no device keeps yet; moving a block to
 * another device moves its keeper with both locks held. Two rules naming the
 * same allocation so share a lock; rules on different devices over their own
 * memory share none. Allocations come and go under the shape lock, taken
 * for reading by every rule and for writing by attach and detach: a free
 * waits for the rules in flight to decide, and they for it (counted), never
 * for a driver call. */
#ifndef PUMP_RESIDENCY_BLOCKS_H
#define PUMP_RESIDENCY_BLOCKS_H

#include "residency_state.h"

/* The shape lock written, for the belief's other writers (residency_discard.c): no rule is in
 * flight, and blocks may leave or join their devices' orders (pump_blocks_publish before the end
 * where counts changed). */
PUMP_HIDDEN void pump_shape_write(void);
PUMP_HIDDEN void pump_shape_write_end(void);

/* A rule begins: the shape lock for reading, and `device` set up (false:
 * no memory for it; nothing was taken). */
PUMP_HIDDEN bool pump_blocks_enter(int device);
PUMP_HIDDEN void pump_blocks_leave(void);
/* A launch on `device` used ranges[0 .. n) (their used_tick stored): each
 * allocation goes on the touched list of every device its blocks may be on
 * (pump_rank_touched). Takes the shape lock for reading and those devices' locks. */
PUMP_HIDDEN void pump_blocks_used(struct pump_range *const *ranges, uint32_t n, int device);

/* Adds the keepers of a's blocks to *mask (read without their locks). */
PUMP_HIDDEN void pump_blocks_keepers(const struct pump_blocks *a, uint64_t *mask);
/* With the locks of `held` taken (device's among them): claims for `device`
 * a's blocks no device keeps; false, with the missing keepers added to
 * *want, when a block is kept by a device not in `held`. */
PUMP_HIDDEN bool pump_blocks_claim(struct pump_blocks *a, int device, uint64_t held, uint64_t *want);
/* Takes, or leaves, the locks of the devices in mask, in ordinal order. */
PUMP_HIDDEN void pump_devices_lock(uint64_t mask);
PUMP_HIDDEN void pump_devices_unlock(uint64_t mask);

/* A decision of `device` with driver calls takes a turn (under its lock),
 * waits for it (under none), and ends it once its moves are handed over
 * (residency_moves.c): the moves of the device's decisions are queued in the
 * order they were decided. A turn counts as a lock (locks.h): no driver call
 * is made while it is held. */
PUMP_HIDDEN uint64_t pump_turn_take(int device);
PUMP_HIDDEN void pump_turn_wait(int device, uint64_t turn);
PUMP_HIDDEN void pump_turn_end(int device);

PUMP_HIDDEN uint64_t pump_block_start(const struct pump_blocks *a, uint32_t i);
PUMP_HIDDEN uint64_t pump_block_bytes(const struct pump_blocks *a, uint32_t i);
/* Block i of a leaves, or joins (`device`'s lock and its keeper's held), the
 * belief and its device's migration order and accounting. */
PUMP_HIDDEN void pump_block_count_out(struct pump_blocks *a, uint32_t i);
PUMP_HIDDEN void pump_block_count_in(struct pump_blocks *a, uint32_t i, int device);
/* Brings the range record's lock-free summaries in line with a's blocks. */
PUMP_HIDDEN void pump_blocks_refresh(struct pump_blocks *a, int device, uint64_t stamp);
/* Advice on [ptr, ptr + bytes): the blocks of the allocations there it wholly covers are
 * read-mostly from now (on), or those it touches no longer (off). */
PUMP_HIDDEN void pump_blocks_read_mostly(uint64_t ptr, uint64_t bytes, bool on);
/* Publishes the bytes believed resident, and their peak, in the stats record. */
PUMP_HIDDEN void pump_blocks_publish(void);

/* See residency.h: pump_residency_attach, _detach. */
PUMP_HIDDEN bool pump_blocks_attach(struct pump_range *range);
/* Moves the blocks of range believed resident to the newest end of their devices'
 * migration orders (newest) or to the oldest, the next to be evicted; false when it has no
 * blocks. Takes the shape lock for writing: no rule is in flight meanwhile. */
PUMP_HIDDEN bool pump_blocks_reorder(struct pump_range *range, bool newest);
PUMP_HIDDEN void pump_blocks_detach(struct pump_range *range);
/* See pump_range_observer.replaced: made's blocks are attached and take over what old's
 * knew of their memory; old's leave the accounting (they stay attached, for their detach). */
PUMP_HIDDEN void pump_blocks_replace(struct pump_range *const *made, uint32_t m, struct pump_range *const *old,
                                     uint32_t n);

/* No rule in flight across fork; a driver call of one may be (made holding no lock or turn),
 * and the fork does not wait for it: the child (which passes through) serves every turn taken. */
PUMP_HIDDEN void pump_blocks_before_fork(void);
PUMP_HIDDEN void pump_blocks_after_fork(bool child);

#endif
