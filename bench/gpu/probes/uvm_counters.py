#!/usr/bin/env python3
"""CUPTI's Unified Memory counters on one managed round trip: bench/cupti/um_counters.c built
against the machine's CUPTI and injected into bench/gpu/prefetch_bw.py (256 MiB, 2 rounds),
an untimed run.  Says whether CUPTI gives the counters here (under gVisor it has refused
profiling) and what moved: bytes each way by cause, GPU page faults, thrashing.

    python bench/gpu/probes/uvm_counters.py [--work DIR]

Prints one JSON line: {"probe": "uvm_counters", "report"} or {"probe", "finding"} when CUPTI
is unavailable here (which is recorded, not failed)."""

import argparse
import pathlib
import subprocess
import sys
import tempfile

import probe  # noqa: F401  (bench/gpu on the path)
import cupti

HERE = pathlib.Path(__file__).resolve().parent


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="uvm_counters.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", help="where the injection library and its report go (default a temporary folder)")
    args = ap.parse_args(argv)
    work = pathlib.Path(args.work or tempfile.mkdtemp(prefix="pump-uvm-counters-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        library = cupti.build(work)
    except cupti.Unavailable as exc:
        probe.emit({"probe": "uvm_counters", "finding": f"CUPTI unavailable: {exc}"})
        return 0
    report = work / "report.json"
    proc = subprocess.run([sys.executable, str(HERE.parent / "prefetch_bw.py"), "--mib", "256", "--rounds", "2"],
                          env=dict(__import__("os").environ, **cupti.env(library, str(report))),
                          capture_output=True, text=True, timeout=120)
    if proc.returncode == 3:
        probe.emit({"probe": "uvm_counters", "refused_for_memory": proc.stderr.strip()})
        return 3
    doc = {"probe": "uvm_counters", "program_rc": proc.returncode, "report": cupti.read(str(report))}
    if proc.returncode != 0:
        doc["program_stderr"] = proc.stderr.strip().splitlines()[-5:]
    probe.emit(doc)
    return 0 if proc.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
