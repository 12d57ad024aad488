#!/usr/bin/env python3
"""The host time of one cuMemPrefetchAsync call, and which thread spends it: what fakecuda's
cost model charges as FAKECUDA_IOCTL_NS (the fixed part of one UVM_MIGRATE ioctl),
FAKECUDA_BLOCK_PASS_NS (per 2 MiB VA block per pass) and FAKECUDA_MIGRATE_BLOCK_NS (per 2 MiB
of pages moved), measured (the first H100 run's figures are fakecuda's now).

    python bench/gpu/probes/prefetch_cost.py [--blocks 1,4,16,64] [--rounds R]

For each size (in 2 MiB blocks) and round: a managed buffer already resident on the GPU is
prefetched to the GPU again (nothing moves: the pure pass), one resident on the host is
prefetched to the GPU, and one resident on the GPU to the host (the ioctl waits for those
copies: uvm_migrate.c).  Each call is timed on the host clock (perf_counter) with the calling
thread's CPU time (thread_time) and the process's (process_time) beside it, and the stream is
synchronised after.  Prints one JSON line: per case and size the medians in microseconds; for
the resident case fakecuda's line, fixed_us + blocks x passes x per_block_pass_us (two passes
when a range spans several blocks: fakecuda/cost.c); for the moving cases the time per
block moved beyond the resident call's (per_moved_block_us); and who spent the time:
"calling thread on CPU", "calling thread waiting" (in the kernel, off CPU), or "other
threads"; on fakecuda also the same lines from the modelled time charged to the calling thread
("fakecuda_charged", cudrv.Stopwatch's clock).  Refuses (exit 3) before allocating when the card cannot hold the largest buffer."""

import argparse
import ctypes
import statistics
import sys
import time

import probe
from cudrv import call, cu

BLOCK = 2 << 20
CASES = {"resident": True, "from host": True, "to host": False}  # case: prefetched to the GPU?


def fit(points):
    """(intercept, slope) of the least-squares line through (x, y) points."""
    n = len(points)
    mx, my = sum(x for x, _ in points) / n, sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    slope = sum((x - mx) * (y - my) for x, y in points) / sxx if sxx else 0.0
    return my - slope * mx, slope


def passes(blocks: int) -> int:
    """UVM_MIGRATE's passes over a range of `blocks` VA blocks (uvm_migrate.c: two when it spans several)."""
    return 2 if blocks > 1 else 1


def spender(wall, thread, process) -> str:
    if process - thread > 0.5 * wall:
        return "other threads"
    return "calling thread on CPU" if thread > 0.5 * wall else "calling thread waiting"


def lines(case: str, per_size: dict, resident, clock: str) -> dict:
    """The fitted line of a case on one clock: the resident call's fixed part and per block and
    pass; a moving case's time per block moved beyond the resident call's."""
    if case == "resident":
        fixed, per_pass = fit([(b * passes(b), v[clock]) for b, v in per_size.items()])
        return {"fixed_us": fixed, "per_block_pass_us": per_pass}
    if not resident:
        return {}
    return {"per_moved_block_us": fit([(b, v[clock] - resident[b][clock]) for b, v in per_size.items() if b in resident])[1]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="prefetch_cost.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--blocks", default="1,4,16,64", help="sizes in 2 MiB blocks (default 1,4,16,64)")
    ap.add_argument("--rounds", type=int, default=7, help="calls per case and size (default 7)")
    args = ap.parse_args(argv)
    sizes = sorted({int(b) for b in args.blocks.split(",")})
    if not sizes or sizes[0] < 1 or args.rounds < 1:
        ap.error("--blocks: positive integers; --rounds: at least 1")
    gpu, status = probe.start("prefetch_cost", sizes[-1] * BLOCK)
    if gpu is None:
        return status
    stream = call("cuStreamCreate", cu.CUstream_flags.CU_STREAM_NON_BLOCKING)
    doc = {"probe": "prefetch_cost", "rounds": args.rounds, "cases": {}}
    for case, to_gpu in CASES.items():
        per_size, who = {}, []
        for blocks in sizes:
            size = blocks * BLOCK
            ptr = probe.attempt(gpu.alloc, size, True)
            if not isinstance(ptr, int):
                doc["cases"][case] = {"finding": ptr}
                break
            samples = []
            for _ in range(args.rounds):
                gpu.host_touch(ptr, size)
                if case == "from host":
                    ctypes.memset(ptr, 1, size)     # its pages now live on the host
                    gpu.prefetch(ptr, size, False, stream)
                else:
                    gpu.prefetch(ptr, size, True, stream)
                gpu.synchronize(stream)
                c0, w0, t0, p0 = gpu.charged_ns(), time.perf_counter(), time.thread_time(), time.process_time()
                result = probe.attempt(gpu.prefetch, ptr, size, to_gpu, stream)
                wall, thread, process = (time.perf_counter() - w0, time.thread_time() - t0,
                                         time.process_time() - p0)
                charged = None if c0 is None else (gpu.charged_ns() - c0) * 1e-9
                gpu.synchronize(stream)
                if result != "ok":
                    doc["cases"][case] = {"finding": result}
                    break
                samples.append((wall, thread, process, charged))
                who.append(spender(wall, thread, process))
            call("cuMemFree", ptr)
            if case in doc["cases"]:
                break
            kinds = ("wall_us", "thread_cpu_us", "process_cpu_us") + (("charged_us",) if gpu.fake else ())
            per_size[blocks] = {k: statistics.median(s[i] for s in samples) * 1e6 for i, k in enumerate(kinds)}
        if case in doc["cases"]:
            continue
        doc["cases"][case] = {"per_size": per_size, "spent_by": max(set(who), key=who.count)}
        doc["cases"][case].update(lines(case, per_size, doc["cases"]["resident"].get("per_size"), "wall_us"))
        if gpu.fake:  # the model's own figures, exactly: what the tests check
            doc["cases"][case]["fakecuda_charged"] = lines(case, per_size, doc["cases"]["resident"].get("per_size"),
                                                           "charged_us")
    probe.emit(doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
