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

#include <pthread.h>

#include "ranges.h"

struct pump_block {
    struct pump_block *older, *newer; /* the device's migration order (NULL: not resident) */
    struct pump_block *older_used, *newer_used; /* the device's list in victim order (residency_rank.h);
                                         NULL: not on it */
    struct pump_blocks *owner;
    uint64_t rank;                    /* its rank when it last took its place (residency_rank.h) */
    uint32_t heap_at;                 /* its index + 1 in its device's heap of victims (residency_rank.h);
                                         0: not on it */
    uint32_t read_mostly;             /* atomic: 1 while all of it is advised CU_MEM_ADVISE_SET_READ_MOSTLY */
    uint64_t migrated;                /* its place in that order */
    uint64_t mark;                    /* the decision whose trigger prefetches it */
    uint64_t ready;                   /* token of the planned prefetch that brought it (PUMP_READY_PENDING:
                                         decided, not yet made); 0: none */
    uint64_t brought;                 /* the decision (its device's turn) whose prefetch brought it */
    uint64_t planned_for;             /* the launch tick whose trigger last named it for prefetch (brought
                                         in or already resident): for PUMP_ORDER_USED it counts as used
                                         then (not as old as its allocation's last use) */
    uint64_t evicted_in;              /* its device's `evicted` with it, when last evicted: a prefetch of it
                                         before `awaited` reaches that must wait for every eviction */
    uint64_t discarded;               /* the mark of an earlier owner's discard of its memory that may
                                         still be running: pump moves it only after that (0: none) */
    uint64_t stamp;                   /* its kind's stamp when last prefetched; 0: none */
    int32_t device;                   /* believed resident there; -1: nowhere */
    int32_t keeper;                   /* atomic: the device whose lock guards it; -1: none yet */
};

/* A planned prefetch decided and not yet made: a kernel that needs the block
 * waits for its device's prefetch stream instead (its driver calls come later
 * in the same order). */
#define PUMP_READY_PENDING UINT64_MAX

struct pump_blocks {
    struct pump_range *range;
    uint64_t base, size;
    uint64_t mark;                    /* the decision whose launch uses it */
    uint64_t devices;                 /* atomic: the devices its blocks were believed resident on since it
                                         was attached, a bit each */
    uint64_t touched;                 /* atomic: the devices whose touched list holds it (residency_rank.h) */
    uint32_t count;
    struct pump_block block[];
};

struct pump_device_state {
    pthread_mutex_t lock;
    struct pump_block order;          /* sentinel: order.newer is the least recently migrated */
    struct pump_block used;           /* sentinel: used.newer_used is the first victim of PUMP_ORDER_USED
                                         but for those on the heap (residency_rank.h) */
    uint64_t resident;                /* bytes believed resident (written under the lock, read anywhere) */
    uint64_t migrations;
    uint64_t counted_in;              /* bytes ever counted in (written under the lock, read anywhere) */
    uint64_t evicted;                 /* bytes ever decided to leave it by eviction (under the lock) */
    uint64_t evicted_made;            /* atomic: ... whose eviction calls were made, by whichever thread */
    uint64_t ahead;                   /* atomic (written under the lock): room kept free ahead of the launch
                                         rule's launches (residency_ahead.c) */
    uint32_t ahead_pressed;           /* ... for so many more launches that bring bytes without evicting */
    uint64_t awaited;                 /* `evicted` when the prefetch stream last waited for every eviction
                                         decided (under the lock) */
    uint64_t awaited_made;            /* `evicted_made` when it last waited for those made (under the lock) */
    uint64_t off_evictions;           /* atomic: policy off's decisions that evicted, handed over */
    uint64_t off_waited;              /* atomic: ... of which the next kernel waits for so many */
    uint64_t turns;                   /* decisions with driver calls so far (under the lock) */
    uint64_t frees;                   /* atomic: tensors freed on it (a clock for pump_residency_pressed) */
    uint64_t evicted_at;              /* atomic: `frees` + 1 at its latest eviction; 0: none yet */
    struct pump_block **heap;         /* room for every block: PUMP_ORDER_USED's victims out of list order */
    struct pump_block **batch;        /* room for every block: those taking their places at once */
    struct pump_blocks **touched;     /* room for every allocation: those used since the last settle */
    uint32_t heap_n, touched_n;
    /* The driver calls of the device's decisions are made in the order of their turns: the
     * prefetch and eviction streams take them in the order the belief assumed. */
    pthread_mutex_t turn_lock;
    pthread_cond_t turn_done;
    uint64_t serving;                 /* the turn whose calls may be made now */
};

PUMP_HIDDEN extern struct pump_device_state pump_devices[PUMP_DEVICES_MAX];

/* Whether a rule's decision keeps b from being its victim: b's allocation is one its launch
 * uses, or b one its trigger names. */
static inline bool pump_block_protected(const struct pump_block *b, uint64_t decision)
{
    return b->owner->mark == decision || b->mark == decision;
}

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
 * waits for it (under none), and ends it once its calls are made. */
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

/* No rule, and no driver call of one, in flight across fork. */
PUMP_HIDDEN void pump_blocks_before_fork(void);
PUMP_HIDDEN void pump_blocks_after_fork(void);

#endif
