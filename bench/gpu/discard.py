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

import argparse
import ctypes
import json
import statistics
import sys

import cudrv
import membudget
from cudrv import call, cu

MOVES = ("gpu_to_host", "host_to_gpu_after_eviction", "host_to_gpu")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="discard.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--mib", type=int, default=512, help="MiB per buffer (default 512)")
    ap.add_argument("--rounds", type=int, default=5, help="timed rounds (default 5)")
    args = ap.parse_args(argv)
    if args.mib < 1 or args.rounds < 1:
        ap.error("--mib and --rounds must be at least 1")
    size = args.mib * membudget.MiB
    gpu = cudrv.Gpu()
    try:
        gpu.check_fits(f"discard.py (2 x {args.mib} MiB)", 2 * size)
    except membudget.Refused as exc:
        print(exc, file=sys.stderr)
        return 3
    stream = call("cuStreamCreate", cu.CUstream_flags.CU_STREAM_NON_BLOCKING)
    live, dead = gpu.alloc(size, managed=True), gpu.alloc(size, managed=True)
    start, end = call("cuEventCreate", 0), call("cuEventCreate", 0)

    def write(ptr):
        gpu.host_touch(ptr, size)
        ctypes.memset(ptr, 1, size)

    def discard(ptr):
        call("cuMemDiscardBatchAsync", [cu.CUdeviceptr(ptr)], [size], 1, 0, stream)

    def timed(ptr, to_device: bool) -> float:
        call("cuEventRecord", start, stream)
        gpu.prefetch(ptr, size, to_device, stream)
        call("cuEventRecord", end, stream)
        gpu.synchronize(stream)
        return float(call("cuEventElapsedTime", start, end)) * 1e-3

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
                samples[move, kind].append(timed(ptr, to_device))
                counted[move] += _moved(before, gpu.fake_counters()) if kind == "discarded" else 0
            write(ptr)
            gpu.prefetch(ptr, size, False, stream)
            if kind == "discarded":
                discard(ptr)
            gpu.synchronize(stream)
            before = gpu.fake_counters()
            samples["host_to_gpu", kind].append(timed(ptr, True))
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
