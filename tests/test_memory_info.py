"""Memory queries under managed_all count everything the process holds (issue 15 item 6).

PyTorch's cudaMallocAsync backend (PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync) asserts
`free_upper_bound + pytorch_used_bytes <= device_total` in CudaMallocAsync::cacheInfo
(c10/cuda/CUDAMallocAsyncAllocator.cpp), which cuDNN's convolution workspace sizing reaches.
On CUDA 12 drivers (no managed pools) its allocations stay device memory, outside pump's
managed footprint: tests/c/conv_async.c runs a convolution the way that backend does. That
backend also sets its pool's release threshold to UINT64_MAX, so its pool keeps the memory of
freed tensors: tests/c/pool_info.c."""

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


POOLS_KEPT = {"device_pool_kept": 64 << 20, "made_pool_kept": 32 << 20}  # tests/c/pool_info.c
# each memory query asks for the device's current pool, then two figures of each pool: the
# current one and the made one, then the current one alone once the made one is destroyed
POOL_QUERIES = {"pool_queries_kept": 1 + 2 * 2, "pool_queries_destroyed": 1 + 2 * 1}


def test_what_pools_keep_is_not_free(run_program):
    """The device's pool and a pool the program made keep 64 and 32 MiB of device memory after
    their allocations are freed (threshold UINT64_MAX, as PyTorch sets it), 16 MiB stays live.
    Before: free 1008 MiB at both queries, the kept 96 MiB counted as free. Now 912 MiB, then
    944 MiB, the driver's own answers, for 5 and 3 pool queries (1 us each on fakecuda) beside
    cuMemGetInfo's own ioctl (20 us)."""
    bare = run_program("pool_info", pump=False, env=CUDA_12_8).result
    run = run_program("pool_info", env=dict(CUDA_12_8, PUMP_MANAGED_ALL="1"))
    result = run.result
    assert {key: result[key] for key in POOLS_KEPT} == POOLS_KEPT
    assert result["free_kept"] + sum(POOLS_KEPT.values()) + result["live"] <= result["total"]
    # the made pool destroyed: what it kept is free again
    assert result["free_destroyed"] == result["free_kept"] + POOLS_KEPT["made_pool_kept"]
    # the default capacity: the device's memory as the job found it
    assert result == dict(bare, **POOL_QUERIES) and bare["pool_queries_kept"] == 0
    assert run.totals["managed_all_allocs"] == 1 and run.totals["errors"] == 0


def test_a_pool_current_only_between_queries_still_counts(run_program):
    """The made pool serves cuMemAllocAsync as the device's current pool (cuDeviceSetMemPool)
    and the default pool is current again before the queries: what the made pool keeps is still
    held. Before cuDeviceSetMemPool was followed: free 944 MiB at the first query, the kept
    32 MiB counted as free (the driver: 912)."""
    bare = run_program("pool_info", "current", pump=False, env=CUDA_12_8).result
    run = run_program("pool_info", "current", env=dict(CUDA_12_8, PUMP_MANAGED_ALL="1"))
    assert {key: run.result[key] for key in POOLS_KEPT} == POOLS_KEPT
    assert run.result == dict(bare, **POOL_QUERIES)


def test_what_the_managed_pool_keeps_stays_free(run_program):
    """CUDA 13: pump takes the device's managed pool for cuMemAllocAsync; what it keeps is
    managed memory the driver evicts under pressure, not counted. The made pool's is."""
    result = run_program("pool_info", env=dict(CUDA_13, PUMP_MANAGED_ALL="1")).result
    assert result["device_pool_kept"] == 0
    assert result["free_kept"] == result["total"] - result["live"] - POOLS_KEPT["made_pool_kept"]
    assert result["free_destroyed"] == result["total"] - result["live"]
    assert {key: result[key] for key in POOL_QUERIES} == POOL_QUERIES  # the managed pool is not asked


SANITIZED = dict(CUDA_12_8, PUMP_MANAGED_ALL="1", ASAN_OPTIONS="detect_leaks=1:abort_on_error=0",
                 UBSAN_OPTIONS="print_stacktrace=1", TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1")


def run_sanitized(run_program, name, variant):
    run = run_program(name, variant=variant, env=SANITIZED, timeout=600)
    assert run.proc.returncode == 0, run.proc.stderr[-4000:]
    assert "Sanitizer" not in run.proc.stderr and "runtime error" not in run.proc.stderr, run.proc.stderr[-4000:]
    return run.result


@pytest.mark.parametrize("variant", ["asan", "tsan"])
def test_under_sanitizers(run_program, variant):
    result = run_sanitized(run_program, "conv_async", variant)
    assert result["assert_ok"] == 1 and result["correct"] == 1


@pytest.mark.parametrize("variant", ["asan", "tsan"])
def test_pools_under_sanitizers(run_program, variant):
    """A destroyed pool is never asked again (fakecuda frees it: a use after free)."""
    result = run_sanitized(run_program, "pool_info", variant)
    assert result["free_kept"] + sum(POOLS_KEPT.values()) + result["live"] <= result["total"]
    assert result["free_destroyed"] == result["free_kept"] + POOLS_KEPT["made_pool_kept"]
