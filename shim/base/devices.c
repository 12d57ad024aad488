/* devices.c: the device of an allocation (see devices.h). The capacity, and the device memory
 * pump lets through, are counted per device: a process that uses several GPUs has a cap, a
 * footprint and a memory answer on each. */
#include "capture_mode.h"
#include "devices.h"

enum question { CURRENT, OF_MEMORY };

/* One question to the driver, in relaxed capture mode: the device's ordinal, or -1. */
static int ask(enum question question, CUdeviceptr ptr)
{
    struct pump_capture_mode mode = pump_capture_relax();
    CUdevice device = -1;
    CUresult r = CUDA_ERROR_NOT_SUPPORTED;
    if (question == CURRENT && pump_driver.ctx_get_device != NULL)
        r = pump_driver.ctx_get_device(&device);
    else if (question == OF_MEMORY && pump_driver.pointer_get_attribute != NULL)
        r = pump_driver.pointer_get_attribute(&device, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, ptr);
    pump_capture_restore(&mode);
    return r == CUDA_SUCCESS && device >= 0 && device < PUMP_DEVICES_MAX ? device : -1;
}

PUMP_HIDDEN int pump_current_device(void)
{
    return ask(CURRENT, 0);
}

PUMP_HIDDEN int pump_memory_device(CUdeviceptr ptr)
{
    return ask(OF_MEMORY, ptr);
}

PUMP_HIDDEN bool pump_context_push(CUcontext ctx, bool *pushed)
{
    CUcontext current = NULL;
    *pushed = false;
    if (ctx == NULL || (pump_driver.ctx_get_current(&current) == CUDA_SUCCESS && current == ctx))
        return true;
    if (pump_driver.ctx_push_current == NULL || pump_driver.ctx_pop_current == NULL)
        return false;
    *pushed = pump_driver.ctx_push_current(ctx) == CUDA_SUCCESS;
    return *pushed;
}

PUMP_HIDDEN void pump_context_pop(bool pushed)
{
    CUcontext popped;
    if (pushed)
        pump_driver.ctx_pop_current(&popped);
}

PUMP_HIDDEN bool pump_memory_info(CUcontext ctx, size_t *free_bytes, size_t *total_bytes)
{
    if (pump_driver.mem_get_info == NULL)
        return false;
    struct pump_capture_mode mode = pump_capture_relax();
    bool pushed, ok = pump_context_push(ctx, &pushed);
    ok = ok && pump_driver.mem_get_info(free_bytes, total_bytes) == CUDA_SUCCESS;
    pump_context_pop(pushed);
    pump_capture_restore(&mode);
    return ok;
}
