/* residency_moves.h: a rule's decision (residency.c): the locks it takes to
 * decide (residency_blocks.h), the moves it writes down under them, and the
 * driver calls that make them (the engine, prefetch.h), after every lock is
 * left, in the order of its device's decisions. */
#ifndef PUMP_RESIDENCY_MOVES_H
#define PUMP_RESIDENCY_MOVES_H

#include "prefetch.h"
#include "pump_channel.h"
#include "residency_blocks.h"

#define PUMP_MOVE_BATCH 64 /* ranges per driver call, and waits per eviction batch */

/* One driver call's worth of moves, decided under the locks and made after. */
struct pump_move {
    bool evict;
    bool after_evictions;   /* a prefetch: the prefetch stream first waits for the evictions */
    bool after_made;        /* ... for those whose calls were made so far (none is made for it) */
    bool after_prefetches;  /* an eviction: the eviction stream first waits for the prefetch stream (a
                               planned prefetch of a block it evicts is decided, not yet made) */
    bool after_fallback;    /* an eviction of a block whose last use is unknown */
    bool from_plan;         /* made at a plan's trigger (its ranges, or room for its prefetches) */
    bool timeable;          /* a prefetch of blocks pump evicted before, each: bytes that cross the link */
    bool populate;          /* a prefetch of memory discarded on the context's legacy peer: made on its
                               populate stream (discard_marks.h) */
    uint32_t n, waits, discards;
    CUdeviceptr ptr[PUMP_MOVE_BATCH];
    size_t size[PUMP_MOVE_BATCH];
    uint64_t wait[PUMP_MOVE_BATCH];     /* an eviction: the uses it waits for */
    uint64_t discard[PUMP_MOVE_BATCH];  /* marks of discards its memory waits for, if still running */
    struct {
        struct pump_range *range;
        struct pump_blocks *a;
        uint32_t first, count;
    } run[PUMP_MOVE_BATCH];             /* a prefetch: the blocks it brings */
    uint64_t bytes, blocks;
    uint64_t dead_bytes;      /* an eviction: of its bytes, those of freed tensors kept in place */
    bool taken;               /* made: the driver took it */
    uint64_t token;           /* a plan's prefetch, made: the token of its end */
};

struct pump_decision {
    struct pump_context *c;
    int device;
    CUstream stream;     /* the launch's: its kernel waits there; a fallback use may be recorded there
                            (NULL, the legacy stream: none) */
    uint64_t after;      /* a use every eviction here also waits for (0: none) */
    uint64_t fallback;   /* the use waited for when a block's last use is unknown (0: one recorded on stream) */
    uint64_t number;     /* marks the blocks that are never its victims */
    uint64_t held;       /* the device locks it holds */
    uint64_t turn;       /* its device's turn + 1 (0: none taken: no driver call) */
    uint64_t ready;      /* the kernel waits for this planned prefetch (0: none) */
    bool kernel_waits;   /* a launch's kernel waits for the prefetches (and its populates: discard_marks.h) */
    uint32_t n;
    struct pump_move *moves;
};

/* Takes the locks a decision over the allocations ranges[0 .. n) and the
 * plan's ranges plan[0 .. plan_n) needs (residency_blocks.h), and marks the
 * allocations of `ranges`: never its victims. False when the device cannot
 * be set up (nothing is taken). */
PUMP_HIDDEN bool pump_decision_begin(struct pump_decision *dn, struct pump_range *const *ranges, uint32_t n,
                                     const struct pump_plan_range *plan, uint32_t plan_n);
/* The allocation's blocks a plan range names, or NULL when the range is not
 * inside a live managed allocation whose blocks' keepers the decision holds. */
PUMP_HIDDEN struct pump_blocks *pump_decision_plan_blocks(struct pump_decision *dn,
                                                          const struct pump_plan_range *range, uint32_t *first,
                                                          uint32_t *last);
/* Its moves will be handed over in its device's turn (also without moves: a
 * kernel's wait for a planned prefetch not yet made). */
PUMP_HIDDEN void pump_decision_turn(struct pump_decision *dn);
/* Writes down a move; false when there is no memory for it (it is then not made). */
PUMP_HIDDEN bool pump_decision_write(struct pump_decision *dn, const struct pump_move *m);
/* Leaves the locks: the belief is decided. */
PUMP_HIDDEN void pump_decision_unlock(struct pump_decision *dn);
/* Hands the decision's moves over in its device's turn; where its kernel
 * waits for them, their calls are made on return, and then the kernel's wait.
 * The blocks its prefetches brought are settled once made. True when it
 * prefetched. The caller holds no pump lock. */
PUMP_HIDDEN bool pump_decision_make(struct pump_decision *dn);

#endif
