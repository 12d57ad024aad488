"""Drivers before CUDA 12.4 (the long-term 535 branch is CUDA 12.2) cannot tell a kernel's
parameter layout (cuFuncGetParamInfo, cuKernelGetParamInfo), so pump cannot scan the
launches the runtime and PyTorch make: there, managed_all is off, said once, and device
allocations stay device memory (tests/c/managed_all.c on fakecuda reporting 12.2)."""

import pytest

CUDA_12_2 = {"FAKECUDA_DRIVER_VERSION": "12020"}


@pytest.mark.parametrize("variant", ["plain", "asan", "tsan"])
def test_managed_all_is_off_without_parameter_layouts(run_program, variant):
    bare = run_program("managed_all", "device", 2, pump=False, env=CUDA_12_2).result
    assert bare["managed"] == [0, 0]
    env = dict(CUDA_12_2, PUMP_MANAGED_ALL="1", ASAN_OPTIONS="detect_leaks=1", TSAN_OPTIONS="halt_on_error=1")
    run = run_program("managed_all", "device", 2, variant=variant, env=env, timeout=600)
    assert run.proc.returncode == 0, run.proc.stderr[-4000:]
    assert run.result == bare
    (notice,) = run.proc.stderr.splitlines()
    assert "managed_all is off" in notice and "cuFuncGetParamInfo" in notice and "CUDA 12.4" in notice
    totals = run.totals
    assert totals["managed_all_allocs"] == 0 and totals["managed_allocs"] == 0
    assert totals["launches"] == 4 and totals["errors"] == 0
