#!/usr/bin/env python3
"""CUPTI's Unified Memory counters on one managed round trip: bench/cupti/um_counters.c built
against the machine's CUPTI and injected into bench/gpu/prefetch_bw.py (256 MiB, 2 rounds),
an untimed run.  Says whether CUPTI gives the counters here (under gVisor it has refused
profiling) and what moved: bytes each way by cause, GPU page faults, thrashing.

    python bench/gpu/probes/uvm_counters.py [--work DIR]

Prints one JSON line: {"probe": "uvm_counters", "program_rc", "report"}, or {"probe",
"finding"} when CUPTI is unavailable here or the program ran on fakecuda (which loads no
injection library): recorded, not failed.  When CUPTI is here but gave no counters (it refused
them, or wrote no report) the line has "failure" and the probe exits 1: its zeros were never
counted, and must not pass for a measurement."""

import argparse
import ctypes
import os
import pathlib
import subprocess
import sys
import tempfile

import probe  # noqa: F401  (bench/gpu on the path)
import cupti

HERE = pathlib.Path(__file__).resolve().parent


def on_fakecuda() -> bool:
    """Whether the libcuda.so.1 a program here loads is fakecuda (the dry run): it has
    fakecuda's extras, and it loads no CUDA_INJECTION64_PATH library."""
    try:
        return hasattr(ctypes.CDLL("libcuda.so.1"), "fakecuda_register_kernel")
    except OSError:
        return False


def judge(program_rc: int, report: dict, fake: bool):
    """(the probe's line, its exit status) for a finished counter run and cupti.read's report."""
    doc = {"probe": "uvm_counters", "program_rc": program_rc, "report": report}
    if program_rc != 0:
        return doc, 1
    if "error" in report:
        if fake and not cupti.refused(report):
            doc["finding"] = f"on fakecuda, which loads no CUPTI injection library: {report['error']}"
            return doc, 0
        doc["failure"] = f"CUPTI is here but gave no Unified Memory counters: {report['error']}"
        return doc, 1
    return doc, 0


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
    report.unlink(missing_ok=True)   # a report left by an earlier run must not stand for this one
    proc = subprocess.run([sys.executable, str(HERE.parent / "prefetch_bw.py"), "--mib", "256", "--rounds", "2"],
                          env=dict(os.environ, **cupti.env(library, str(report))),
                          capture_output=True, text=True, timeout=120)
    if proc.returncode == 3:
        probe.emit({"probe": "uvm_counters", "refused_for_memory": proc.stderr.strip()})
        return 3
    doc, rc = judge(proc.returncode, cupti.read(str(report)), on_fakecuda())
    if proc.returncode != 0:
        doc["program_stderr"] = proc.stderr.strip().splitlines()[-5:]
    probe.emit(doc)
    if "failure" in doc:
        print(f"uvm_counters: {doc['failure']}", file=sys.stderr)
    return rc


if __name__ == "__main__":
    sys.exit(main())
