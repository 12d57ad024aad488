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


@pytest.mark.parametrize("program, variant", [("capture_count", "plain"), ("capture_count", "asan"),
                                              ("capture_count", "tsan"), ("capture_count_procaddr", "plain")])
def test_the_capture_query_is_made_only_while_a_capture_is_open(run_program, program, variant):
    """Under a budget every launch asked the driver whether its stream was being captured (a
    driver call on the launching thread). pump counts the captures begun and ended through its
    hooks, linked or through cuGetProcAddress (tests/c/capture_count.c), and asks only while one
    is open; an end the driver refused leaves it open; a way to begin one that pump does not
    hook (here a dlsym of such a name) makes every launch ask again, as does a driver newer than
    pump's headers. An end refused because a fork was not joined back ends the capture on
    fakecuda: pump asks the driver after a refused end, and stops asking (before, it asked at
    every launch for the rest of the process: issue 42 risk 5)."""
    env = {**ENV, "PUMP_MANAGED_ALL": "0", "PUMP_BUDGET": "64M", "PUMP_POLICY": "launch"}
    bare = run_program(program, pump=False).result
    run = run_program(program, variant=variant, env=env, timeout=600)
    assert run.proc.returncode == 0, run.proc.stderr[-4000:]
    assert "Sanitizer" not in run.proc.stderr and "runtime error" not in run.proc.stderr, run.proc.stderr[-4000:]
    r = run.result
    assert (r["before"], r["after"], r["closed"], r["after_unjoined"]) == (0, 0, 0, 0), r
    assert r["unjoined_end"] == 904  # CUDA_ERROR_STREAM_CAPTURE_UNJOINED
    assert r["during"] >= 4 and r["still_open"] >= 4 and r["untracked"] >= 4, r
    assert r["refused_end"] == 401 and not r["unknown_found"]  # CUDA_ERROR_ILLEGAL_STATE
    assert r["x0"] == bare["x0"] == 28.0 and run.totals["launches_prefetched"] >= 1
    newer = run_program(program, variant=variant, env={**env, "FAKECUDA_DRIVER_VERSION": "99000"}).result
    assert newer["before"] >= 4 and newer["after"] >= 4, newer
    if program.endswith("procaddr"):  # cuGetProcAddress answered with a function pump cannot swap
        past = run_program(program, env={**env, "FAKECUDA_PROCADDR_INTERNAL": "cuStreamBeginCapture_v2"})
        assert past.proc.returncode == 0 and past.result["x0"] == 28.0, past.proc.stderr[-2000:]
        assert past.result["before"] >= 4 and past.result["closed"] >= 4, past.result
