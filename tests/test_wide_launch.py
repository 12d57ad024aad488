"""Launches naming hundreds of managed allocations (tests/c/wide_launch.c), as PyTorch's
foreach kernels and fused optimizers make them: every allocation a launch names is
prefetched, and under a budget none of them is evicted to make room for the others."""

import subprocess

import pytest

from helpers import PUMP_RUN, clean_env
from pump import channel, trace

N = 300                   # allocations a launch names: more than the scan's inline 64
BYTES = 64 << 10          # each (tests/c/wide_launch.c)
BUDGET = N * BYTES        # exactly one launch's allocations


def wide_run(run_program, variant="plain", pump=True):
    env = {"PUMP_SOCKET": "", "PUMP_POLICY": "launch", "PUMP_BUDGET": str(BUDGET),
           "ASAN_OPTIONS": "detect_leaks=1", "TSAN_OPTIONS": "halt_on_error=1"}
    run = run_program("wide_launch", N, variant=variant, pump=pump, env=env, timeout=600)
    assert run.proc.returncode == 0, run.proc.stderr[-4000:]
    assert "Sanitizer" not in run.proc.stderr and "runtime error" not in run.proc.stderr, run.proc.stderr[-4000:]
    return run


@pytest.mark.parametrize("variant", ["plain", "asan", "tsan"])
def test_every_allocation_a_launch_names_is_prefetched_and_kept(run_program, variant):
    bare = wide_run(run_program, pump=False).result
    # One page per allocation not on the GPU yet: all of launch 1's, the half of A launch 2 adds.
    assert (bare["first_faults"], bare["second_faults"]) == (N, N // 2)
    run = wide_run(run_program, variant)
    result, totals = run.result, run.totals
    assert result["checksum"] == bare["checksum"]
    assert (result["first_faults"], result["second_faults"]) == (0, 0)
    # Launch 2 made room by evicting launch 1's other N/2 allocations, none of its own.
    assert totals["evictions"] == N // 2 and totals["budget_skips"] == 0
    assert result["device_resident_peak"] <= BUDGET
    assert totals["errors"] == 0


def test_pumpd_hears_every_allocation_of_an_optimizers_launch(c_build, tmp_path):
    """A LAUNCH record carries up to 256 allocations (shim/channel/channel.c), enough for
    PyTorch's multi_tensor_apply (Adam's 4 lists of up to 36 tensors: 144; depth 5: 150).
    pumpd's plan names as a launch's need only the allocations it heard of, and the shim takes
    the others whole at the launch, from the launching thread: with 64 carried, GPT-2 small's
    optimizer launches under lookahead moved about 1,700 such blocks a step, and
    scripts/bench-real-client-budget's lookahead took 709 ms a step against 600 with 256."""
    wide = 150
    trace_file = tmp_path / "pump.trace"
    env = dict(clean_env(), LD_LIBRARY_PATH=str(c_build / "plain"))
    proc = subprocess.run([PUMP_RUN, "--daemon", "embedded", "--quiet", "--trace", str(trace_file), "--",
                           str(c_build / "plain" / "wide_launch"), str(wide)],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    widths = []
    for _pid, records in trace.read(trace_file)[1]:
        batch = channel.decode(records)
        widths += [len(batch.launch_bases(i)) for i in range(len(batch.launch_function))]
    assert widths == [wide, wide], widths  # both launches, every allocation they name
