/* residency.h: what pump believes is resident on each GPU, per 2 MiB block
 * of each managed allocation, and the budget that belief is held to. The
 * policies' rules (off's evict-only emulation, launch's prefetch at launch,
 * lookahead's plan triggers; `pump simulate` models the same rules) decide
 * here what the migration engine (prefetch.h) moves. */
#ifndef PUMP_RESIDENCY_H
#define PUMP_RESIDENCY_H

#include "channel.h"
#include "prefetch.h"

/* Residency beliefs for SKIPPING a prefetch expire (the budget's accounting
 * does not):
 * - every PUMP_EPOCH_LAUNCHES managed launches, all of them: a coarse safety
 *   net for what moves pages behind pump unseen (the driver evicting for
 *   another process, a library's host path); what it re-prefetches of memory
 *   believed resident is counted (epoch_reprefetches);
 * - at every synchronisation, those of memory the program allocated managed
 *   itself (host_touchable, ranges.h): from then on the host may touch it,
 *   migrating it back. Memory managed_all made managed keeps its beliefs: the
 *   program believes it is device memory and never touches it from the host,
 *   and a synchronisation alone moves no page.
 * Each returns the synchronisation epoch (what the daemon hears). */
PUMP_HIDDEN uint32_t pump_epoch_advance(void);
PUMP_HIDDEN uint32_t pump_epoch_synchronised(void);

/* A new managed allocation (its block state is allocated here, never on a
 * launch); false when there is no memory for it (it is then not budgeted).
 * A tensor that took over a freed one's record keeps its blocks (ranges.h).
 * Memory allocated again over a discard of pump's (its own allocator's) is a
 * new record, its blocks believed nowhere: prefetched again, after the discard. */
PUMP_HIDDEN bool pump_residency_attach(struct pump_range *range);
/* The allocation is gone: its blocks leave the accounting. Called with the
 * range table's writer lock held. */
PUMP_HIDDEN void pump_residency_detach(struct pump_range *range);
/* A tensor freed (its record kept, ranges.h), under the range table's writer
 * lock: its blocks stay, believed where they are, for the next tensor of its
 * extent (the caching allocator keeps the memory on the GPU), and still count
 * against a budget; but they become the first victims when room is needed (the
 * oldest in the migration order, the least recently used in a plan's; where
 * discards take dead memory, by their last use: residency_rank.h). A
 * block evicted meanwhile is believed nowhere: the next tensor prefetches it. */
PUMP_HIDDEN void pump_residency_freed(struct pump_range *range);
/* A tensor on `device` is freed: whether pump evicted there within its last 1,024 frees. Its
 * dead blocks are then worth discarding: left resident they are the next victims, copied to the
 * host. Where the budget holds everything they are not: kept, the next tensor there finds
 * its memory resident, where a discarded one is populated again. */
PUMP_HIDDEN bool pump_residency_pressed(int device);
/* A tensor of c's device died at this point of `stream`, its allocator's (before its record is
 * removed): its whole 2 MiB blocks believed resident there are discarded (pump_discard_freed)
 * and believed nowhere from then on, so no budget counts them and no eviction copies them;
 * memory allocated again there is moved only after the discard. Only those: a block pump
 * evicted or planned may still be moving, and a discard at the same time as a migration of the
 * same memory is undefined behaviour ("the caller is responsible for serializing page accesses
 * and/or migrations and discard operations", uvm.h, UvmDiscard). They leave the belief before
 * the discard is asked for, so no decision moves them meanwhile. Returns the discard's mark
 * (0: none made). Takes the shape lock for writing, as pump_residency_freed does. */
PUMP_HIDDEN uint64_t pump_residency_discard(struct pump_range *range, struct pump_context *c, CUstream stream);
/* The two halves of pump_residency_discard for a discard made elsewhere (held_discards.h): the
 * dead range's whole blocks believed resident on `device`, in at most `room` runs, leave the belief
 * (returns the runs' count), and later are believed discarded under `mark`, or, where none was made
 * (0), resident again. */
PUMP_HIDDEN uint32_t pump_residency_discard_take(struct pump_range *range, int device, CUdeviceptr *ptrs,
                                                 size_t *sizes, uint32_t room);
PUMP_HIDDEN void pump_residency_discard_settle(struct pump_range *range, const CUdeviceptr *ptrs, const size_t *sizes,
                                               uint32_t n, uint64_t mark, int device);
/* A tensor carved over records of other extents, and what is left of them outside it
 * (made, under the range table's writer lock; ranges.h): each block of theirs is believed
 * resident where all of its memory was (the caching allocator keeps it on the GPU while
 * it splits and merges its blocks), the rest nowhere; old are detached after. */
PUMP_HIDDEN void pump_residency_replaced(struct pump_range *const *made, uint32_t m, struct pump_range *const *old,
                                        uint32_t n);
/* Advice the driver took on [ptr, ptr + bytes). Read-mostly memory (all of a
 * block advised CU_MEM_ADVISE_SET_READ_MOSTLY) is never moved out by pump: a
 * prefetch to the host of it makes a host copy and leaves the device's
 * (cudaMemAdvise's documentation: "a read-only copy will be created on the
 * destination processor"; uvm_migrate.c, uvm_va_block_make_resident_read_duplicate),
 * freeing nothing. A victim that is read-mostly leaves pump's belief without a
 * driver call; the driver drops it when it needs the room, without a copy
 * while its host copy is valid (residency_evict.c). */
PUMP_HIDDEN void pump_residency_advised(uint64_t ptr, uint64_t bytes, CUmem_advise advice);
/* The bytes pump believes resident on `device` (freed tensors' included). */
PUMP_HIDDEN uint64_t pump_residency_resident_bytes(int device);
/* The bytes pump's belief ever brought to the device (counted in): the device memory its own
 * moves and its launches' faults may have taken, whether or not evicted since (the driver keeps
 * an evicted block's chunk until it needs the room). */
PUMP_HIDDEN uint64_t pump_residency_counted_in_bytes(int device);

/* The launch rule, before a launch on `stream` (policy launch): prefetches
 * the blocks of the scan's allocations (or, with a trigger that has need
 * ranges, of those) not believed resident on c's device, evicting in
 * residency.c's order (without a plan: freed tensors' blocks, then least recently
 * used; under a plan, the trigger's order) to make room under `budget` (0: none); the stream waits for them. Sets *capturing when it had to ask. */
PUMP_HIDDEN void pump_residency_launch(struct pump_context *c, CUstream stream, const struct pump_scan *scan,
                                       uint64_t budget, const struct pump_trigger *trigger, int *capturing);

/* Policy off with a budget emulates a card of the budget's size, where the driver evicts on
 * the next kernel's fault path before its fills (evict, then fill): before a launch on
 * `stream`, when policy off evicted since the device's last such wait, the stream waits (on
 * the GPU) for pump's eviction stream, once pump's worker has made them (the launching
 * thread waits for it: prefetch_worker.h, pump_worker_wait). Nothing is added to a capturing stream
 * (*capturing: -1 until asked, then set). */
PUMP_HIDDEN void pump_residency_off_launch(struct pump_context *c, CUstream stream, int *capturing);

/* After the kernel was enqueued (not on a capturing stream): records its use
 * (when a budget or the trigger needs one), then under policy off with a
 * budget applies the evict-only rule, and with a trigger (may be NULL)
 * evicts its evict ranges after this kernel and prefetches its prefetch
 * ranges within the budget. */
PUMP_HIDDEN void pump_residency_after_launch(struct pump_context *c, CUstream stream, const struct pump_scan *scan,
                                             uint64_t budget, uint64_t tick, const struct pump_trigger *trigger);

/* A graph replay on `stream` (policy launch; the stream is not being
 * captured; the allocations' bytes fit `budget`, 0: none): the launch rule
 * over the graph's allocations ranges[0 .. n), as for one kernel. */
PUMP_HIDDEN void pump_residency_graph_launch(struct pump_context *c, CUstream stream,
                                             struct pump_range *const *ranges, uint32_t n, uint64_t budget);
/* After a graph replay was enqueued: pump_residency_after_launch's use
 * record and policy off's rule, over the graph's allocations. */
PUMP_HIDDEN void pump_residency_after_graph_launch(struct pump_context *c, CUstream stream,
                                                   struct pump_range *const *ranges, uint32_t n, uint64_t budget,
                                                   uint64_t tick);

PUMP_HIDDEN void pump_residency_before_fork(void);
PUMP_HIDDEN void pump_residency_after_fork(bool child);

#endif
