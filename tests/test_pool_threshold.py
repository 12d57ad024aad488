"""A memory pool's release threshold under pump (issue 15, item 6): on CUDA 13, managed_all
takes stream-ordered allocations from the device's managed pool instead of its default pool.
PyTorch's cudaMallocAsync backend raises the default pool's release threshold to UINT64_MAX;
the managed pool kept the driver's 0, so every step's freed memory went back to the driver at
the step's synchronisation and was reserved and populated again the next step (before the
fix, 5 steps of a 16 MiB activation: 80 MiB released and 80 MiB reserved again, a new address
each step in that run). The managed pool now follows the program's threshold, and its trims; pump's own
PyTorch allocator (torch_allocator = "pump") keeps freed memory as PyTorch's allocators do.
Measured with fakecuda's pool counters (tests/c/pool_steps.c)."""

import pytest

# The managed pool's path: fakecuda then prefetches its memory (where it does not, pump does without
# the pool: tests/test_pool_prefetch.py).
MANAGED_ALL = {"PUMP_MANAGED_ALL": "1", "FAKECUDA_POOL_PREFETCH": "accept"}
STEPS = 5
ACTIVATION = 16 << 20  # tests/c/pool_steps.c
KEPT = {"same_address": 1, "pool_bytes_released": 0, "pool_bytes_reserved": 0, "gpu_faults": 0}
# Given back shows in the counters, not the address: the driver may map a released range at the same
# address again (fakecuda's managed pool does whenever mmap hands the range back).
GIVEN_BACK = {"pool_bytes_released": STEPS * ACTIVATION, "pool_bytes_reserved": STEPS * ACTIVATION}


def subset(result, expected):
    return {key: result[key] for key in expected}


def test_managed_pool_follows_pytorchs_threshold(run_program):
    bare = run_program("pool_steps", STEPS, "pytorch", pump=False).result
    assert bare["managed"] == 0 and subset(bare, KEPT) == KEPT and bare["trim_released"] == ACTIVATION
    run = run_program("pool_steps", STEPS, "pytorch", env=MANAGED_ALL)
    assert run.proc.stderr == ""
    assert run.result["managed"] == 1 and subset(run.result, KEPT) == KEPT, run.result
    # torch.cuda.empty_cache() trims the device's default pool: the managed pool standing in too
    assert run.result["trim_released"] == ACTIVATION
    assert run.totals["managed_all_allocs"] == STEPS + 1


def test_managed_pool_follows_the_default_threshold(run_program):
    """Left at 0, as the program left it: given back at each synchronisation, with or without pump."""
    bare = run_program("pool_steps", STEPS, pump=False).result
    run = run_program("pool_steps", STEPS, env=MANAGED_ALL).result
    assert subset(bare, GIVEN_BACK) == GIVEN_BACK and bare["managed"] == 0
    assert subset(run, GIVEN_BACK) == GIVEN_BACK and run["managed"] == 1


@pytest.mark.parametrize("env", [{}, MANAGED_ALL])
def test_pump_allocator_keeps_freed_memory(run_program, env):
    run = run_program("pool_steps", STEPS, "pluggable", env=env)
    assert run.proc.stderr == ""
    assert run.result["managed"] == (1 if env else 0)
    assert subset(run.result, KEPT) == KEPT, run.result
    assert run.totals["torch_allocs"] == STEPS + 1


@pytest.mark.parametrize("variant", ["asan", "tsan"])
@pytest.mark.parametrize("mode", ["pytorch", "pluggable"])
def test_under_sanitizers(run_program, variant, mode):
    env = dict(MANAGED_ALL, ASAN_OPTIONS="detect_leaks=1:abort_on_error=0", UBSAN_OPTIONS="print_stacktrace=1",
               TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1")
    run = run_program("pool_steps", STEPS, mode, variant=variant, env=env, timeout=600)
    assert run.proc.returncode == 0, run.proc.stderr[-4000:]
    assert "Sanitizer" not in run.proc.stderr and "runtime error" not in run.proc.stderr, run.proc.stderr[-4000:]
    assert run.result["managed"] == 1 and subset(run.result, KEPT) == KEPT, run.result
