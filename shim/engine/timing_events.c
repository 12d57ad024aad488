/* timing_events.c: a pair of timing events, made and read, and the probe that owns one (see
 * timing_events.h). */
#include "devices.h"
#include "prefetch_ranges.h"
#include "timing_events.h"

PUMP_HIDDEN bool pump_timing_events_make(CUcontext ctx, CUevent *start, CUevent *end)
{
    bool pushed;
    bool made = pump_context_push(ctx, &pushed) &&
                pump_call_ok(pump_driver.event_create(start, CU_EVENT_DEFAULT), "cuEventCreate") &&
                pump_call_ok(pump_driver.event_create(end, CU_EVENT_DEFAULT), "cuEventCreate");
    pump_context_pop(pushed);
    return made;
}

PUMP_HIDDEN bool pump_timing_events_read(CUevent start, CUevent end, uint64_t *ns)
{
    CUresult r = pump_driver.event_query(end);
    if (r == CUDA_ERROR_NOT_READY)
        return false;
    float ms = 0;
    *ns = r == CUDA_SUCCESS && pump_call_ok(pump_driver.event_elapsed(&ms, start, end), "cuEventElapsedTime") &&
                  ms > 0
              ? (uint64_t)((double)ms * 1e6)
              : 0;
    return true;
}

PUMP_HIDDEN uint32_t pump_probe_take(struct pump_timing_probe *p, uint32_t forgets, uint32_t from)
{
    uint32_t state = __atomic_load_n(&p->state, __ATOMIC_ACQUIRE);
    bool takeable = state != PUMP_PROBE_BUSY && (from & 1u << state) &&
                    (state != PUMP_PROBE_BROKEN || __atomic_load_n(&p->forgets, __ATOMIC_RELAXED) != forgets);
    if (!takeable || !__atomic_compare_exchange_n(&p->state, &state, PUMP_PROBE_BUSY, false, __ATOMIC_ACQUIRE,
                                                  __ATOMIC_RELAXED))
        return PUMP_PROBE_BUSY;
    return state;
}

PUMP_HIDDEN void pump_probe_let_go(struct pump_timing_probe *p, uint32_t to)
{
    __atomic_store_n(&p->state, to, __ATOMIC_RELEASE);
}

PUMP_HIDDEN bool pump_probe_events(struct pump_timing_probe *p, CUcontext ctx, uint32_t forgets)
{
    if (p->made && __atomic_load_n(&p->forgets, __ATOMIC_RELAXED) == forgets)
        return true;
    p->made = pump_timing_events_make(ctx, &p->start, &p->end);
    __atomic_store_n(&p->forgets, forgets, __ATOMIC_RELAXED);
    return p->made;
}

PUMP_HIDDEN bool pump_probe_read(struct pump_timing_probe *p, uint32_t forgets, uint64_t *ns)
{
    if (__atomic_load_n(&p->forgets, __ATOMIC_RELAXED) != forgets) {
        p->made = false;  /* its context went, and its events with it */
        *ns = 0;
        return true;
    }
    return pump_timing_events_read(p->start, p->end, ns);
}
