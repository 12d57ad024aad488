#!/usr/bin/env python3
"""The GPU suite's kernel chain (workloads a and b): a cuda-python program whose input buffers
the host writes every step, as a data loader does.

    python bench/gpu/chain.py --memory managed|device [--pairs K] [--mib S] [--repeat R]
                              [--steps N] [--warmup W] [--graph]

K pairs of buffers (x_k, y_k), S MiB each.  Every step the host writes every x_k (a different
pattern on odd and even steps), then for each pair R rounds of saxpy (y = 2x + y) and scale
(y *= 0.5) run on one stream, and the step synchronises.  --memory managed: the buffers are
managed memory and the host writes x_k in place (what pump prefetches); --memory device: plain
device memory, the host writes pinned buffers and copies them with cuMemcpyHtoDAsync (the
"ideal" variant: the same bytes moved explicitly).  --graph captures a step's kernels into a
CUDA graph once and replays it every step.

Prints one JSON object per step, {"step", "warmup", "ms" (host clock over the whole step),
"host_ms" (host clock over the host's writes, and for device memory the copies' enqueueing),
"kernel_ms" (events around its kernels, which start after the copies)}, then one final object: {"steps", "checksum_hex"
(SHA-256 of every y_k's bytes at the end: equal across variants when results are
bit-identical), "memory", "graph", "device", "working_set_bytes",
"host_written_bytes_per_step", "buffers" [{"address", "bytes", "host_written"}], "fakecuda"
(its counters; {} on a GPU)}.  Refuses, before allocating, a working set the GPU cannot hold
(membudget).  Without a GPU it runs on fakecuda when LD_LIBRARY_PATH points there.
"""

import argparse
import ctypes
import hashlib
import json
import sys
import time

import numpy as np

import cudrv
import membudget
from cudrv import call, cu

PATTERN_BYTES = 1 << 20


def pattern(seed: int) -> np.ndarray:
    """1 MiB of float32, multiples of 1/8 (exact), tiled over a buffer by write()."""
    return ((np.arange(PATTERN_BYTES // 4) * seed) % 251 / 8).astype(np.float32)


def write(ptr: int, size: int, pat: np.ndarray) -> None:
    src = pat.ctypes.data
    for off in range(0, size, PATTERN_BYTES):
        ctypes.memmove(ptr + off, src, min(PATTERN_BYTES, size - off))


def parse_args(argv=None):
    ap = argparse.ArgumentParser(prog="chain.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--memory", choices=("managed", "device"), required=True)
    ap.add_argument("--pairs", type=int, default=4, help="buffer pairs (default 4)")
    ap.add_argument("--mib", type=int, default=64, help="MiB per buffer (default 64)")
    ap.add_argument("--repeat", type=int, default=4, help="saxpy+scale rounds per pair per step (default 4)")
    ap.add_argument("--steps", type=int, default=10, help="timed steps (default 10)")
    ap.add_argument("--warmup", type=int, default=2, help="steps before them, reported as warm-up (default 2)")
    ap.add_argument("--graph", action="store_true", help="replay a captured CUDA graph of a step's kernels")
    args = ap.parse_args(argv)
    for name in ("pairs", "mib", "repeat", "steps"):
        if getattr(args, name) < 1:
            ap.error(f"--{name} {getattr(args, name)}: must be at least 1")
    if args.warmup < 0:
        ap.error(f"--warmup {args.warmup}: must be 0 or more")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    size = args.mib * membudget.MiB
    n = size // 4
    managed = args.memory == "managed"
    gpu = cudrv.Gpu()
    try:
        gpu.check_fits(f"chain.py ({args.pairs} pairs of {args.mib} MiB, {args.memory})", 2 * args.pairs * size)
    except membudget.Refused as exc:
        print(exc, file=sys.stderr)
        return 3
    stream = call("cuStreamCreate", cu.CUstream_flags.CU_STREAM_NON_BLOCKING)
    xs = [gpu.alloc(size, managed) for _ in range(args.pairs)]
    ys = [gpu.alloc(size, managed) for _ in range(args.pairs)]
    staging = [] if managed else [gpu.host_alloc(size) for _ in range(args.pairs)]
    patterns = (pattern(1), pattern(5))

    def host_write(k: int, dst: int, pat) -> None:
        """The host's write of one buffer: in place (managed), else through pinned memory."""
        if managed:
            gpu.host_touch(dst, size)
            write(dst, size, pat)
        else:
            write(staging[k], size, pat)
            call("cuMemcpyHtoDAsync", dst, staging[k], size, stream)

    for k, y in enumerate(ys):
        host_write(k, y, pattern(3))
    gpu.synchronize(stream)

    def kernels() -> None:
        for x, y in zip(xs, ys):
            for _ in range(args.repeat):
                gpu.launch("saxpy", n, stream, ctypes.c_float(2.0), ctypes.c_uint64(x), ctypes.c_uint64(y),
                           ctypes.c_uint64(n))
                gpu.launch("scale", n, stream, ctypes.c_uint64(y), ctypes.c_float(0.5), ctypes.c_uint64(n))

    graph_exec = None
    if args.graph:
        call("cuStreamBeginCapture", stream, cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_GLOBAL)
        kernels()
        graph = call("cuStreamEndCapture", stream)
        graph_exec = call("cuGraphInstantiate", graph, 0)
    start, end = call("cuEventCreate", 0), call("cuEventCreate", 0)

    for step in range(args.warmup + args.steps):
        t0 = time.perf_counter()
        for k, x in enumerate(xs):
            host_write(k, x, patterns[step % 2])
        host_ms = (time.perf_counter() - t0) * 1e3
        call("cuEventRecord", start, stream)
        if graph_exec is not None:
            call("cuGraphLaunch", graph_exec, stream)
        else:
            kernels()
        call("cuEventRecord", end, stream)
        gpu.synchronize(stream)
        ms = (time.perf_counter() - t0) * 1e3
        print(json.dumps({"step": step, "warmup": step < args.warmup, "ms": ms, "host_ms": host_ms,
                          "kernel_ms": float(call("cuEventElapsedTime", start, end))}), flush=True)

    digest = hashlib.sha256()
    readback = gpu.host_alloc(size) if not managed else None
    for y in ys:
        if managed:
            gpu.host_touch(y, size)
            digest.update(ctypes.string_at(y, size))
        else:
            call("cuMemcpyDtoH", readback, y, size)
            digest.update(ctypes.string_at(readback, size))
    print(json.dumps({
        "steps": args.steps, "warmup": args.warmup, "checksum_hex": digest.hexdigest(),
        "memory": args.memory, "graph": args.graph, "device": gpu.name,
        "working_set_bytes": 2 * args.pairs * size, "host_written_bytes_per_step": args.pairs * size,
        "buffers": [{"address": p, "bytes": size, "host_written": p in xs} for p in xs + ys],
        "fakecuda": gpu.fake_counters()}), flush=True)
    for p in xs + ys:
        call("cuMemFree", p)
    for p in staging + ([readback] if readback else []):
        call("cuMemFreeHost", p)
    return 0


if __name__ == "__main__":
    sys.exit(main())
