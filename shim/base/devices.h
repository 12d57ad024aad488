/* devices.h: which device (the driver's ordinal) an allocation is made on, asked in relaxed
 * capture mode (capture_mode.h). -1 where the driver does not say, or the ordinal is past
 * PUMP_DEVICES_MAX: such memory passes through uncounted. */
#ifndef PUMP_DEVICES_H
#define PUMP_DEVICES_H

#include "shim.h"

/* The calling thread's current context's device (cuMemAlloc's, cuMemAllocManaged's). */
PUMP_HIDDEN int pump_current_device(void);
/* The device the memory at `ptr` belongs to (CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL). */
PUMP_HIDDEN int pump_memory_device(CUdeviceptr ptr);

/* Makes ctx current for pump's own calls (NULL: the current one stays): true, with *pushed
 * when it had to be pushed; pump_context_pop(pushed) undoes it. */
PUMP_HIDDEN bool pump_context_push(CUcontext ctx, bool *pushed);
PUMP_HIDDEN void pump_context_pop(bool pushed);

/* The memory of ctx's device (NULL: the current context's): cuMemGetInfo in ctx, in relaxed
 * capture mode; false when it cannot be read. */
PUMP_HIDDEN bool pump_memory_info(CUcontext ctx, size_t *free_bytes, size_t *total_bytes);

#endif
