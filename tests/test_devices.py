"""Devices on fakecuda (two of them, tests/c/devices.c): a prefetch goes to
the device of the launch stream, whichever context is current, for kernels
and graph replays alike; pump never makes a context on a device the program
did not use."""

import pytest

TWO = {"FAKECUDA_DEVICES": "2"}


@pytest.mark.parametrize("launch, current", [(1, 0), (0, 1)])
def test_prefetch_goes_to_the_launch_streams_device(run_program, launch, current):
    bare = run_program("devices", launch, current, pump=False, env=TWO)
    assert bare.result["gpu_faults"] == bare.result["expected_faults"] > 0
    run = run_program("devices", launch, current, env=TWO)
    assert run.result["gpu_faults"] == 0
    assert run.result["checksum"] == bare.result["checksum"]
    assert run.result["contexts"] == bare.result["contexts"] == [1, 1]
    assert run.totals["graph_launches_prefetched"] == 1
    assert run.totals["errors"] == 0


@pytest.mark.parametrize("device", [0, 1])
def test_no_context_on_a_device_the_program_did_not_use(run_program, device):
    run = run_program("devices", device, device, env=TWO)
    assert run.result["gpu_faults"] == 0
    expected = [0, 0]
    expected[device] = 1
    assert run.result["contexts"] == expected


@pytest.mark.parametrize("variant", ["asan", "tsan"])
def test_other_context_under_sanitizers(run_program, variant):
    env = dict(TWO, ASAN_OPTIONS="detect_leaks=1:abort_on_error=0", TSAN_OPTIONS="halt_on_error=1")
    run = run_program("devices", 1, 0, variant=variant, env=env, timeout=600)
    assert run.proc.returncode == 0, run.proc.stderr[-4000:]
    assert "Sanitizer" not in run.proc.stderr and "runtime error" not in run.proc.stderr, run.proc.stderr[-4000:]
    assert run.result["gpu_faults"] == 0
