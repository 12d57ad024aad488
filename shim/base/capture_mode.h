/* capture_mode.h: every driver call pump makes for itself runs in relaxed stream-capture
 * mode. In the default global mode, a thread is prohibited from potentially unsafe calls
 * (cuEventQuery, for one) while any other thread captures in global mode, and such a call
 * invalidates that capture (cuThreadExchangeStreamCaptureMode in cuda.h): pump's calls
 * must never break a graph the program captures on another thread. */
#ifndef PUMP_CAPTURE_MODE_H
#define PUMP_CAPTURE_MODE_H

#include "shim.h"

/* The calling thread's mode before pump relaxed it. */
struct pump_capture_mode {
    CUstreamCaptureMode mode;
    bool relaxed;  /* false: the driver has no modes (before CUDA 10.1) or refused */
};

static inline struct pump_capture_mode pump_capture_relax(void)
{
    struct pump_capture_mode m = {.mode = CU_STREAM_CAPTURE_MODE_RELAXED};
    m.relaxed = pump_driver.exchange_capture_mode != NULL && pump_driver.exchange_capture_mode(&m.mode) == CUDA_SUCCESS;
    return m;
}

static inline void pump_capture_restore(struct pump_capture_mode *m)
{
    if (m->relaxed)
        pump_driver.exchange_capture_mode(&m->mode);
}

#endif
