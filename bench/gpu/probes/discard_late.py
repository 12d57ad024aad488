#!/usr/bin/env python3
"""Whether a discard asked for on a busy stream lands before the work after it: the question the
H200 run of 2026-11-27 left (bench/results/gpu-20261127-nvidia-h200/discard-variants: case c's
launch-discards computed another loss, and the same run with CUDA_LAUNCH_BLOCKING=1, where each
discard is asked for on an idle stream, did not; 742 of pump's prefetches had waited for a
discard's mark). UVM's discard is an ioctl without a semaphore (uvm_ioctl.h, UVM_DISCARD), so
the CUDA driver must hold the stream's later work until it has run; a discard that lands after
a write leaves that write's pages discarded, and their next move to the host drops them
(uvm_va_block.c, block_copy_resident_pages). discard_order.py read the memory back on the GPU,
where a late discard loses nothing; this probe moves it to the host first.

    python bench/gpu/probes/discard_late.py [--mib M] [--rounds R] [--busy K]

Per round and way: managed memory `x` (M MiB), resident on the GPU; a stream S is kept busy
with K saxpy kernels over a buffer of its own, then `x` is discarded on S (the call returns long
before S reaches it), then `x` is written with the value 3.0 and moved to the host:
- same_stream: the write (a memset) and the move (a prefetch to the host) on S;
- event: on another stream P that waits for an event recorded on S after the discard, pump's
  order for its own moves (shim/engine/discard_marks.c): a prefetch of `x` to the GPU, a kernel
  that writes it (x = 0*src + 3), a prefetch to the host;
- event_half: as event, but P prefetches and writes only the first half, and S then writes the
  second half (a memset) after an event recorded on P: two tensors in one dead block.
The host then counts the elements of `x` that are not 3.0. Prints one JSON line: per way the
elements lost (all rounds) and the host's seconds in the discard call (median). Loss in
same_stream is the driver's known behaviour (the H200 lost every element), which pump avoids by
asking for a discard only once the freeing stream has drained (shim/engine/discard_marks.c);
loss in `event` would put pump's own order for its moves in doubt: that is a finding, and the
probe exits 1."""

import ctypes
import statistics
import struct
import sys
import time

import numpy as np

import probe
from cudrv import call, cu

MiB = 1 << 20
WAYS = ("same_stream", "event", "event_half")


def main(argv=None) -> int:
    args = probe.sized_args("discard_late.py", __doc__, argv, 64, "MiB of each of the three buffers", 2,
                            probe.busy_kernels)
    busy = max(args.busy, 0)
    size = args.mib * MiB
    n = size // 4
    half = size // 2
    gpu, status = probe.start("discard_late", 3 * size)
    if gpu is None:
        return status
    s = call("cuStreamCreate", cu.CUstream_flags.CU_STREAM_NON_BLOCKING)
    p = call("cuStreamCreate", cu.CUstream_flags.CU_STREAM_NON_BLOCKING)
    timing_off = cu.CUevent_flags.CU_EVENT_DISABLE_TIMING
    discarded, written = call("cuEventCreate", timing_off), call("cuEventCreate", timing_off)
    three = struct.unpack("<I", struct.pack("<f", 3.0))[0]
    doc = {"probe": "discard_late", "bytes": size, "rounds": args.rounds, "busy_kernels": busy, "fakecuda": gpu.fake}
    buffers = []
    with probe.measuring(doc, buffers):
        buffers.extend(gpu.alloc(size, True) for _ in range(3))
        x, z, zero = buffers
        found = {way: {"lost": 0, "call_seconds": []} for way in WAYS}
        for _ in range(args.rounds):
            for way in WAYS:
                for ptr, value in ((x, 7.0), (zero, 0.0)):
                    gpu.host_touch(ptr, size)
                    probe.as_floats(ptr, n)[:] = value
                    gpu.prefetch(ptr, size, True, s)
                gpu.synchronize(s)
                for _ in range(busy):
                    gpu.launch("saxpy", n, s, ctypes.c_float(1.0), ctypes.c_uint64(z), ctypes.c_uint64(z),
                               ctypes.c_uint64(n))
                began = time.perf_counter()
                call("cuMemDiscardBatchAsync", [cu.CUdeviceptr(x)], [size], 1, 0, s)
                found[way]["call_seconds"].append(time.perf_counter() - began)
                if way == "same_stream":
                    call("cuMemsetD32Async", x, three, n, s)
                    gpu.prefetch(x, size, False, s)
                else:
                    part = half if way == "event_half" else size
                    call("cuEventRecord", discarded, s)
                    call("cuStreamWaitEvent", p, discarded, 0)
                    gpu.prefetch(x, part, True, p)
                    call("cuMemsetD32Async", x, three, part // 4, p)  # the other stream's write
                    gpu.launch("saxpy", part // 4, p, ctypes.c_float(0.0), ctypes.c_uint64(zero), ctypes.c_uint64(x),
                               ctypes.c_uint64(part // 4))  # x = 0*0 + x: a kernel's write too
                    if way == "event_half":
                        call("cuEventRecord", written, p)
                        call("cuStreamWaitEvent", s, written, 0)
                        call("cuMemsetD32Async", x + half, three, (size - half) // 4, s)
                        gpu.prefetch(x, size, False, s)
                    else:
                        gpu.prefetch(x, size, False, p)
                call("cuCtxSynchronize")
                gpu.host_touch(x, size)
                found[way]["lost"] += int(np.count_nonzero(probe.as_floats(x, n) != 3.0))
        doc["ways"] = {way: {"lost": f["lost"], "call_seconds": statistics.median(f["call_seconds"])}
                       for way, f in found.items()}
    probe.emit(doc)
    return 1 if "finding" in doc or doc.get("ways", {}).get("event", {}).get("lost") else 0


if __name__ == "__main__":
    sys.exit(main())
