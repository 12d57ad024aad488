"""pump's own driver calls never invalidate a CUDA graph another thread captures in global
mode (tests/c/capture_threads.c): fakecuda enforces the driver's capture-mode rule on
cuEventQuery, and pump makes every call of its own in relaxed mode."""

import pytest

ENV = {"PUMP_SOCKET": "", "PUMP_MANAGED_ALL": "1", "ASAN_OPTIONS": "detect_leaks=1",
       "TSAN_OPTIONS": "halt_on_error=1"}
TENSOR = 4 << 20  # tests/c/capture_threads.c's TENSOR_BYTES


@pytest.mark.parametrize("variant", ["plain", "asan", "tsan"])
def test_a_capture_on_another_thread_stays_valid(run_program, variant):
    bare = run_program("capture_threads", pump=False).result
    assert bare["end_capture"] == 0
    run = run_program("capture_threads", variant=variant, env=ENV, timeout=600)
    assert run.proc.returncode == 0, run.proc.stderr[-4000:]
    assert "Sanitizer" not in run.proc.stderr and "runtime error" not in run.proc.stderr, run.proc.stderr[-4000:]
    result, totals = run.result, run.totals
    assert result["end_capture"] == 0  # not CUDA_ERROR_STREAM_CAPTURE_INVALIDATED (901)
    assert result["checksum"] == bare["checksum"]
    # Both tensors were discarded when freed; the second got the first one's memory, and before
    # moving it pump asked the driver whether that discard had run.
    assert totals["torch_allocs"] == totals["torch_frees"] == 2 and totals["bytes_discarded"] == 2 * TENSOR
    assert totals["launches_prefetched"] >= 1 and totals["errors"] == 0
