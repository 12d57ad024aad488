/* residency_state.h: what pump believes of each 2 MiB block and each device (the blocks of an
 * allocation, each device's order, accounting and turns), apart from the code that changes it:
 * residency_blocks.c keeps the belief and its locks (residency_blocks.h says how they guard
 * these fields), residency_rank.c the victim order over it, and neither calls the other's
 * state through the other: both read it here. */
#ifndef PUMP_RESIDENCY_STATE_H
#define PUMP_RESIDENCY_STATE_H

#include <pthread.h>

#include "discard_marks.h"
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
    uint64_t dead_discarded;          /* atomic: bytes of freed tensors' blocks discarded on it, lately */
    uint64_t dead_evicted;            /* atomic: ... copied out by pump's evictions, lately (residency_rank.h) */
    struct pump_block **heap;         /* room for every block: PUMP_ORDER_USED's victims out of list order */
    struct pump_block **batch;        /* room for every block: those taking their places at once */
    struct pump_blocks **touched;     /* room for every allocation: those used since the last settle */
    uint32_t heap_n, touched_n;
    /* The moves of the device's decisions are handed over (queued) in the order of their
     * turns, so that pump's streams take them in the order the belief assumed. */
    pthread_mutex_t turn_lock;
    pthread_cond_t turn_done;
    uint64_t serving;                 /* the turn whose moves may be handed over now */
};

PUMP_HIDDEN extern struct pump_device_state pump_devices[PUMP_DEVICES_MAX];

/* Whether a rule's decision keeps b from being its victim: b's allocation is one its launch
 * uses, or b one its trigger names. */
static inline bool pump_block_protected(const struct pump_block *b, uint64_t decision)
{
    return b->owner->mark == decision || b->mark == decision;
}

/* Whether pump's eviction of b moves nothing: its discard is not yet made, or it is read-mostly,
 * which pump leaves to the driver (residency.h). Either way it stays on the device, the room
 * believed freed is not, until the driver needs room and evicts in its own order. */
static inline bool pump_block_left_to_driver(const struct pump_block *b)
{
    return b->discarded == PUMP_DISCARD_UNORDERED || __atomic_load_n(&b->read_mostly, __ATOMIC_RELAXED);
}

#endif
