#!/usr/bin/env python3
"""A program that launches one kernel through each kind of handle: a CUfunction from
cuModuleGetFunction, a CUkernel from cuLibraryGetKernel (cast to CUfunction, as cuda.h allows
for cuLaunchKernel), and the CUfunction cuKernelGetFunction gives for it.  handle_kind.py's
workload where PyTorch cannot launch (the dry run on fakecuda), and a check beside PyTorch's on
a GPU.  Prints one JSON line with the result of a saxpy through each."""

import ctypes
import sys

import probe
from cudrv import call, cu, managed_saxpy

N = 1 << 16


def main() -> int:
    gpu, status = probe.start("launch_kinds", 2 * N * 4)
    if gpu is None:
        return status
    stream = call("cuStreamCreate", cu.CUstream_flags.CU_STREAM_NON_BLOCKING)
    library = call("cuLibraryLoadData", managed_saxpy.PTX.encode() + b"\0", None, None, 0, None, None, 0)
    kernel = call("cuLibraryGetKernel", library, b"saxpy")
    handles = {"cuModuleGetFunction": gpu.functions["saxpy"], "cuLibraryGetKernel": cu.CUfunction(int(kernel)),
               "cuKernelGetFunction": call("cuKernelGetFunction", kernel)}
    x, y = gpu.alloc(N * 4, True), gpu.alloc(N * 4, True)
    doc = {"probe": "launch_kinds", "results": {}}
    for origin, handle in handles.items():
        gpu.functions["saxpy"] = handle
        doc["results"][origin] = probe.attempt(
            lambda: (gpu.launch("saxpy", N, stream, ctypes.c_float(2.0), ctypes.c_uint64(x), ctypes.c_uint64(y),
                                ctypes.c_uint64(N)), gpu.synchronize(stream)) and None)
    call("cuMemFree", x)
    call("cuMemFree", y)
    probe.emit(doc)
    return 0 if all(v == "ok" for v in doc["results"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
