#!/usr/bin/env python3
"""The link's measured prefetch bandwidth, the denominator of the GPU suite's lower bound.

    python bench/gpu/prefetch_bw.py [--mib M] [--rounds R]

Allocates M MiB of managed memory (refused, before allocating, when the GPU cannot hold it with
membudget's margin), writes it from the host (so it starts on the host), then R times: prefetches
it to the GPU with cuMemPrefetchAsync, timed with events, and back to the host, timed the same
way.  Prints one JSON object: {"bytes", "h2d_bytes_per_s", "d2h_bytes_per_s" (medians),
"h2d_samples", "d2h_samples" (bytes/s per round), "device"}.
"""

import argparse
import ctypes
import json
import statistics
import sys

import cudrv
import membudget
from cudrv import call, cu


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="prefetch_bw.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--mib", type=int, default=1024, help="MiB to move each way (default 1024)")
    ap.add_argument("--rounds", type=int, default=5, help="timed round trips (default 5)")
    args = ap.parse_args(argv)
    if args.mib < 1 or args.rounds < 1:
        ap.error("--mib and --rounds must be at least 1")
    size = args.mib * membudget.MiB
    gpu = cudrv.Gpu()
    try:
        gpu.check_fits(f"prefetch_bw.py ({args.mib} MiB)", size)
    except membudget.Refused as exc:
        print(exc, file=sys.stderr)
        return 3
    stream = call("cuStreamCreate", cu.CUstream_flags.CU_STREAM_NON_BLOCKING)
    ptr = gpu.alloc(size, managed=True)
    gpu.host_touch(ptr, size)
    ctypes.memset(ptr, 1, size)
    start, end = call("cuEventCreate", 0), call("cuEventCreate", 0)

    def timed(to_device: bool) -> float:
        call("cuEventRecord", start, stream)
        gpu.prefetch(ptr, size, to_device, stream)
        call("cuEventRecord", end, stream)
        gpu.synchronize(stream)
        return size / (float(call("cuEventElapsedTime", start, end)) * 1e-3)

    h2d, d2h = [], []
    for _ in range(args.rounds):
        h2d.append(timed(True))
        d2h.append(timed(False))
    call("cuMemFree", ptr)
    print(json.dumps({"bytes": size, "h2d_bytes_per_s": statistics.median(h2d),
                      "d2h_bytes_per_s": statistics.median(d2h), "h2d_samples": h2d, "d2h_samples": d2h,
                      "device": gpu.name}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
