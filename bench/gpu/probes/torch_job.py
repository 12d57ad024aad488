#!/usr/bin/env python3
"""A real PyTorch job under pump-run: examples/train_gpt.py without pump and under `pump-run
--stats`, compared bit for bit (every step's loss and the parameters' checksum), with pump's
counters, hook coverage among them (whatever keys of pump's stats name hooks, procaddr lookups
or coverage).

    python bench/gpu/probes/torch_job.py [--device cuda] [--steps N] [--preset tiny]

Refuses (exit 3) when NVML says the card cannot hold 1 GiB with membudget's margin (the tiny
preset peaks far below).  Prints one JSON line: {"probe": "torch_job", "identical", "mismatch",
"seconds" (bare, pump), "pump" (pump's totals), "coverage" (the coverage keys), "coverage_findings"}:
it fails (exit 1) when the runs differ or, on a GPU, no launch reached pump or a lookup went
unmatched."""

import argparse
import json
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time

import probe
from membudget import GiB

REPO = pathlib.Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "bench" / "gpu"))
import suite  # noqa: E402  (output parsing and the bit-identity check)

COVERAGE_WORDS = ("coverage", "procaddr", "hook", "unmatched", "passthrough", "lookups")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="torch_job.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"), help="train_gpt.py's device (default cuda)")
    ap.add_argument("--steps", type=int, default=6, help="timed steps (default 6)")
    ap.add_argument("--preset", default="tiny", help="train_gpt.py's preset (default tiny)")
    args = ap.parse_args(argv)
    try:
        probe.membudget.check("torch_job (train_gpt.py)", GiB, *probe.membudget.nvml_memory(0))
    except (probe.membudget.Refused, RuntimeError) as exc:
        probe.emit({"probe": "torch_job", "refused_for_memory": str(exc)})
        return 3
    program = [sys.executable, str(REPO / "examples" / "train_gpt.py"), "--preset", args.preset, "--device",
               args.device, "--steps", str(args.steps), "--warmup", "1", "--json", "--no-demo"]
    pump_run = shutil.which("pump-run", path=str(pathlib.Path(sys.executable).parent)) or shutil.which("pump-run")
    if pump_run is None:
        probe.emit({"probe": "torch_job", "finding": "pump-run is not installed (gpu-check's preflight installs it)"})
        return 1
    stats = pathlib.Path(tempfile.mkdtemp(prefix="pump-torch-job-")) / "stats.json"
    doc = {"probe": "torch_job", "device": args.device, "seconds": {}}
    runs = {}
    for name, argv in (("bare", program), ("pump", [pump_run, "--stats", str(stats), "--", *program])):
        t0 = time.monotonic()
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=240, cwd=REPO)
        doc["seconds"][name] = round(time.monotonic() - t0, 2)
        steps, final, _ = suite.parse_output(proc.stdout)
        runs[name] = {"steps": steps, "final": final}
        if proc.returncode != 0:
            doc[f"{name}_error"] = f"exit status {proc.returncode}: " + " | ".join(proc.stderr.strip().splitlines()[-4:])
        doc[f"{name}_stderr_tail"] = proc.stderr.strip().splitlines()[-3:]
    doc["identical"], doc["mismatch"] = suite.compare(runs["bare"], runs["pump"])
    try:
        totals = json.loads(stats.read_text())["totals"]
    except (OSError, ValueError, KeyError) as exc:
        totals = {"error": f"no pump stats: {exc}"}
    doc["pump"] = {k: totals[k] for k in suite.PUMP_FIELDS if k in totals}
    doc["coverage"] = {k: v for k, v in totals.items() if any(w in k for w in COVERAGE_WORDS)}
    # On a GPU PyTorch launches kernels: none reaching pump's hooks, or a hooked name answered with
    # a pointer pump cannot match, is a silent pass-through (issue 27 risk 4).
    findings = []
    if args.device == "cuda" and not totals.get("launches"):
        findings.append("no kernel launch reached pump's hooks: pump passed the job by")
    if totals.get("procaddr_unmatched"):
        findings.append(f"{totals['procaddr_unmatched']} cuGetProcAddress answers pump could not match to its hooks")
    doc["coverage_findings"] = findings
    probe.emit(doc)
    ok = doc["identical"] and not findings and "bare_error" not in doc and "pump_error" not in doc
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
