/* torch_caching.h: PyTorch's caching allocator as fakecuda programs make it
 * (tests/c/torch_allocator.c, bench/steady_step.c): tensors carved out of segments from the
 * driver, a freed block kept and handed out again, at the same address, to a later request
 * of its size (the lowest-addressed free block of that size, as PyTorch's best fit takes it:
 * c10/cuda/CUDACachingAllocator.cpp keeps free blocks in a std::set ordered by
 * BlockComparatorSize, stream then size then address, and get_free_block takes its
 * lower_bound; so a step that allocates and frees the same sizes gets the same addresses
 * every time), and every block handed out and taken back reported to libpump's
 * pump_torch_trace when the process has it (what pump's bridge, pump/boot/torch_trace.cpp,
 * forwards from the allocator's trace trackers). Blocks are never split or merged (the
 * programs ask for the same sizes every step, so best fit is an exact fit).
 */
#ifndef PUMP_TEST_TORCH_CACHING_H
#define PUMP_TEST_TORCH_CACHING_H

#include <stdbool.h>
#include <sys/types.h>

#include "cuda_api.h"
#include "pump_torch_trace.h"

/* libpump's bridge, when the process has libpump (weak: the bare run has none). */
extern void pump_torch_trace(int event, uint64_t addr, uint64_t size, int flags, CUstream stream)
    __attribute__((weak));

#define TORCH_CACHING_SEGMENTS 64
#define TORCH_CACHING_FREE_BLOCKS 1024

struct torch_caching {
    size_t segment_size;  /* bytes asked of the driver per segment */
    bool managed;         /* segments from cuMemAllocManaged instead of cuMemAlloc */
    bool report;          /* tell libpump (when present) what is handed out and taken back */
    CUstream stream;      /* the stream every block is allocated on and freed on (NULL: legacy) */
    struct { CUdeviceptr base; size_t used; } segments[TORCH_CACHING_SEGMENTS];
    int nsegments;
    struct { CUdeviceptr ptr; size_t size; } free_blocks[TORCH_CACHING_FREE_BLOCKS];
    int nfree;
};

static inline void torch_caching_report(const struct torch_caching *c, int event, CUdeviceptr p, size_t bytes)
{
    if (c->report && pump_torch_trace != NULL)
        pump_torch_trace(event, p, bytes, 0, c->stream);
}

/* A block of `bytes`: the lowest-addressed free one of that size, else carved from the first
 * segment with room, else from a new segment. */
static inline CUdeviceptr torch_caching_alloc(struct torch_caching *c, size_t bytes)
{
    CUdeviceptr p = 0;
    int found = -1;
    for (int i = 0; i < c->nfree; i++)
        if (c->free_blocks[i].size == bytes && (found < 0 || c->free_blocks[i].ptr < c->free_blocks[found].ptr))
            found = i;
    if (found >= 0) {
        p = c->free_blocks[found].ptr;
        c->free_blocks[found] = c->free_blocks[--c->nfree];
    }
    for (int i = 0; i < c->nsegments && p == 0; i++)
        if (c->segment_size - c->segments[i].used >= bytes) {
            p = c->segments[i].base + c->segments[i].used;
            c->segments[i].used += bytes;
        }
    if (p == 0) {
        if (c->nsegments == TORCH_CACHING_SEGMENTS || bytes > c->segment_size) {
            fprintf(stderr, "error: torch_caching: no room for %zu bytes\n", bytes);
            exit(3);
        }
        CUdeviceptr base;
        if (c->managed)
            CHECK(api.mem_alloc_managed(&base, c->segment_size, CU_MEM_ATTACH_GLOBAL));
        else
            CHECK(api.mem_alloc(&base, c->segment_size));
        c->segments[c->nsegments].base = base;
        c->segments[c->nsegments++].used = bytes;
        p = base;
    }
    torch_caching_report(c, PUMP_TORCH_TENSOR_ALLOC, p, bytes);
    return p;
}

static inline void torch_caching_free(struct torch_caching *c, CUdeviceptr p, size_t bytes)
{
    if (c->nfree == TORCH_CACHING_FREE_BLOCKS) {
        fprintf(stderr, "error: torch_caching: too many free blocks\n");
        exit(3);
    }
    torch_caching_report(c, PUMP_TORCH_TENSOR_FREE, p, bytes);
    c->free_blocks[c->nfree].ptr = p;
    c->free_blocks[c->nfree++].size = bytes;
}

/* Gives every segment back to the driver (torch.cuda.empty_cache with nothing live). */
static inline void torch_caching_release(struct torch_caching *c)
{
    for (int i = 0; i < c->nsegments; i++)
        CHECK(api.mem_free(c->segments[i].base));
    c->nsegments = c->nfree = 0;
}

#endif
