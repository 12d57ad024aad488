/* pump_torch_trace.h: what PyTorch's caching allocator tells libpump, the one interface
 * both sides read: libpump (shim/hooks/torch_trace.c) and the bridge compiled against the job's
 * own PyTorch (pump/boot/torch_trace.cpp), which forwards the allocator's trace events.
 * Plain C: the bridge includes it from C++.
 */
#ifndef PUMP_TORCH_TRACE_H
#define PUMP_TORCH_TRACE_H
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum pump_torch_event {
    PUMP_TORCH_TENSOR_ALLOC = 1,  /* a block handed out: [addr, addr+size) is a live tensor */
    PUMP_TORCH_TENSOR_FREE = 2    /* the block back in the cache: the tensor is dead */
};

enum pump_torch_flags {
    PUMP_TORCH_PRIVATE_POOL = 1   /* from a private pool (a CUDA graph's, a MemPool) */
};

/* A CUDA stream (the driver's CUstream and the runtime's cudaStream_t are both this). */
struct CUstream_st;

/* One allocator event: the block [addr, addr+size) and its stream, the one it was allocated
 * on and is handed out again on (PyTorch's TraceEntry::stream_; NULL: the legacy default
 * stream). Called with the allocator's lock held: libpump takes only its own locks, may
 * enqueue work on the block's stream (a discard of the dead block), and never calls back. */
void pump_torch_trace(int event, uint64_t addr, uint64_t size, int flags, struct CUstream_st *stream);

#ifdef __cplusplus
}
#endif
#endif
