"""Follows PyTorch's caching allocator for libpump: the default `torch_allocator = "caching"`.

PyTorch reports every block its caching allocator hands out and takes back to trace
trackers, a C++ interface only (attachAllocatorTraceTracker). pump's bridge,
torch_trace.cpp beside this file, is compiled against the job's own PyTorch
(_pump_torch_build.py) and attached when PyTorch initialises CUDA, which is when the
allocator comes to exist, before any tensor. libpump then sees tensors, not segments
(shim/hooks/torch_trace.c). Where the bridge cannot be had, the job runs as before, pump seeing
segments, after one notice. Once attached, the end of every optimizer step is told to libpump
(pump_torch_trace_step), so that a trace of the job says where its steps end: its launches
repeat no key from step to step, the allocator handing tensors other memory. Like
sitecustomize.py, this file uses the standard library only.
"""

import ctypes

import _pump_torch_allocator as allocator
import _pump_torch_build as bridges

SOURCE, LIBS = "torch_trace.cpp", ("c10_cuda", "c10")


def attach(torch, notice):
    """Build (or find) the bridge and attach it; one notice where it cannot be."""
    try:
        library = ctypes.CDLL(bridges.build(torch, SOURCE, LIBS))
        status = library.pump_torch_trace_attach()
        if status == 1:
            raise bridges.Unavailable("libpump is not in this process")
        if status != 0:
            raise bridges.Unavailable("PyTorch refused its trace tracker")
    except Exception as error:  # pump must never break the job: it goes on as without the bridge
        notice(f"PyTorch's allocator is not followed: {error}; "
               "pump sees its segments, not its tensors")
        return
    allocator.mark_steps(torch, notice, "pump_torch_trace_step", "traces of this job hold no step markers")


def arm(torch, notice):
    """Attach once PyTorch has initialised CUDA (now, if it has); nothing on a CPU-only build.
    `notice(message)` says why, once, where it cannot be."""
    if getattr(getattr(torch, "version", None), "cuda", None) is None:
        return
    try:
        torch.cuda._lazy_call(lambda: attach(torch, notice))
    except Exception as error:  # a PyTorch without the hook pump waits on
        notice(f"PyTorch's allocator is not followed: cannot wait for its CUDA start ({error})")
