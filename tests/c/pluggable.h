/* pluggable.h: a tensor's memory as PyTorch's CUDAPluggableAllocator gets it under pump:
 * libpump's pump_torch_alloc / pump_torch_free when the process has them, else the
 * stream-ordered calls of PyTorch's cudaMallocAsync backend (a run without pump). */
#ifndef PUMP_TEST_PLUGGABLE_H
#define PUMP_TEST_PLUGGABLE_H

#include <sys/types.h>

#include "check.h"

/* libpump's entry points, when the process has libpump (weak: a bare run has none). */
extern void *pump_torch_alloc(ssize_t size, int device, CUstream stream) __attribute__((weak));
extern void pump_torch_free(void *ptr, size_t size, int device, CUstream stream) __attribute__((weak));

__attribute__((unused)) static CUdeviceptr pluggable_alloc(size_t bytes, CUstream stream)
{
    if (pump_torch_alloc != NULL)
        return (CUdeviceptr)(uintptr_t)pump_torch_alloc((ssize_t)bytes, 0, stream);
    CUdeviceptr p;
    CHECK(cuMemAllocAsync(&p, bytes, stream));
    return p;
}

__attribute__((unused)) static void pluggable_free(CUdeviceptr p, size_t bytes, CUstream stream)
{
    if (pump_torch_free != NULL)
        pump_torch_free((void *)(uintptr_t)p, bytes, 0, stream);
    else
        CHECK(cuMemFreeAsync(p, stream));
}

#endif
