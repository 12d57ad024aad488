#!/usr/bin/env python3
"""Whether the driver skips copying discarded managed memory: the simulator's [DISCARD] premise
(pump/simulate/constants.py), measured.

    python bench/gpu/discard.py [--mib M] [--rounds R]

Two buffers of M MiB of managed memory (refused, before allocating, when the GPU cannot hold
them with membudget's margin), each written from the host every round, then:
- on the GPU: prefetched to the GPU; the live one as it is, the other discarded
  (cuMemDiscardBatchAsync); then each timed to the host and back to the GPU;
- on the host: the live one as it is, the other discarded there; each timed to the GPU.
Each move is timed with events around its cuMemPrefetchAsync.  Prints one JSON object: per move
the medians in seconds, live and discarded, and discarded / live: near 0 where the driver skips
the copy, near 1 where it does not; on fakecuda also its byte counters for the discarded moves.
"""

import ctypes
import json
import statistics
import sys

import cudrv
from cudrv import call, cu

MOVES = ("gpu_to_host", "host_to_gpu_after_eviction", "host_to_gpu")


def main(argv=None) -> int:
    started = cudrv.link_benchmark("discard.py", __doc__, argv, 2, 512, "MiB per buffer", "timed rounds")
    if started is None:
        return 3
    args, gpu, size = started
    stream = call("cuStreamCreate", cu.CUstream_flags.CU_STREAM_NON_BLOCKING)
    live, dead = gpu.alloc(size, managed=True), gpu.alloc(size, managed=True)
    timed = cudrv.PrefetchTimer(gpu, stream)

    def write(ptr):
        gpu.host_touch(ptr, size)
        ctypes.memset(ptr, 1, size)

    def discard(ptr):
        call("cuMemDiscardBatchAsync", [cu.CUdeviceptr(ptr)], [size], 1, 0, stream)

    samples = {(move, kind): [] for move in MOVES for kind in ("live", "discarded")}
    counted = dict.fromkeys(MOVES, 0)
    for _ in range(args.rounds):
        for ptr, kind in ((live, "live"), (dead, "discarded")):
            write(ptr)
            gpu.prefetch(ptr, size, True, stream)
            if kind == "discarded":
                discard(ptr)
            gpu.synchronize(stream)
            for move, to_device in (("gpu_to_host", False), ("host_to_gpu_after_eviction", True)):
                before = gpu.fake_counters()
                samples[move, kind].append(timed(ptr, size, to_device))
                counted[move] += _moved(before, gpu.fake_counters()) if kind == "discarded" else 0
            write(ptr)
            gpu.prefetch(ptr, size, False, stream)
            if kind == "discarded":
                discard(ptr)
            gpu.synchronize(stream)
            before = gpu.fake_counters()
            samples["host_to_gpu", kind].append(timed(ptr, size, True))
            counted["host_to_gpu"] += _moved(before, gpu.fake_counters()) if kind == "discarded" else 0
    call("cuMemFree", live)
    call("cuMemFree", dead)
    doc = {"bytes": size, "rounds": args.rounds, "device": gpu.name}
    for move in MOVES:
        med = {kind: statistics.median(samples[move, kind]) for kind in ("live", "discarded")}
        doc[move] = {"live_seconds": med["live"], "discarded_seconds": med["discarded"],
                     "discarded_over_live": med["discarded"] / med["live"] if med["live"] > 0 else None}
        if gpu.fake:
            doc[move]["fakecuda_discarded_bytes_moved"] = counted[move]
    print(json.dumps(doc))
    return 0


def _moved(before: dict, after: dict) -> int:
    return sum(after[k] - before[k] for k in ("bytes_prefetched_h2d", "bytes_d2h") if k in after)


if __name__ == "__main__":
    sys.exit(main())
