/* torch_program.h: what the fakecuda programs of PyTorch's allocation patterns
 * (torch_allocator.c, torch_streams.c) share: the caching allocator, tensors from the
 * pluggable allocator, and a host function that holds its stream, so that work enqueued
 * meanwhile waits. */
#ifndef PUMP_TEST_TORCH_PROGRAM_H
#define PUMP_TEST_TORCH_PROGRAM_H

#include <stdatomic.h>
#include <time.h>

#include "torch_caching.h"
#include "pluggable.h"

/* A host function holding its stream until the flag (an atomic_int) is set, or 10 s pass. */
static inline void fake_hold(void *flag)
{
    for (int i = 0; i < 100000 && !atomic_load((atomic_int *)flag); i++)
        nanosleep(&(struct timespec){0, 100000}, NULL);
}

#endif
