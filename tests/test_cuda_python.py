"""cuda-python programs under pump: their managed allocations and kernel launches go
through the same driver entry points that pump hooks (issue 5, item 4).

This file is also the program: `python tests/test_cuda_python.py` runs a cuda-python job
(cuda.bindings.driver: cuInit, cuMemAllocManaged, cuLaunchKernel on a PTX module) and
prints one JSON line.  On fakecuda (build/tests/plain on LD_LIBRARY_PATH) its kernel is a
host function registered by name through fakecuda's test API; on a GPU the PTX runs.
The tests run it bare, under pump-run and under pump-run --policy off, and compare.
"""

import ctypes
import json
import os
import subprocess
import sys

import pytest

from helpers import PUMP_RUN, clean_env, needs_gpu

MiB = 1 << 20
BUFFER_MIB, STEPS = 4, 3
PAGE = 64 << 10  # fakecuda's migration page: one GPU fault per page a kernel finds missing

# x[i] = 2 x[i] + 1, grid-stride; fma.rn rounds as the host check does.
PTX = r"""
.version 6.0
.target sm_60
.address_size 64

.visible .entry axpb(.param .u64 x, .param .u64 n)
{
    .reg .pred %p;  .reg .f32 %f<3>;  .reg .b32 %r<5>;  .reg .b64 %rd<9>;
    ld.param.u64 %rd1, [x];  ld.param.u64 %rd3, [n];
    cvta.to.global.u64 %rd1, %rd1;
    mov.u32 %r1, %ctaid.x;  mov.u32 %r2, %ntid.x;  mov.u32 %r3, %tid.x;  mov.u32 %r4, %nctaid.x;
    mul.wide.u32 %rd4, %r1, %r2;  cvt.u64.u32 %rd5, %r3;  add.u64 %rd4, %rd4, %rd5;
    mul.wide.u32 %rd6, %r4, %r2;
LOOP:
    setp.ge.u64 %p, %rd4, %rd3;  @%p bra DONE;
    shl.b64 %rd7, %rd4, 2;  add.u64 %rd8, %rd1, %rd7;
    ld.global.f32 %f1, [%rd8];  fma.rn.f32 %f2, %f1, 0f40000000, 0f3F800000;  st.global.f32 [%rd8], %f2;
    add.u64 %rd4, %rd4, %rd6;  bra LOOP;
DONE:
    ret;
}
"""


# ---- the cuda-python job ----------------------------------------------------------------

def check(result):
    """cuda-python returns (CUresult, values...): the values, or exit naming the error."""
    from cuda.bindings import driver
    err, *values = result if isinstance(result, tuple) else (result,)
    if err != driver.CUresult.CUDA_SUCCESS:
        sys.exit(f"cuda-python job: {err!r}")
    return values[0] if len(values) == 1 else values


def register_fake_axpb(lib, callbacks):
    """fakecuda only: axpb as a host function (fakecuda has no PTX to run)."""
    import numpy as np

    def axpb(params, dims):
        x = ctypes.cast(params[0], ctypes.POINTER(ctypes.c_uint64))[0]
        n = ctypes.cast(params[1], ctypes.POINTER(ctypes.c_uint64))[0]
        lib.fakecuda_touch(ctypes.c_void_p(x), ctypes.c_size_t(4 * n))  # faults in what is missing
        arr = np.ctypeslib.as_array((ctypes.c_float * n).from_address(x))
        arr *= np.float32(2)
        arr += np.float32(1)

    callbacks.append(ctypes.CFUNCTYPE(None, ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p)(axpb))
    layout = (ctypes.c_size_t * 2)(8, 8)
    if lib.fakecuda_register_kernel(b"axpb", callbacks[-1], 2, layout, layout):
        sys.exit("cuda-python job: fakecuda_register_kernel failed")


def job():
    import numpy as np
    from cuda.bindings import driver

    check(driver.cuInit(0))
    lib = ctypes.CDLL("libcuda.so.1")  # the driver cuda-python loaded
    fake = hasattr(lib, "fakecuda_register_kernel")
    callbacks = []  # fakecuda keeps raw pointers to these
    if fake:
        register_fake_axpb(lib, callbacks)
    device = check(driver.cuDeviceGet(0))
    check(driver.cuCtxSetCurrent(check(driver.cuDevicePrimaryCtxRetain(device))))
    module = check(driver.cuModuleLoadData(PTX.encode()))
    axpb = check(driver.cuModuleGetFunction(module, b"axpb"))
    stream = check(driver.cuStreamCreate(0))

    n = BUFFER_MIB * MiB // 4
    ptr = int(check(driver.cuMemAllocManaged(4 * n, driver.CUmemAttach_flags.CU_MEM_ATTACH_GLOBAL.value)))
    if fake:  # fakecuda cannot see the CPU's page faults: the host says what it touches
        lib.fakecuda_host_touch(ctypes.c_void_p(ptr), ctypes.c_size_t(4 * n))
    x = np.ctypeslib.as_array((ctypes.c_float * n).from_address(ptr))
    x[:] = (np.arange(n) % 251 / 8).astype(np.float32)  # exact in float32, and stays exact
    want = x.copy()
    for _ in range(STEPS):
        check(driver.cuLaunchKernel(axpb, min((n + 255) // 256, 4096), 1, 1, 256, 1, 1, 0, stream,
                                    ((ptr, n), (ctypes.c_void_p, ctypes.c_uint64)), 0))
        want = want * np.float32(2) + np.float32(1)
    check(driver.cuStreamSynchronize(stream))
    gpu_faults = None
    if fake:
        stats = (ctypes.c_uint64 * 13)()  # struct fakecuda_stats: gpu_faults first
        lib.fakecuda_get_stats(stats)
        gpu_faults = stats[0]
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
