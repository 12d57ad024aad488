#!/usr/bin/env python3
"""Which handle kind a program's launches carry (a CUkernel from cuLibraryGetKernel, or a
CUfunction from cuModuleGetFunction / cuKernelGetFunction) and what cuFuncGetParamInfo and
cuKernelGetParamInfo answer on each: issue 27 risk 3, on real PyTorch kernels.

    python bench/gpu/probes/handle_kind.py [--work DIR] [-- PROGRAM ARGS...]

Builds handle_kind.c (beside this file) as libcuda.so.1 in --work, finds the driver the
program would load, and runs the program (default: examples/train_gpt.py, 2 steps on the GPU,
whose AdamW runs PyTorch's multi_tensor_apply kernels) with the wrapper first on the library
path.  Prints one JSON line: launches per origin, per origin how many described handles each
call answered, the handles where cuFuncGetParamInfo accepted a CUkernel (undefined by cuda.h)
or the two calls' layouts differ, and the multi_tensor_apply kernels' parameters."""

import argparse
import ctypes
import json
import os
import pathlib
import subprocess
import sys
import tempfile

import probe

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parents[2]
DEFAULT_PROGRAM = [sys.executable, str(REPO / "examples" / "train_gpt.py"), "--device", "cuda", "--steps", "2",
                   "--json"]


def loaded_driver() -> str:
    """The path of the libcuda.so.1 this process loads (the one a program would)."""
    ctypes.CDLL("libcuda.so.1")
    for line in pathlib.Path("/proc/self/maps").read_text().splitlines():
        if line.endswith("libcuda.so.1") or "/libcuda.so" in line:
            return os.path.realpath(line.split(None, 5)[-1])
    raise RuntimeError("libcuda.so.1 loaded but not found in /proc/self/maps")


def build(work: pathlib.Path) -> pathlib.Path:
    headers = subprocess.run([sys.executable, str(REPO / "scripts" / "find-cuda-headers")], capture_output=True,
                             text=True, check=True).stdout.strip()
    out = work / "libcuda.so.1"
    subprocess.run([os.environ.get("CC", "cc"), "-std=c11", "-D_GNU_SOURCE", "-O2", "-Wall", "-Wextra", "-Werror",
                    "-shared", "-fPIC", "-fvisibility=hidden", f"-I{headers}", str(HERE / "handle_kind.c"),
                    "-Wl,-soname,libcuda.so.1", "-o", str(out), "-ldl", "-lpthread"], check=True)
    return out


def summarize(report: dict) -> dict:
    """The figures that answer risk 3, from the wrapper's report."""
    by_origin = {}
    accepted_cast, differ, multi_tensor = [], [], []
    for d in report["described"]:
        o = by_origin.setdefault(d["origin"], {"described": 0, "cuFuncGetParamInfo_ok": 0,
                                               "cuKernelGetParamInfo_ok": 0})
        o["described"] += 1
        func, kern = d["cuFuncGetParamInfo"], d.get("cuKernelGetParamInfo")
        o["cuFuncGetParamInfo_ok"] += func["first_result"] == 0
        o["cuKernelGetParamInfo_ok"] += bool(kern) and kern["first_result"] == 0
        if d["origin"] == "cuLibraryGetKernel" and func["first_result"] == 0:
            accepted_cast.append(d["name"])
            if kern and kern["params"] != func["params"]:
                differ.append(d["name"])
        if "multi_tensor_apply" in d["name"]:
            layout = kern if kern and kern["first_result"] == 0 else func
            multi_tensor.append({"name": d["name"][:120], "origin": d["origin"], "params": layout["params"],
                                 "largest_param_bytes": max((s for _, s in layout["params"]), default=0)})
    return {"launches_by_origin": report["launches_by_origin"], "made": report["made"], "by_origin": by_origin,
            "cuFuncGetParamInfo_accepted_a_CUkernel": accepted_cast[:20],
            "layouts_differ_between_the_calls": differ[:20], "multi_tensor_apply": multi_tensor[:8]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="handle_kind.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", help="where the wrapper is built (default a temporary folder)")
    ap.add_argument("program", nargs="*", help="the program to watch (default train_gpt.py, 2 steps on the GPU)")
    args = ap.parse_args(argv)
    try:  # the program's own check comes later; train_gpt.py's tiny preset peaks far below 1 GiB
        probe.membudget.check("handle_kind's program", probe.membudget.GiB, *probe.membudget.nvml_memory(0))
    except (probe.membudget.Refused, RuntimeError) as exc:
        probe.emit({"probe": "handle_kind", "refused_for_memory": str(exc)})
        return 3
    work = pathlib.Path(args.work or tempfile.mkdtemp(prefix="pump-handle-kind-"))
    work.mkdir(parents=True, exist_ok=True)
    driver = loaded_driver()
    wrapper = build(work)
    report_path = work / "handle_kind.json"
    env = dict(os.environ, HANDLE_PROBE_DRIVER=driver, HANDLE_PROBE_OUT=str(report_path),
               LD_LIBRARY_PATH=os.pathsep.join(filter(None, [str(wrapper.parent), os.environ.get("LD_LIBRARY_PATH")])))
    proc = subprocess.run(args.program or DEFAULT_PROGRAM, env=env, capture_output=True, text=True, timeout=300)
    doc = {"probe": "handle_kind", "driver": driver, "program_rc": proc.returncode}
    if proc.returncode != 0:
        doc["program_stderr"] = proc.stderr.strip().splitlines()[-5:]
    try:
        doc.update(summarize(json.loads(report_path.read_text())))
    except (OSError, ValueError) as exc:
        doc["finding"] = f"no report from the wrapper: {exc}"
    probe.emit(doc)
    return 0 if proc.returncode == 0 and "finding" not in doc else 1


if __name__ == "__main__":
    sys.exit(main())
