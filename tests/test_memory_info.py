"""Memory queries under managed_all count everything the process holds (issue 15 item 6).

PyTorch's cudaMallocAsync backend (PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync) asserts
`free_upper_bound + pytorch_used_bytes <= device_total` in CudaMallocAsync::cacheInfo
(c10/cuda/CUDAMallocAsyncAllocator.cpp), which cuDNN's convolution workspace sizing reaches.
On CUDA 12 drivers (no managed pools) its allocations stay device memory, outside pump's
managed footprint: tests/c/conv_async.c runs a convolution the way that backend does."""

import json
import subprocess

import pytest

from helpers import PUMP_RUN, clean_env

DEVICE = {"FAKECUDA_DEVICE_MEMORY": str(1 << 30)}
CUDA_12_8 = dict(DEVICE, FAKECUDA_DRIVER_VERSION="12080")  # no cuMemGetDefaultMemPool: no managed pools
CUDA_13 = dict(DEVICE, FAKECUDA_DRIVER_VERSION="13000")
# what the program holds at cacheInfo: the 4 MiB input, the 9 weights and the 1022x1022 output
HELD = 4 * 1024 * 1024 + 9 * 4 + 4 * 1022 * 1022
USED_MIB = HELD >> 20


def pump_run(c_build, tmp_path, env):
    stats_file = tmp_path / "stats.json"
    proc = subprocess.run([PUMP_RUN, "--stats", str(stats_file), "--quiet", str(c_build / "plain" / "conv_async")],
                          env=dict(clean_env(), LD_LIBRARY_PATH=str(c_build / "plain"), **env),
                          capture_output=True, text=True, timeout=300)
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    return proc, lines[-1] if lines else None, json.loads(stats_file.read_text())["totals"]


@pytest.mark.parametrize("driver, managed_all_allocs", [(CUDA_12_8, 0), (CUDA_13, 5)])
def test_convolution_with_the_async_allocator_under_pump_run(run_program, c_build, tmp_path, driver,
                                                             managed_all_allocs):
    """Before, on CUDA 12.8, cuMemGetInfo answered free 1016 MiB of total 1016 MiB while the
    program held 7 MiB of device memory: the assert failed and no convolution ran."""
    bare = run_program("conv_async", pump=False, env=driver)
    assert bare.result == {"free_mib": 1016, "total_mib": 1024, "used_mib": USED_MIB, "assert_ok": 1,
                           "guess_mib": 1016, "algorithm": "im2col", "correct": 1}
    proc, result, totals = pump_run(c_build, tmp_path, driver)
    assert proc.returncode == 0, (proc.stdout, proc.stderr)
    assert result["free_mib"] + result["used_mib"] <= result["total_mib"]
    assert result == bare.result  # the default capacity: the device's memory as the job found it
    # CUDA 12: the tensors stayed device memory; CUDA 13: they came from the managed pool
    assert totals["managed_all_allocs"] == managed_all_allocs
    assert totals["errors"] == 0


def test_a_capacity_past_the_device_leaves_room_for_the_device_memory(run_program):
    """Before: free 2048 MiB of total 2048 MiB with 7 MiB held, the assert failed."""
    run = run_program("conv_async", env=dict(CUDA_12_8, PUMP_MANAGED_ALL="1", PUMP_CAPACITY="2GiB"))
    assert run.result["total_mib"] == 2048 and run.result["free_mib"] == ((2048 << 20) - HELD) >> 20
    assert run.result["correct"] == 1


def test_a_capacity_under_the_device_memory_held(run_program):
    """The device memory passes the cap: the total is what the process holds, nothing is free,
    and the convolution runs without a workspace. Before: free 4 MiB of total 4 MiB with 7 MiB
    held, the assert failed."""
    run = run_program("conv_async", env=dict(CUDA_12_8, PUMP_MANAGED_ALL="1", PUMP_CAPACITY="4MiB"))
    assert run.result == {"free_mib": 0, "total_mib": USED_MIB, "used_mib": USED_MIB, "assert_ok": 1,
                          "guess_mib": 0, "algorithm": "implicit", "correct": 1}


@pytest.mark.parametrize("variant", ["asan", "tsan"])
def test_under_sanitizers(run_program, variant):
    env = dict(CUDA_12_8, PUMP_MANAGED_ALL="1", ASAN_OPTIONS="detect_leaks=1:abort_on_error=0",
               UBSAN_OPTIONS="print_stacktrace=1", TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1")
    run = run_program("conv_async", variant=variant, env=env, timeout=600)
    assert run.proc.returncode == 0, run.proc.stderr[-4000:]
    assert "Sanitizer" not in run.proc.stderr and "runtime error" not in run.proc.stderr, run.proc.stderr[-4000:]
    assert run.result["assert_ok"] == 1 and run.result["correct"] == 1
