#!/usr/bin/env python3
"""Whether a discard is made where pump asks for it in a stream's order: the question the second
H100 run left (bench/results/gpu-20261126-nvidia-h100-80gb-hbm3: case c's launch rule, which
discarded the caching allocator's dead tensors, computed another loss at step 0; the runs that
did not discard were bit-identical). pump discards a tensor the legacy default stream freed on a
stream of its own, since the driver refuses a discard on the legacy stream; until that run the
order came from the legacy stream's implicit synchronisation with a blocking stream, which no
documentation promises for a discard, and now from events both ways.

    python bench/gpu/probes/discard_order.py [--mib M] [--rounds R] [--busy K]

Per round and way: managed memory `x` (M MiB) is written on the host and left there; a stream
is kept busy with K saxpy kernels over a buffer of its own, then a kernel reads `x` (y = 2x + y
into a zeroed `y` on the GPU), and right after that launch `x` is discarded:
- peer_implicit: on a blocking stream, the kernels on the legacy stream (pump until that run);
- peer_events: on a non-blocking stream that waits for an event recorded on the legacy stream
  after the kernels, the legacy stream then waiting for an event recorded after the discard
  (pump now, shim/engine/discard_marks.c);
- passed_events: the host waits until the GPU has passed an event recorded on the legacy stream
  after the kernels, then discards on an idle non-blocking stream, the legacy stream waiting for
  an event recorded after the discard (pump on a full card, shim/policy/passed_discards.c);
- same_stream: the kernels and the discard on one non-blocking stream (cuda.h: a discard
  "executes in stream order").
A discard made before the kernel read `x` leaves it indeterminate data: `y` then differs from
2x. Then the other half of the order, which the H200 run left open (bench/results/
gpu-20261126-nvidia-h200: case c's launch-discards still computed another loss, and NaN, with
every discard of this probe in order): the work that comes after the discard on the kernel's
stream writes `x` again (a memset to 3.0) and a kernel copies it into a zeroed `w`; a discard
that lands after that write leaves `x` indeterminate, and `w` differs from 3.0. Prints one JSON
line: per way the elements of `y` that differ (`wrong`) and of `w` (`written_wrong`), all
rounds, and the host's seconds in the discard call (median): a call that waits for the stream
shows its busy time. A way with either count above 0 is a finding: the probe exits 1."""

import ctypes
import statistics
import struct
import sys
import time

import numpy as np

import probe
from cudrv import call, cu

MiB = 1 << 20
WAYS = ("peer_implicit", "peer_events", "passed_events", "same_stream")


def main(argv=None) -> int:
    args = probe.sized_args("discard_order.py", __doc__, argv, 256, "MiB of each of the four buffers", 2,
                            probe.busy_kernels)
    busy = max(args.busy, 0)
    size = args.mib * MiB
    n = size // 4
    gpu, status = probe.start("discard_order", 4 * size)
    if gpu is None:
        return status
    legacy = cu.CUstream(cu.CU_STREAM_LEGACY)
    own = call("cuStreamCreate", cu.CUstream_flags.CU_STREAM_NON_BLOCKING)
    blocking_peer = call("cuStreamCreate", cu.CUstream_flags.CU_STREAM_DEFAULT)
    events_peer = call("cuStreamCreate", cu.CUstream_flags.CU_STREAM_NON_BLOCKING)
    timing_off = cu.CUevent_flags.CU_EVENT_DISABLE_TIMING
    reached, discarded = call("cuEventCreate", timing_off), call("cuEventCreate", timing_off)
    doc = {"probe": "discard_order", "bytes": size, "rounds": args.rounds, "busy_kernels": busy,
           "fakecuda": gpu.fake}
    buffers = []
    with probe.measuring(doc, buffers):
        buffers.extend(gpu.alloc(size, True) for _ in range(4))
        x, y, z, w = buffers
        pattern = (np.arange(n, dtype=np.float32) % 1021) + 1.0
        three = struct.unpack("<I", struct.pack("<f", 3.0))[0]
        found = {way: {"wrong": 0, "written_wrong": 0, "call_seconds": []} for way in WAYS}
        for _ in range(args.rounds):
            for way in WAYS:
                work = own if way == "same_stream" else legacy
                gpu.prefetch(x, size, False, own)  # an earlier way's discard of x ends here (cuda.h: a prefetch undoes it)
                gpu.synchronize(own)
                gpu.host_touch(x, size)
                probe.as_floats(x, n)[:] = pattern  # on the host: a discard there loses it
                gpu.host_touch(y, size)
                probe.as_floats(y, n)[:] = 0.0
                gpu.prefetch(y, size, True, own)
                gpu.prefetch(z, size, True, own)
                gpu.host_touch(w, size)
                probe.as_floats(w, n)[:] = 0.0
                gpu.prefetch(w, size, True, own)
                gpu.synchronize(own)
                for _ in range(busy):
                    gpu.launch("saxpy", n, work, ctypes.c_float(1.0), ctypes.c_uint64(z), ctypes.c_uint64(z),
                               ctypes.c_uint64(n))
                gpu.launch("saxpy", n, work, ctypes.c_float(2.0), ctypes.c_uint64(x), ctypes.c_uint64(y),
                           ctypes.c_uint64(n))
                began = time.perf_counter()
                if way == "peer_implicit":
                    call("cuMemDiscardBatchAsync", [cu.CUdeviceptr(x)], [size], 1, 0, blocking_peer)
                elif way == "peer_events":
                    call("cuEventRecord", reached, legacy)
                    call("cuStreamWaitEvent", events_peer, reached, 0)
                    call("cuMemDiscardBatchAsync", [cu.CUdeviceptr(x)], [size], 1, 0, events_peer)
                    call("cuEventRecord", discarded, events_peer)
                    call("cuStreamWaitEvent", legacy, discarded, 0)
                elif way == "passed_events":
                    call("cuEventRecord", reached, legacy)
                    call("cuEventSynchronize", reached)
                    began = time.perf_counter()  # the call's own time, not the wait for the GPU before it
                    call("cuMemDiscardBatchAsync", [cu.CUdeviceptr(x)], [size], 1, 0, events_peer)
                    call("cuEventRecord", discarded, events_peer)
                    call("cuStreamWaitEvent", legacy, discarded, 0)
                else:
                    call("cuMemDiscardBatchAsync", [cu.CUdeviceptr(x)], [size], 1, 0, own)
                found[way]["call_seconds"].append(time.perf_counter() - began)
                call("cuMemsetD32Async", x, three, n, work)  # the stream's work to come writes x
                gpu.launch("saxpy", n, work, ctypes.c_float(1.0), ctypes.c_uint64(x), ctypes.c_uint64(w),
                           ctypes.c_uint64(n))
                call("cuCtxSynchronize")
                gpu.host_touch(y, size)
                found[way]["wrong"] += int(np.count_nonzero(probe.as_floats(y, n) != 2.0 * pattern))
                gpu.host_touch(w, size)
                found[way]["written_wrong"] += int(np.count_nonzero(probe.as_floats(w, n) != 3.0))
        doc["ways"] = {way: {"wrong": f["wrong"], "written_wrong": f["written_wrong"],
                             "call_seconds": statistics.median(f["call_seconds"])} for way, f in found.items()}
    probe.emit(doc)
    wrong = any(way["wrong"] or way["written_wrong"] for way in doc.get("ways", {}).values())
    return 1 if "finding" in doc or wrong else 0


if __name__ == "__main__":
    sys.exit(main())
