#!/usr/bin/env python3
"""measure_kineto.py: where fakecuda_model.h's host costs of runtime calls come from. Reads
real PyTorch profiler (Kineto) traces taken on A100 GPUs and prints, per trace, the count and
the median host duration (us) of each CUDA runtime call that fakecuda charges for.

    python3 fakecuda/measure_kineto.py [TRACE.json.gz ...]

Without arguments it reads the traces in ../shared/data/kineto/ beside the checkout.
Durations in these traces have 1 us resolution (some files 0.5 us), so a median of 0 means
"below 1 us"."""

import gzip
import json
import pathlib
import statistics
import sys

CALLS = ("cudaLaunchKernel", "cudaGraphLaunch", "cudaEventRecord", "cudaStreamWaitEvent", "cudaEventQuery",
         "cudaStreamQuery", "cudaStreamIsCapturing", "cudaStreamGetCaptureInfo", "cudaPointerGetAttributes",
         "cudaStreamSynchronize", "cudaMemGetInfo", "cudaMemPrefetchAsync", "cudaMemcpyAsync", "cudaMemsetAsync",
         "cudaMemcpy", "cudaMemset")
# ../shared beside the checkout (/work/main) or beside the worktrees' directory (/work/wt/NAME).
_ROOT = pathlib.Path(__file__).resolve().parents[1]
DEFAULT_DIR = next((d for d in (_ROOT.parent / "shared/data/kineto", _ROOT.parent.parent / "shared/data/kineto")
                    if d.is_dir()), _ROOT.parent / "shared/data/kineto")


def host_durations(path):
    """{call name: [durations in us]} of the trace's cuda_runtime events."""
    with gzip.open(path, "rt") as f:
        trace = json.load(f)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    out = {}
    for e in events:
        if e.get("cat") == "cuda_runtime" and "dur" in e:
            out.setdefault(e["name"], []).append(float(e["dur"]))
    device = (trace.get("deviceProperties") or [{}])[0].get("name", "?") if isinstance(trace, dict) else "?"
    return device, out


def main(argv):
    paths = [pathlib.Path(a) for a in argv] or sorted(DEFAULT_DIR.glob("*.json.gz"))
    if not paths:
        sys.exit(f"measure_kineto: no traces given and none in {DEFAULT_DIR}")
    for path in paths:
        try:
            device, calls = host_durations(path)
        except (OSError, ValueError, KeyError) as exc:
            sys.exit(f"measure_kineto: {path}: not a readable Kineto trace ({exc})")
        print(f"{path.name} ({device})")
        for name in CALLS:
            durations = calls.get(name)
            if durations:
                print(f"  {name:28} {len(durations):7,d} calls  median {statistics.median(durations):6.1f} us")
            else:
                print(f"  {name:28}       - (not in this trace)")


if __name__ == "__main__":
    main(sys.argv[1:])
