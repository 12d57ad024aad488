/* torch_program.h: what the fakecuda programs of PyTorch's allocation patterns
 * (torch_allocator.c, torch_streams.c) share: a tensor from the pluggable allocator,
 * registering a kernel (a host function), and a host function that holds its stream, so
 * that work enqueued meanwhile waits. */
#ifndef PUMP_TEST_TORCH_PROGRAM_H
#define PUMP_TEST_TORCH_PROGRAM_H

#include <stdatomic.h>
#include <time.h>

#include "torch_caching.h"

/* A tensor from the allocator a CUDAPluggableAllocator would call: libpump's when the
 * process has it, else the driver's stream-ordered pool (PyTorch's cudaMallocAsync backend). */
static inline CUdeviceptr pluggable_alloc(size_t bytes, CUstream stream)
{
    if (pump_torch_alloc != NULL)
        return (CUdeviceptr)(uintptr_t)pump_torch_alloc((ssize_t)bytes, 0, stream);
    CUdeviceptr p;
    CHECK(cuMemAllocAsync(&p, bytes, stream));
    return p;
}

/* The kernel `name` of `count` parameters of sizes[i] bytes, each aligned to its size. */
static inline CUfunction fake_kernel(CUmodule module, const char *name, fakecuda_kernel_fn kernel, unsigned count,
                                     const size_t *sizes)
{
    if (api.register_kernel(name, kernel, count, sizes, sizes)) {
        fprintf(stderr, "error: kernel registration failed\n");
        exit(3);
    }
    CUfunction f;
    CHECK(cuModuleGetFunction(&f, module, name));
    return f;
}

/* A host function holding its stream until the flag (an atomic_int) is set, or 10 s pass. */
static inline void fake_hold(void *flag)
{
    for (int i = 0; i < 100000 && !atomic_load((atomic_int *)flag); i++)
        nanosleep(&(struct timespec){0, 100000}, NULL);
}

#endif
