"""Each kernel handle's parameter layout asked of the call that takes its kind
(tests/c/kernel_handles.c): cuFuncGetParamInfo for a CUfunction, cuKernelGetParamInfo for a
CUkernel from cuLibraryGetKernel (cuda.h allows a CUkernel cast to CUfunction for launches
only). With FAKECUDA_PARAM_INFO_OTHER_KIND=garbage fakecuda answers the wrong call with
success and a layout that holds no pointer, as a driver reading one object as the other
might: pump then finds the kernel's pointer only if it asked the right call. Launches are
counted by handle kind, through the linked entry points and through cuGetProcAddress."""

import json

import pytest

HOWS = {  # how the handle was made -> the launch counter it lands in
    "function": "launches_function_handles",
    "kernel": "launches_kernel_handles",
    "kernel_function": "launches_function_handles",
    "enumerated_kernel": "launches_kernel_handles",
    "enumerated_function": "launches_function_handles",
    # the captured launch; its replay runs the node's CUfunction, made by the driver: of
    # unknown origin, asked as a CUfunction first (the right call: a wrong one would answer
    # the garbage layout and the replay would fault)
    "captured_kernel": "launches_kernel_handles",
}
KINDS = ("launches_kernel_handles", "launches_function_handles", "launches_unknown_handles")


def handles_run(run_program, how, program="kernel_handles", variant="plain", pump=True):
    env = {"PUMP_SOCKET": "", "PUMP_POLICY": "launch", "FAKECUDA_PARAM_INFO_OTHER_KIND": "garbage",
           "ASAN_OPTIONS": "detect_leaks=1", "TSAN_OPTIONS": "halt_on_error=1"}
    run = run_program(program, how, variant=variant, pump=pump, env=env)
    assert run.proc.returncode == 0, run.proc.stderr[-4000:]
    assert "Sanitizer" not in run.proc.stderr and "runtime error" not in run.proc.stderr, run.proc.stderr[-4000:]
    return run


@pytest.mark.parametrize("program", ["kernel_handles", "kernel_handles_procaddr"])
@pytest.mark.parametrize("how", sorted(HOWS))
def test_layout_asked_by_handle_kind(run_program, program, how):
    bare = handles_run(run_program, how, program, pump=False).result
    assert bare["faults"] == 16  # 1 MiB of 64 KiB pages, written by the host
    run = handles_run(run_program, how, program)
    assert run.result == {"faults": 0, "checksum": bare["checksum"]}
    totals = run.totals
    assert totals["launches"] == 1 and totals["launches_unscanned"] == 0
    assert totals["graph_launches_unknown"] == 0
    assert {kind: totals[kind] for kind in KINDS} == {kind: int(kind == HOWS[how]) for kind in KINDS}


@pytest.mark.parametrize("variant", ["asan", "tsan"])
def test_layout_asked_by_handle_kind_sanitized(run_program, variant):
    run = handles_run(run_program, "kernel", variant=variant)
    assert run.result["faults"] == 0
    assert run.totals["launches_kernel_handles"] == 1



@pytest.mark.parametrize("how", ["function", "kernel"])
def test_parameter_count_asked_where_the_driver_has_it(run_program, tmp_path, how):
    """Before CUDA 13.2 the only end of a layout is cuFuncGetParamInfo refusing the index past
    it: one refused call per layout, an API error to compute-sanitizer (docs/gpu-check.md).
    From 13.2 pump asks cuFuncGetParamCount / cuKernelGetParamCount and is never refused. It
    never asks the driver for an entry point newer than the driver: the 580 driver (CUDA 13.0)
    refused pump's two 13.2 lookups with CUDA_ERROR_INVALID_VALUE, which compute-sanitizer
    reports (bench/results/gpu-20261126-nvidia-h100-80gb-hbm3)."""
    refused = {}
    for version in (12080, 13000, 13020):
        fake_stats = tmp_path / f"fakecuda-{version}-{how}.json"
        env = {"PUMP_SOCKET": "", "PUMP_POLICY": "launch", "FAKECUDA_DRIVER_VERSION": str(version),
               "FAKECUDA_STATS": str(fake_stats)}
        run = run_program("kernel_handles", how, env=env)
        assert run.proc.returncode == 0, run.proc.stderr[-4000:]
        assert run.result["faults"] == 0 and run.totals["launches_unscanned"] == 0
        fake = json.loads(fake_stats.read_text())
        refused[version] = fake["param_info_refused"]
        assert fake["lookups_above_driver"] == 0, (version, fake["lookups_above_driver"])
    assert refused == {12080: 1, 13000: 1, 13020: 0}
