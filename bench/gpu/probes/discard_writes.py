#!/usr/bin/env python3
"""Whether data written into discarded managed memory survives the memory's next move: the
question the H200 run of 2026-11-26 left (bench/results/gpu-20261126-nvidia-h200: case c's
launch rule, discarding the caching allocator's dead tensors, computed another loss, and NaN
in one run, though discard_order.py found every discard in its stream's order). cuda.h says a
discard "can be undone on any part of the range by either writing to it or prefetching it";
the UVM driver's uvm.h says of a discard that leaves the pages mapped that writes there "will
not clear the discard status" and that evicted discarded memory is not copied. pump discards a
dead tensor's blocks and lets the next tensor there be written (by a kernel it may not have
prefetched for, a memset, a copy) before it evicts them.

    python bench/gpu/probes/discard_writes.py [--mib M] [--rounds R]

Per round and way: managed memory `x` (M MiB), resident on the GPU with old data, is discarded
on a stream, then written there one way:
- kernel: a saxpy kernel, x = src + x (what it reads is indeterminate, what it writes is not);
- memset: cuMemsetD32Async;
- copy: cuMemcpyDtoDAsync from `src`;
- prefetched: the kernel's write after a prefetch of `x` to the GPU (what cuda.h names as the
  other undoing; pump's path for a block a launch it saw uses);
- half_prefetched: the kernel's write after a prefetch of only the first half of `x` (pump
  prefetches a tensor's own range, and the caching allocator puts two tensors in one dead 2 MiB
  block);
- split: the second half of `x` moved to the host before the discard (a block whose pages the
  driver or an eviction of a neighbour left in two places), then the kernel's write;
- mapped: a kernel writes `x` before the discard too, so the GPU holds it mapped for writing
  (uvm.h: a discard that keeps the mappings leaves a write through them discarded, and an
  eviction drops it), then the kernel's write.
The GPU's view of `x` after the write is copied out by a kernel (z = x + 0), then `x` moves to
the host, by a prefetch (`evict`) or by the host's own read (`fault`), and the host compares
it with `z`, bit for bit. Prints one JSON line: per way and move the elements that differ (all rounds). A
way whose `lost` is not 0 is a finding: the probe exits 1."""

import ctypes
import struct
import sys

import numpy as np

import probe
from cudrv import call, cu

MiB = 1 << 20
WAYS = ("kernel", "memset", "copy", "prefetched", "half_prefetched", "split", "mapped")
MOVES = ("evict", "fault")


def main(argv=None) -> int:
    args = probe.sized_args("discard_writes.py", __doc__, argv, 64, "MiB of each of the three buffers", 2)
    size = args.mib * MiB
    n = size // 4
    gpu, status = probe.start("discard_writes", 3 * size)
    if gpu is None:
        return status
    own = call("cuStreamCreate", cu.CUstream_flags.CU_STREAM_NON_BLOCKING)
    doc = {"probe": "discard_writes", "bytes": size, "rounds": args.rounds, "fakecuda": gpu.fake}
    three = struct.unpack("<I", struct.pack("<f", 3.0))[0]
    buffers = []
    with probe.measuring(doc, buffers):
        buffers.extend(gpu.alloc(size, True) for _ in range(3))
        x, src, z = buffers
        source = (np.arange(n, dtype=np.float32) % 1021) + 1.0
        lost = {way: {move: 0 for move in MOVES} for way in WAYS}
        for _ in range(args.rounds):
            for way in WAYS:
                for move in MOVES:
                    for ptr, values in ((x, 7.0), (src, source), (z, 0.0)):
                        gpu.host_touch(ptr, size)
                        probe.as_floats(ptr, n)[:] = values
                        gpu.prefetch(ptr, size, True, own)
                    if way == "split":
                        gpu.prefetch(x + size // 2, size // 2, False, own)
                    elif way == "mapped":
                        gpu.launch("saxpy", n, own, ctypes.c_float(1.0), ctypes.c_uint64(src), ctypes.c_uint64(x),
                                   ctypes.c_uint64(n))
                    gpu.synchronize(own)
                    call("cuMemDiscardBatchAsync", [cu.CUdeviceptr(x)], [size], 1, 0, own)
                    if way == "prefetched":
                        gpu.prefetch(x, size, True, own)
                    elif way == "half_prefetched":
                        gpu.prefetch(x, size // 2, True, own)
                    if way == "memset":
                        call("cuMemsetD32Async", x, three, n, own)
                    elif way == "copy":
                        call("cuMemcpyDtoDAsync", x, src, size, own)
                    else:
                        gpu.launch("saxpy", n, own, ctypes.c_float(1.0), ctypes.c_uint64(src), ctypes.c_uint64(x),
                                   ctypes.c_uint64(n))
                    gpu.launch("saxpy", n, own, ctypes.c_float(1.0), ctypes.c_uint64(x), ctypes.c_uint64(z),
                               ctypes.c_uint64(n))
                    if move == "evict":
                        gpu.prefetch(x, size, False, own)
                    gpu.synchronize(own)
                    gpu.host_touch(z, size)
                    seen = probe.as_floats(z, n).view(np.uint32).copy()  # bits: NaN is NaN
                    gpu.host_touch(x, size)
                    lost[way][move] += int(np.count_nonzero(probe.as_floats(x, n).view(np.uint32) != seen))
        doc["ways"] = lost
    probe.emit(doc)
    found = any(count for moves in doc.get("ways", {}).values() for count in moves.values())
    return 1 if "finding" in doc or found else 0


if __name__ == "__main__":
    sys.exit(main())
