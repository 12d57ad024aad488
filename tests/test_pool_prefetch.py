"""Memory from a managed pool and the prefetch contract (issue 27, risks 1 and 2).

cuda.h 13.0 says the ranges of cuMemPrefetchAsync, cuMemPrefetchBatchAsync and
cuMemDiscardBatchAsync "must refer to managed memory allocated via cuMemAllocManaged or
declared via __managed__"; fakecuda refuses a managed pool's memory by default and takes it
with FAKECUDA_POOL_PREFETCH=accept (what a GPU may show). pump works under either answer:

- managed_all asks each device once whether its managed pool's memory is prefetched; where it
  is refused, stream-ordered allocations come from cuMemAllocManaged, freed in stream order
  into pump's own cache (shim/policy/managed_all_cache.c); pump's PyTorch allocator too
  (tests/test_torch_allocator.py runs it under both answers). Before that, under the refusal every
  prefetch of a converted allocation failed, batching went off for the process, and the
  kernels faulted everything in (tests/c/pool_prefetch.c steps 4: 576 faults over the last 3
  steps, 0 batch prefetch calls; now 0 faults, 9 batches).
- a refused range marks its allocation, which is never asked again, and batching goes on for
  the rest. Before, the first refused batch turned batching off for the whole process: one
  call per range from then on, the pool's range refused again at every launch (pool_prefetch
  refused 5: 4 single calls taken and 4 refused, 0 batches; now 4 batches, nothing refused
  after the first launch).
- a driver that took the probe may refuse the pool's memory later (an H200's 580 driver did:
  bench/results/gpu-20261126-nvidia-h200); fakecuda does with FAKECUDA_POOL_PREFETCH_REFUSE_AFTER.
  The first refusal of it turns the device to cuMemAllocManaged, as if the probe had been refused.
"""

import pytest

MANAGED_ALL = {"PUMP_MANAGED_ALL": "1"}
REFUSE, ACCEPT = {"FAKECUDA_POOL_PREFETCH": "refuse"}, {"FAKECUDA_POOL_PREFETCH": "accept"}
STEPS = 4
LAUNCHES_A_STEP = 3  # tests/c/pool_prefetch.c: fill, fill, add
LAUNCHES = 5


def steps(run_program, driver, variant="plain", mode="steps", **kwargs):
    env = dict(MANAGED_ALL, **driver, **kwargs.pop("env", {}))
    return run_program("pool_prefetch", mode, STEPS, variant=variant, env=env, **kwargs)


@pytest.mark.parametrize("driver", [REFUSE, ACCEPT], ids=["refused", "accepted"])
def test_managed_all_steps_are_prefetched_in_batches(run_program, driver):
    expected = run_program("pool_prefetch", "steps", STEPS, pump=False, env=driver).result
    run = steps(run_program, driver)
    result, totals = run.result, run.totals
    assert run.proc.stderr == ""
    assert result["managed"] == 1 and result["checksum"] == expected["checksum"]
    # every later step's allocations prefetched, one batch a launch, nothing faulted
    assert result["gpu_faults"] == 0, result
    assert result["batch_prefetch_calls"] == (STEPS - 1) * LAUNCHES_A_STEP and result["prefetch_calls"] == 0, result
    assert totals["prefetch_refusals"] == 0 and totals["errors"] == 0
    assert totals["managed_all_allocs"] == STEPS * LAUNCHES_A_STEP
    if driver is ACCEPT:  # the managed pool, as before
        assert totals["unpooled_allocs"] == 0 and totals["unpooled_reuses"] == 0
    else:  # threshold 0: each step's blocks go back at its synchronisation, as the pool's would
        assert totals["unpooled_allocs"] == STEPS * LAUNCHES_A_STEP
        assert totals["unpooled_releases"] == STEPS * LAUNCHES_A_STEP


def test_a_pool_refused_after_its_probe_gives_way_to_cuMemAllocManaged(run_program):
    """An H200's driver 580 took managed_all's probe of the device's pool, then refused 151 of the
    pool's allocations in a GPT-2 run (bench/results/gpu-20261126-nvidia-h200): their pages reached
    the GPU by faults, outside pump's budget. Here fakecuda takes the probe and the first step's three
    ranges, then refuses: the second step's three pool allocations are refused and fault in; from
    then on the device's stream-ordered allocations are cuMemAllocManaged's, prefetched in batches.
    Before: every later step's pool memory refused too (576 faults, 192 in the last step, no batch
    taken, unpooled_allocs 0)."""
    expected = run_program("pool_prefetch", "steps", STEPS, pump=False, env=ACCEPT).result
    refused_after = {"FAKECUDA_POOL_PREFETCH_REFUSE_AFTER": str(1 + LAUNCHES_A_STEP), "PUMP_LOG": "1"}
    run = steps(run_program, ACCEPT, env=refused_after)
    result, totals = run.result, run.totals
    assert result["managed"] == 1 and result["checksum"] == expected["checksum"]
    assert totals["prefetch_refusals"] == LAUNCHES_A_STEP and result["gpu_faults"] > 0  # the second step's
    assert result["last_gpu_faults"] == 0, result
    assert result["batch_prefetch_calls"] == (STEPS - 2) * LAUNCHES_A_STEP and result["prefetch_calls"] == 0, result
    assert totals["unpooled_allocs"] == (STEPS - 2) * LAUNCHES_A_STEP
    assert totals["managed_all_allocs"] == STEPS * LAUNCHES_A_STEP and totals["errors"] == 0
    said = "device 0's driver refused to prefetch managed pool memory it had prefetched before (CUresult 1)"
    assert run.proc.stderr.count(said) == 1, run.proc.stderr


def test_a_context_synchronisation_gives_unpooled_blocks_back(run_program):
    """Threshold 0: a cuCtxSynchronize shows every free of its context ran, as a stream's does."""
    run = steps(run_program, REFUSE, mode="steps-context")
    assert run.result["managed"] == 1 and run.result["gpu_faults"] == 0
    assert run.totals["unpooled_releases"] == run.totals["unpooled_allocs"] == STEPS * LAUNCHES_A_STEP


def test_unpooled_blocks_follow_pytorchs_threshold(run_program):
    """PyTorch's cudaMallocAsync backend sets UINT64_MAX: freed blocks are kept and handed out
    again (the first step's three, at the same addresses), a trim gives them back."""
    run = run_program("pool_steps", 5, "pytorch", env=dict(MANAGED_ALL, **REFUSE))
    assert run.proc.stderr == ""
    assert run.result["managed"] == 1 and run.result["same_address"] == 1 and run.result["gpu_faults"] == 0
    totals = run.totals
    assert totals["unpooled_allocs"] == 1 and totals["unpooled_reuses"] == 5
    assert totals["unpooled_releases"] == 1  # torch.cuda.empty_cache()'s trim


@pytest.mark.parametrize("driver", [REFUSE, ACCEPT], ids=["refused", "accepted"])
def test_a_refused_range_keeps_batching(run_program, driver):
    expected = run_program("pool_prefetch", "refused", LAUNCHES, pump=False, env=driver).result
    run = run_program("pool_prefetch", "refused", LAUNCHES, env=driver)
    result, totals = run.result, run.totals
    assert result["managed"] == 1 and result["checksum"] == expected["checksum"]
    assert result["prefetch_calls"] == 0, result  # batches only, after the refusal too
    if driver is REFUSE:
        # the fill of each fresh buffer: one batch; the add: the pool's buffer left out, the
        # fresh one believed resident: no call
        assert result["batch_prefetch_calls"] == LAUNCHES - 1
        assert totals["prefetch_refusals"] == 1 and totals["prefetch_refused_skips"] == LAUNCHES
    else:
        assert result["batch_prefetch_calls"] == 2 * (LAUNCHES - 1)
        assert totals["prefetch_refusals"] == 0


def test_a_broken_batch_entry_point_marks_nothing(run_program):
    """Every batch fails (CUDA_ERROR_UNKNOWN) while each range alone is taken: no allocation is
    marked, nothing faults, and after 8 such batches in a row pump makes one call per range."""
    run = steps(run_program, REFUSE, env={"FAKECUDA_FAIL": "cuMemPrefetchBatchAsync=999"})
    result, totals = run.result, run.totals
    launches = STEPS * LAUNCHES_A_STEP
    assert result["gpu_faults"] == 0 and result["batch_prefetch_calls"] == 0
    assert totals["prefetch_refusals"] == 0 and totals["errors"] == 1
    assert totals["launches_prefetched"] == launches
    assert totals["prefetch_calls"] == launches + 8  # each launch's range alone, and the 8 failed batches


@pytest.mark.parametrize("variant", ["asan", "tsan"])
def test_under_sanitizers(run_program, variant):
    env = dict(ASAN_OPTIONS="detect_leaks=1:abort_on_error=0", UBSAN_OPTIONS="print_stacktrace=1",
               TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1")
    for driver in (REFUSE, ACCEPT):
        run = steps(run_program, driver, variant=variant, env=env, timeout=600)
        assert run.proc.returncode == 0, run.proc.stderr[-4000:]
        assert "Sanitizer" not in run.proc.stderr and "runtime error" not in run.proc.stderr, run.proc.stderr[-4000:]
        assert run.result["managed"] == 1 and run.result["gpu_faults"] == 0, run.result
    run = run_program("pool_prefetch", "refused", LAUNCHES, variant=variant, env=dict(env, **REFUSE), timeout=600)
    assert "Sanitizer" not in run.proc.stderr and "runtime error" not in run.proc.stderr, run.proc.stderr[-4000:]
    assert run.result["prefetch_calls"] == 0
    # kept blocks handed out again and trimmed
    run = run_program("pool_steps", 5, "pytorch", variant=variant, env=dict(env, **MANAGED_ALL, **REFUSE), timeout=600)
    assert "Sanitizer" not in run.proc.stderr and "runtime error" not in run.proc.stderr, run.proc.stderr[-4000:]
    assert run.result["same_address"] == 1 and run.totals["unpooled_releases"] == 1
