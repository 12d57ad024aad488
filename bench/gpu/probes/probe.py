"""What the single-purpose probes of scripts/gpu-check share: bench/gpu on the import path, one
JSON line out, and a driver call whose refusal is a finding, not a crash (under gVisor the H200
kind may refuse managed memory or cuMemAdvise: issue 27 risk 6)."""

import argparse
import contextlib
import json
import os
import pathlib
import subprocess
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import cudrv  # noqa: E402,F401  (re-exported for the probes)
import membudget  # noqa: E402,F401


def busy_kernels(ap) -> None:
    """--busy K, for sized_args' more: kernels that keep a stream busy before the probed call."""
    ap.add_argument("--busy", type=int, default=200, help="kernels that keep the stream busy first (default 200)")


def as_floats(ptr: int, n: int):
    """The n floats at host address ptr (managed memory the host may touch), as a numpy array."""
    import ctypes

    import numpy as np
    return np.ctypeslib.as_array((ctypes.c_float * n).from_address(ptr))


def sized_args(prog: str, doc: str, argv, mib: int, mib_help: str, least_mib: int, more=None):
    """A probe's --mib (at least least_mib) and --rounds (at least 1, default 5), parsed, and
    what more(parser) adds."""
    ap = argparse.ArgumentParser(prog=prog, description=doc.split("\n\n")[0])
    ap.add_argument("--mib", type=int, default=mib, help=f"{mib_help} (default {mib})")
    ap.add_argument("--rounds", type=int, default=5, help="rounds (default 5)")
    if more is not None:
        more(ap)
    args = ap.parse_args(argv)
    if args.mib < least_mib or args.rounds < 1:
        ap.error(f"--mib: at least {least_mib}; --rounds: at least 1")
    return args


def emit(doc: dict) -> None:
    """The probe's one line."""
    print(json.dumps(doc, default=str), flush=True)


def attempt(fn, *args):
    """"ok" (or fn's value when it gives one), or the refusal as text: the CUresult's name, or
    that this driver lacks the call (cuda-bindings' FunctionNotFoundError, a RuntimeError)."""
    try:
        value = fn(*args)
    except (cudrv.CudaError, RuntimeError) as exc:
        return f"refused: {type(exc).__name__}: {exc}"
    return "ok" if value is None else value


def refused(result) -> bool:
    return isinstance(result, str) and result.startswith("refused")


def start(name: str, request_bytes: int):
    """Device 0 and the free-memory check for request_bytes of managed memory: (gpu, None), or
    (None, exit status) after emitting why not (3: refused for memory, 0: the driver refused to
    start, which is itself the finding)."""
    try:
        gpu = cudrv.Gpu()
    except cudrv.CudaError as exc:
        emit({"probe": name, "finding": f"the driver refused to start: {exc}"})
        return None, 0
    try:
        gpu.check_fits(name, request_bytes)
    except membudget.Refused as exc:
        emit({"probe": name, "refused_for_memory": str(exc)})
        return None, 3
    return gpu, None


@contextlib.contextmanager
def measuring(doc: dict, buffers: list):
    """A probe's body: a driver call refused there is the doc's finding, and the memory in
    `buffers` (appended as it is allocated) is freed whatever happens."""
    try:
        yield
    except cudrv.CudaError as exc:
        doc["finding"] = str(exc)
    finally:
        for ptr in buffers:
            cudrv.call("cuMemFree", ptr)


def cc() -> str:
    """The C compiler a probe is built with ($CC, else cc)."""
    return os.environ.get("CC", "cc")


def compile_c(*args) -> None:
    """A probe's C, built as the shim is (C11, warnings as errors) against the registry's cuda.h
    (scripts/find-cuda-headers); args: the sources, outputs and link options."""
    finder = pathlib.Path(__file__).resolve().parents[3] / "scripts" / "find-cuda-headers"
    headers = subprocess.run([sys.executable, str(finder)], capture_output=True, text=True, check=True).stdout.strip()
    subprocess.run([cc(), "-std=c11", "-D_GNU_SOURCE", "-O2", "-Wall", "-Wextra", "-Werror", f"-I{headers}",
                    *map(str, args)], check=True)
