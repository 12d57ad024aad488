/* timing_events.c: a pair of timing events, made and read (see timing_events.h). */
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
