/* residency_evict.h: a rule's evictions (residency.c): which blocks of a
 * device leave pump's belief to make room under its budget, written down as
 * moves of the rule's decision (residency_moves.h), each ordered after its
 * block's last use. */
#ifndef PUMP_RESIDENCY_EVICT_H
#define PUMP_RESIDENCY_EVICT_H

#include "residency_moves.h"

/* Whether mark is one of marks[0 .. n). */
static inline bool pump_marks_hold(const uint64_t *marks, uint32_t n, uint64_t mark)
{
    for (uint32_t k = 0; k < n; k++)
        if (marks[k] == mark)
            return true;
    return false;
}

/* The evictions a decision writes down, a driver call's worth at a time. */
struct evictions {
    struct pump_decision *dn;
    struct pump_move m;
    bool moving_only;  /* pump_make_room takes no block left to the driver (residency_state.h) */
};

/* Writes down the evictions gathered so far (one driver call). */
PUMP_HIDDEN void pump_evictions_flush(struct evictions *e);
/* Block i of a leaves the belief now and the GPU after its last user. */
PUMP_HIDDEN void pump_evict_block(struct evictions *e, struct pump_blocks *a, uint32_t i);
/* Evicts unprotected blocks of the decision's device, in `order`, until
 * `need` more bytes fit under `budget` (0: none); true when they fit. */
PUMP_HIDDEN bool pump_make_room(struct evictions *e, uint64_t need, uint64_t budget, uint32_t order);

#endif
