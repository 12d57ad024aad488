"""cuda-python programs under pump: their managed allocations and kernel launches go
through the same driver entry points that pump hooks (issue 5, item 4).

This file is also the program: `python tests/test_cuda_python.py` runs a cuda-python job
(cuda.bindings.driver: cuInit, cuMemAllocManaged, cuLaunchKernel on a PTX module) and
prints one JSON line.  Its kernel is examples/managed_saxpy.py's `scale`: on fakecuda
(build/tests/plain on LD_LIBRARY_PATH) a host function registered by name through fakecuda's
test API, on a GPU the PTX.
The tests run it bare, under pump-run and under pump-run --policy off, and compare.
"""

import ctypes
import json
import os
import pathlib
import subprocess
import sys

import pytest

from helpers import PUMP_RUN, clean_env, needs_gpu

# The job's kernel (scale: x *= s), its PTX and, on fakecuda, its host function and the
# counters' layout: the example's (importing it has no side effects).
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "examples"))
import managed_saxpy  # noqa: E402

MiB = 1 << 20
BUFFER_MIB, STEPS = 4, 3
PAGE = 64 << 10  # fakecuda's migration page: one GPU fault per page a kernel finds missing

# ---- the cuda-python job ----------------------------------------------------------------

def check(result):
    """cuda-python returns (CUresult, values...): the values, or exit naming the error."""
    from cuda.bindings import driver
    err, *values = result if isinstance(result, tuple) else (result,)
    if err != driver.CUresult.CUDA_SUCCESS:
        sys.exit(f"cuda-python job: {err!r}")
    return values[0] if len(values) == 1 else values


def job():
    import numpy as np
    from cuda.bindings import driver

    check(driver.cuInit(0))
    lib = ctypes.CDLL("libcuda.so.1")  # the driver cuda-python loaded
    fake = hasattr(lib, "fakecuda_register_kernel")
    if fake:
        managed_saxpy.register_fake_kernels(lib)
    device = check(driver.cuDeviceGet(0))
    check(driver.cuCtxSetCurrent(check(driver.cuDevicePrimaryCtxRetain(device))))
    module = check(driver.cuModuleLoadData(managed_saxpy.PTX.encode() + b"\0"))
    scale = check(driver.cuModuleGetFunction(module, b"scale"))
    stream = check(driver.cuStreamCreate(0))

    n = BUFFER_MIB * MiB // 4
    ptr = int(check(driver.cuMemAllocManaged(4 * n, driver.CUmemAttach_flags.CU_MEM_ATTACH_GLOBAL.value)))
    if fake:  # fakecuda cannot see the CPU's page faults: the host says what it touches
        lib.fakecuda_host_touch(ctypes.c_void_p(ptr), ctypes.c_size_t(4 * n))
    x = np.ctypeslib.as_array((ctypes.c_float * n).from_address(ptr))
    x[:] = (np.arange(n) % 251 / 8).astype(np.float32)  # exact in float32, and stays exact
    want = x.copy()
    for _ in range(STEPS):
        check(driver.cuLaunchKernel(scale, min((n + 255) // 256, 4096), 1, 1, 256, 1, 1, 0, stream,
                                    ((ptr, 2.0, n), (ctypes.c_void_p, ctypes.c_float, ctypes.c_uint64)), 0))
        want = want * np.float32(2)
    check(driver.cuStreamSynchronize(stream))
    if managed_saxpy.KERNEL_ERRORS:  # fakecuda's kernels raise here, not inside C
        raise managed_saxpy.KERNEL_ERRORS[0]
    gpu_faults = None
    if fake:
        stats = managed_saxpy.FakeStats()
        lib.fakecuda_get_stats(ctypes.byref(stats))
        gpu_faults = stats.gpu_faults
        lib.fakecuda_host_touch(ctypes.c_void_p(ptr), ctypes.c_size_t(4 * n))
    print(json.dumps({"fake": fake, "gpu_faults": gpu_faults, "correct": bool(np.array_equal(x, want)),
                      "checksum": x.astype(np.float64).sum().hex()}), flush=True)
    check(driver.cuMemFree(ptr))


# ---- the tests ----------------------------------------------------------------------------

def run_job(env, *pump_run):
    proc = subprocess.run([*pump_run, sys.executable, os.path.abspath(__file__)], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"rc={proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    result = json.loads(proc.stdout.splitlines()[-1])
    assert result["correct"], result
    return proc, result


@pytest.fixture(scope="module")
def fake_env(c_build):
    pytest.importorskip("cuda.bindings.driver")
    return dict(clean_env("LD_LIBRARY_PATH"), LD_LIBRARY_PATH=str(c_build / "plain"))


@pytest.fixture(scope="module")
def bare(fake_env):
    return run_job(fake_env)[1]


def test_bare_on_fakecuda(bare):
    assert bare["fake"]
    assert bare["gpu_faults"] == BUFFER_MIB * MiB // PAGE  # plain Unified Memory: each page faults once


def test_under_pump_run(bare, fake_env, tmp_path):
    stats_file = tmp_path / "stats.json"
    proc, result = run_job(fake_env, PUMP_RUN, "--stats", str(stats_file))
    assert result["checksum"] == bare["checksum"]
    assert result["gpu_faults"] == 0, result  # pump prefetched the buffer at the first launch
    assert len([l for l in proc.stderr.splitlines() if l.startswith("pump: ")]) == 1, proc.stderr
    totals = json.loads(stats_file.read_text())["totals"]
    assert totals["launches"] == totals["launches_managed"] == STEPS, totals
    assert totals["prefetch_bytes"] >= BUFFER_MIB * MiB, totals


def test_under_pump_run_policy_off(bare, fake_env, tmp_path):
    stats_file = tmp_path / "stats.json"
    _, result = run_job(fake_env, PUMP_RUN, "--policy", "off", "--stats", str(stats_file))
    assert result["checksum"] == bare["checksum"]
    assert result["gpu_faults"] == bare["gpu_faults"] > 0  # pump saw the launches and moved nothing
    totals = json.loads(stats_file.read_text())["totals"]
    assert totals["launches"] == totals["launches_managed"] == STEPS, totals
    assert totals["prefetch_bytes"] == 0, totals


@needs_gpu
def test_on_the_gpu(tmp_path):
    pytest.importorskip("cuda.bindings.driver")
    env = clean_env()
    _, bare_gpu = run_job(env)
    stats_file = tmp_path / "stats.json"
    _, result = run_job(env, PUMP_RUN, "--stats", str(stats_file))
    assert not result["fake"] and result["checksum"] == bare_gpu["checksum"]
    totals = json.loads(stats_file.read_text())["totals"]
    assert totals["launches"] == totals["launches_managed"] == STEPS, totals
    assert totals["prefetch_bytes"] >= BUFFER_MIB * MiB, totals


if __name__ == "__main__":
    job()
