"""A context that goes and comes back (tests/c/context_reset.c): cuDevicePrimaryCtxReset
(what cudaDeviceReset calls), the last cuDevicePrimaryCtxRelease and cuCtxDestroy take the
context's streams and events with them, pump's own included (fakecuda refuses them afterwards,
as CUDA_ERROR_INVALID_HANDLE). pump forgets them and makes new ones: the second round is
prefetched as the first was, with no failed driver call. Before pump forgot them, the second
round after a reset or a release faulted on all 256 pages, pump logging
"cuMemPrefetchBatchAsync failed (CUresult 400)" and "cuEventRecord failed (CUresult 400)"."""

import pytest

MODES = ["reset", "release", "destroy"]


@pytest.mark.parametrize("mode", MODES)
def test_a_context_made_again_is_prefetched_again(run_program, mode):
    bare = run_program("context_reset", mode, pump=False)
    assert bare.result["faults"] == [bare.result["expected_faults"]] * 2
    run = run_program("context_reset", mode)
    assert run.result["faults"] == [0, 0]
    assert run.result["checksum"] == bare.result["checksum"]
    assert run.totals["errors"] == 0


@pytest.mark.parametrize("variant", ["asan", "tsan"])
@pytest.mark.parametrize("mode", MODES)
def test_context_reset_under_sanitizers(run_program, variant, mode):
    env = {"ASAN_OPTIONS": "detect_leaks=1:abort_on_error=0", "TSAN_OPTIONS": "halt_on_error=1"}
    run = run_program("context_reset", mode, variant=variant, env=env, timeout=600)
    assert run.proc.returncode == 0, run.proc.stderr[-4000:]
    assert "Sanitizer" not in run.proc.stderr and "runtime error" not in run.proc.stderr, run.proc.stderr[-4000:]
    assert run.result["faults"] == [0, 0]
    assert run.totals["errors"] == 0


@pytest.mark.parametrize("variant", ["plain", "asan", "tsan"])
@pytest.mark.parametrize("mode", MODES)
def test_allocations_a_context_took_with_it_leave_the_capacity(run_program, variant, mode):
    """busy: each round ends with 8 more buffers of 16 MiB launched on and left to the context's
    end (a reset destroys its allocations; a program need not free them first). Under a capacity
    of 200 MiB the second round's 144 MiB fit only if pump forgot the first round's 128 MiB when
    the context went: before it did, pump refused the second round's allocation past the
    capacity (CUDA_ERROR_OUT_OF_MEMORY, the program exits 3), which bare runs without."""
    env = {"PUMP_CAPACITY": "200MiB", "ASAN_OPTIONS": "detect_leaks=1:abort_on_error=0",
           "TSAN_OPTIONS": "halt_on_error=1"}
    bare = run_program("context_reset", mode, "busy", pump=False)
    run = run_program("context_reset", mode, "busy", variant=variant, env=env, timeout=600)
    assert run.proc.returncode == 0, run.proc.stderr[-4000:]
    assert "Sanitizer" not in run.proc.stderr and "runtime error" not in run.proc.stderr, run.proc.stderr[-4000:]
    assert run.result["checksum"] == bare.result["checksum"] and run.result["faults"] == [0, 0]
    assert run.totals["capacity_refusals"] == 0 and run.totals["errors"] == 0
