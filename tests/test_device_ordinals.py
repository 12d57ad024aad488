"""Every device ordinal pump can name (0..63) keeps what pump knows of its residency:
a second launch over memory already prefetched to the device prefetches nothing
(tests/c/repeat_launch.c), on the 16th and the 64th GPU as on the first."""

import pytest

DEVICES = {"FAKECUDA_DEVICES": "64", "PUMP_SOCKET": "", "PUMP_POLICY": "launch",
           "ASAN_OPTIONS": "detect_leaks=1", "TSAN_OPTIONS": "halt_on_error=1"}


@pytest.mark.parametrize("device", [0, 15, 63])
@pytest.mark.parametrize("variant", ["plain", "asan", "tsan"])
def test_a_second_launch_over_resident_memory_prefetches_nothing(run_program, device, variant):
    bare = run_program("repeat_launch", device, pump=False, env=DEVICES).result
    run = run_program("repeat_launch", device, variant=variant, env=DEVICES, timeout=600)
    assert run.proc.returncode == 0, run.proc.stderr[-4000:]
    assert "Sanitizer" not in run.proc.stderr and "runtime error" not in run.proc.stderr, run.proc.stderr[-4000:]
    result, totals = run.result, run.totals
    assert result["checksum"] == bare["checksum"] and result["gpu_faults"] == 0
    assert result["prefetch_calls"] == 1
    assert totals["launches_prefetched"] == 1 and totals["resident_skips"] == 1
    assert totals["errors"] == 0
