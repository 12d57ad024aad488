// torch_trace.cpp: the bridge from PyTorch's caching allocator to libpump.
//
// PyTorch tells trace trackers (attachAllocatorTraceTracker, C++ only) of every block its
// caching allocator hands out and takes back, with address, size and stream (a free when it
// completes: after the streams record_stream named are done with the block). This file is
// compiled against the job's own PyTorch by sitecustomize.py (the tracker's types are
// PyTorch's C++ ABI) and attached once CUDA is initialised, when the allocator exists. It
// forwards the two events pump needs to libpump's pump_torch_trace (shim/hooks/torch_trace.c);
// the tracker runs under the allocator's lock, so it does nothing else.
#include <c10/cuda/CUDACachingAllocator.h>

#include <cstdio>

#include "pump_torch_trace.h"

// Weak: a process without libpump loads this file and attaches nothing.
extern "C" __attribute__((weak)) void pump_torch_trace(int, uint64_t, uint64_t, int, struct CUstream_st *);

namespace {

using c10::cuda::CUDACachingAllocator::TraceEntry;

void forward(const TraceEntry &entry)
{
    int event;
    if (entry.action_ == TraceEntry::ALLOC)
        event = PUMP_TORCH_TENSOR_ALLOC;
    else if (entry.action_ == TraceEntry::FREE_COMPLETED)
        event = PUMP_TORCH_TENSOR_FREE;
    else
        return;
    // {0, 0} is the default pool; any other id is a private one (a CUDA graph's, a MemPool).
    int flags = entry.mempool_.first != 0 || entry.mempool_.second != 0 ? PUMP_TORCH_PRIVATE_POOL : 0;
    // stream_ is void * in PyTorch 2.14, cudaStream_t before: a CUstream_st * either way
    pump_torch_trace(event, entry.addr_, entry.size_, flags, (struct CUstream_st *)entry.stream_);
}

}  // namespace

// 0: attached; 1: no libpump in the process; 2: PyTorch refused (its message on stderr).
extern "C" int pump_torch_trace_attach(void)
{
    if (pump_torch_trace == nullptr)
        return 1;
    try {
        c10::cuda::CUDACachingAllocator::attachAllocatorTraceTracker(forward);
    } catch (const std::exception &error) {
        fprintf(stderr, "pump: PyTorch refused the allocator trace tracker: %s\n", error.what());
        return 2;
    }
    return 0;
}
