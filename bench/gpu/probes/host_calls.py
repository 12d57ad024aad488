#!/usr/bin/env python3
"""The host time of each driver call pump makes around a launch (cuEventRecord,
cuStreamWaitEvent, cuStreamIsCapturing, cuThreadExchangeStreamCaptureMode, the queries) and of
the launch itself, on this machine's driver: fakecuda charges them figures from A100 profiler
traces at a 1 us resolution (fakecuda/fakecuda_model.h), and under a budget they are most
of what pump adds to the launching thread (scripts/bench-steady).

    python bench/gpu/probes/host_calls.py [--work DIR] [--rounds R] [--per-round N]

Builds host_calls.c (beside this file) with the registry's cuda.h and runs it; it times each
call in rounds of N back-to-back calls on one thread and prints the median and smallest round,
in ns per call.  Prints one JSON line.  Allocates one 2 MiB managed buffer."""

import argparse
import json
import pathlib
import subprocess
import sys
import tempfile

import probe

HERE = pathlib.Path(__file__).resolve().parent


def build(work: pathlib.Path) -> pathlib.Path:
    out = work / "host_calls"
    probe.compile_c(HERE / "host_calls.c", "-o", out, "-ldl")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="host_calls.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", help="where the program is built (default a temporary folder)")
    ap.add_argument("--rounds", type=int, default=21, help="rounds per call (default 21)")
    ap.add_argument("--per-round", type=int, default=256, help="calls per round, at most 512 (default 256)")
    args = ap.parse_args(argv)
    gpu, status = probe.start("host_calls", 2 << 20)
    if gpu is None:
        return status
    work = pathlib.Path(args.work or tempfile.mkdtemp(prefix="pump-host-calls-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        program = build(work)
        proc = subprocess.run([str(program), str(args.rounds), str(args.per_round)], capture_output=True, text=True,
                              timeout=240)
    except (OSError, subprocess.SubprocessError) as exc:
        probe.emit({"probe": "host_calls", "finding": f"host_calls.c could not be built or run: {exc}"})
        return 1
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        probe.emit({"probe": "host_calls", "finding": f"host_calls exited {proc.returncode}",
                    "output": (proc.stdout + proc.stderr).strip().splitlines()[-5:]})
        return 1
    doc = json.loads(lines[-1])
    probe.emit(doc)
    return 0 if "finding" not in doc else 1


if __name__ == "__main__":
    sys.exit(main())
