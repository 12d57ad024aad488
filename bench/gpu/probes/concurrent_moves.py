#!/usr/bin/env python3
"""Whether a prefetch to the GPU and a prefetch to the host, made by two threads at once, overlap
on the driver at hand: what decides if pump's worker should make its evictions on a thread of
their own. A move to the host waits inside its call for its copies (uvm_migrate.c), so on one
thread every planned prefetch behind an eviction waits for that copy; in `pump simulate`'s best
case that one thread is most of lookahead's step (docs/limits.md). A second thread pays only if
the driver runs the two calls side by side (both take the va_space lock for reading; their
copies take opposite directions of the link). It does not: on an H100 and two H200s the two took
turns (overlap 0.05, -0.13, -0.11: bench/results/gpu-2026112*/preflight.json), and fakecuda
books every prefetch's copies on one timeline so (fakecuda/cost.c, fc_charge_copies).

    python bench/gpu/probes/concurrent_moves.py [--mib M] [--rounds R]

Two managed buffers of M MiB each, written on the host. Per round: `out` (the first resident
on the GPU, prefetched to the host on one stream, the call and its stream timed), `in` (the
second on the host, prefetched to the GPU on another stream, timed alike), and `together` (both
at once, from two threads released together, timed until both streams are done); the buffers
are put back between the timings, outside them. Prints one JSON line: the medians, and
`overlap`: (out + in - together) / min(out, in), 0 when the two calls take turns, 1 when the
shorter hides wholly under the longer."""

import statistics
import sys
import threading
import time

import probe
from cudrv import call, cu

MiB = 1 << 20


def timed(*moves) -> float:
    """Seconds until every move (a function making a call and waiting for its stream) is done,
    each made on its own thread, all released at once."""
    start = threading.Barrier(len(moves) + 1)
    errors = []

    def run(move):
        start.wait()
        try:
            move()
        except Exception as exc:  # noqa: BLE001 (raised again on the main thread)
            errors.append(exc)
    threads = [threading.Thread(target=run, args=(move,)) for move in moves]
    for t in threads:
        t.start()
    start.wait()
    began = time.perf_counter()
    for t in threads:
        t.join()
    seconds = time.perf_counter() - began
    if errors:
        raise errors[0]
    return seconds


def main(argv=None) -> int:
    args = probe.sized_args("concurrent_moves.py", __doc__, argv, 512, "MiB of each of the two buffers", 2)
    size = args.mib * MiB
    gpu, status = probe.start("concurrent_moves", 2 * size)
    if gpu is None:
        return status
    doc = {"probe": "concurrent_moves", "bytes_each": size, "rounds": args.rounds}
    buffers = []
    try:
        with probe.measuring(doc, buffers):
            streams = [call("cuStreamCreate", cu.CUstream_flags.CU_STREAM_NON_BLOCKING) for _ in range(2)]
            for _ in range(2):
                buffers.append(gpu.alloc(size, True))
                gpu.host_touch(buffers[-1], size)
            leaving, arriving = buffers

            def move(ptr, to_device, stream):
                def made():
                    gpu.prefetch(ptr, size, to_device, stream)
                    gpu.synchronize(stream)
                return made
            out, into = move(leaving, False, streams[0]), move(arriving, True, streams[1])
            put_back = (move(leaving, True, streams[0]), move(arriving, False, streams[1]))
            samples = {"out": [], "in": [], "together": []}
            for _ in range(args.rounds):
                for name, moves in (("out", (out,)), ("in", (into,)), ("together", (out, into))):
                    for made in put_back:
                        made()
                    samples[name].append(timed(*moves))
            median = {name: statistics.median(s) for name, s in samples.items()}
            doc.update({f"{name}_seconds": m for name, m in median.items()},
                       samples_seconds=samples,
                       overlap=(median["out"] + median["in"] - median["together"]) / min(median["out"], median["in"]))
    except probe.membudget.Refused as exc:
        doc["refused_for_memory"] = str(exc)
    probe.emit(doc)
    return 3 if "refused_for_memory" in doc else 0 if "finding" not in doc else 1


if __name__ == "__main__":
    sys.exit(main())
