"""CuPy programs under pump (issue 5, item 4), on a real GPU only.

CuPy cannot run on fakecuda: it goes through the CUDA runtime, which asks the driver for
entry points fakecuda does not model (cudaErrorCallRequiresNewerDriver on the first
call), and its elementwise kernels are compiled by NVRTC.  So these tests are `gpu`-marked
and need CuPy installed (`pip install 'cupy-cuda13x[ctk]'`; not in the test extra).

This file is also the program: `python tests/test_cupy.py managed|default` runs an
elementwise kernel over CuPy arrays for a few steps and prints one JSON line.  "managed"
allocates through a CuPy memory pool over cupy.cuda.malloc_managed; "default" through
CuPy's default pool (cudaMalloc), which pump-run's managed_all turns into managed memory.
"""

import json
import os
import subprocess
import sys

import pytest

from helpers import PUMP_RUN, clean_env, needs_gpu

MiB = 1 << 20
BUFFER_MIB, STEPS = 64, 5


def job(allocator):
    import cupy
    import numpy as np

    if allocator == "managed":
        cupy.cuda.set_allocator(cupy.cuda.MemoryPool(cupy.cuda.malloc_managed).malloc)
    axpb = cupy.ElementwiseKernel("float32 x", "float32 y", "y = fmaf(x, 2.0f, 1.0f)", "pump_axpb")
    n = BUFFER_MIB * MiB // 4
    host = (np.arange(n) % 251 / 8).astype(np.float32)  # exact in float32, and stays exact
    x = cupy.asarray(host)
    want = host.copy()
    for _ in range(STEPS):
        x = axpb(x)
        want = want * np.float32(2) + np.float32(1)
    got = cupy.asnumpy(x)
    print(json.dumps({"correct": bool(np.array_equal(got, want)), "checksum": got.astype(np.float64).sum().hex()}),
          flush=True)


def run_job(allocator, *pump_run):
    proc = subprocess.run([*pump_run, sys.executable, os.path.abspath(__file__), allocator], env=clean_env(),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"rc={proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    result = json.loads(proc.stdout.splitlines()[-1])
    assert result["correct"], result
    return result


def pump_run_totals(allocator, tmp_path, *options):
    stats_file = tmp_path / "stats.json"
    result = run_job(allocator, PUMP_RUN, "--stats", str(stats_file), *options)
    return result, json.loads(stats_file.read_text())["totals"]


@pytest.fixture(scope="module", autouse=True)
def cupy_installed():
    pytest.importorskip("cupy")


@needs_gpu
def test_managed_pool_under_pump_run(tmp_path):
    bare = run_job("managed")
    result, totals = pump_run_totals("managed", tmp_path)
    assert result["checksum"] == bare["checksum"]
    assert totals["launches_managed"] >= STEPS, totals  # CuPy's launches seen, on managed memory
    assert totals["prefetch_bytes"] >= BUFFER_MIB * MiB, totals


@needs_gpu
def test_default_pool_becomes_managed_under_managed_all(tmp_path):
    bare = run_job("default")
    result, totals = pump_run_totals("default", tmp_path)
    assert result["checksum"] == bare["checksum"]
    assert totals["launches_managed"] >= STEPS, totals  # cudaMalloc'd arrays are managed now
    result, totals = pump_run_totals("default", tmp_path, "--no-managed-all")
    assert result["checksum"] == bare["checksum"]
    assert totals["launches"] >= STEPS and totals["launches_managed"] == 0, totals


if __name__ == "__main__":
    job(sys.argv[1])
