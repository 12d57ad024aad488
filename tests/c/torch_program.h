/* torch_program.h: what the fakecuda programs of PyTorch's allocation patterns
 * (torch_allocator.c, torch_streams.c) share: the caching allocator, tensors from the
 * pluggable allocator, and a host function that holds its stream, so that work enqueued
 * meanwhile waits. */
#ifndef PUMP_TEST_TORCH_PROGRAM_H
#define PUMP_TEST_TORCH_PROGRAM_H

#include <stdatomic.h>
#include <stdbool.h>
#include <time.h>

#include "torch_caching.h"
#include "pluggable.h"

/* A tensor from PyTorch's caching allocator over `cache`, or (`pluggable`) from the
 * allocator a CUDAPluggableAllocator calls, on `stream`; and its free. */
static inline CUdeviceptr torch_tensor_alloc(struct torch_caching *cache, bool pluggable, size_t bytes,
                                             CUstream stream)
{
    return pluggable ? pluggable_alloc(bytes, stream) : torch_caching_alloc(cache, bytes);
}

static inline void torch_tensor_free(struct torch_caching *cache, bool pluggable, CUdeviceptr p, size_t bytes,
                                     CUstream stream)
{
    if (pluggable)
        pluggable_free(p, bytes, stream);
    else
        torch_caching_free(cache, p, bytes);
}

/* A host function holding its stream until the flag (an atomic_int) is set, or 10 s pass. */
static inline void fake_hold(void *flag)
{
    for (int i = 0; i < 100000 && !atomic_load((atomic_int *)flag); i++)
        nanosleep(&(struct timespec){0, 100000}, NULL);
}

#endif
