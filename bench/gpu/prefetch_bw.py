#!/usr/bin/env python3
"""The link's measured prefetch bandwidth, the denominator of the GPU suite's lower bound.

    python bench/gpu/prefetch_bw.py [--mib M] [--rounds R]

Allocates M MiB of managed memory (refused, before allocating, when the GPU cannot hold it with
membudget's margin), writes it from the host (so it starts on the host), then R times: prefetches
it to the GPU with cuMemPrefetchAsync, timed with events, and back to the host, timed the same
way; and R times more brings it to the GPU and reads it on the host, timed on the host clock: the
CPU faults migrate it back by the driver's own path, not a prefetch's (fakecuda's
FAKECUDA_D2H_BYTES_PER_US beside FAKECUDA_CPU_FAULT_US, against
FAKECUDA_PREFETCH_D2H_BYTES_PER_US for a prefetch).  Prints one JSON object: {"bytes",
"h2d_bytes_per_s", "d2h_bytes_per_s", "d2h_fault_bytes_per_s" (medians), "h2d_samples",
"d2h_samples", "d2h_fault_samples" (bytes/s per round), "device"}; on fakecuda also
"fakecuda_charged_seconds": per direction and round, the modelled host time the calling thread was
charged (cudrv.Stopwatch).
"""

import ctypes
import json
import statistics
import sys
import time

import numpy as np

import cudrv
from cudrv import call, cu


def main(argv=None) -> int:
    started = cudrv.link_benchmark("prefetch_bw.py", __doc__, argv, 1, 1024, "MiB to move each way",
                                   "timed round trips")
    if started is None:
        return 3
    args, gpu, size = started
    stream = call("cuStreamCreate", cu.CUstream_flags.CU_STREAM_NON_BLOCKING)
    ptr = gpu.alloc(size, managed=True)
    gpu.host_touch(ptr, size)
    ctypes.memset(ptr, 1, size)
    timer = cudrv.PrefetchTimer(gpu, stream)

    charged = {"h2d": [], "d2h": []}

    def timed(to_device: bool) -> float:
        seconds = timer(ptr, size, to_device)
        charged["h2d" if to_device else "d2h"].append(timer.charged)
        return size / seconds

    def faulted_back() -> float:
        timer(ptr, size, True)
        view = np.ctypeslib.as_array((ctypes.c_uint8 * size).from_address(ptr))
        t0 = time.perf_counter()
        gpu.host_touch(ptr, size)  # fakecuda's stand-in for the faults (nothing on a GPU)
        view.sum(dtype=np.uint64)  # every page read: the CPU faults bring it back to the host
        return size / (time.perf_counter() - t0)

    h2d, d2h, faulted = [], [], []
    for _ in range(args.rounds):
        h2d.append(timed(True))
        d2h.append(timed(False))
    for _ in range(args.rounds):
        faulted.append(faulted_back())
    call("cuMemFree", ptr)
    doc = {"bytes": size, "h2d_bytes_per_s": statistics.median(h2d),
           "d2h_bytes_per_s": statistics.median(d2h), "d2h_fault_bytes_per_s": statistics.median(faulted),
           "h2d_samples": h2d, "d2h_samples": d2h, "d2h_fault_samples": faulted, "device": gpu.name}
    if gpu.fake:  # the model's own figures, exactly (cudrv.Stopwatch): what the tests check
        doc["fakecuda_charged_seconds"] = charged
    print(json.dumps(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
