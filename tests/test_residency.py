"""Residency beliefs across steps that each end with a synchronisation (issue 15 item 1), on
fakecuda (tests/c/steady_steps.c: weights kept, an activation freed and handed out again at the
same address every step, `.item()`'s synchronisation after each).

Residency belongs to the memory: under managed_all a synchronisation moves no page of memory
the program believes is device memory, and a tensor the caching allocator hands out again keeps
what pump knew of it. Memory pump discarded, or memory the program allocated managed itself
(the host may touch it after a synchronisation), is prefetched again."""

import subprocess

import pytest

MIB = 1 << 20
WEIGHTS, ACTIVATION = 8 * MIB, 6 * MIB  # tests/c/steady_steps.c
STEPS = 5
ROUNDS = 40  # tests/c/carve_race.c: 640 launches, as many changes of the carved segment
MANAGED_ALL = {"PUMP_MANAGED_ALL": "1"}


def steps(run_program, mode, variant="plain", env=None):
    expected = run_program("steady_steps", STEPS, mode, pump=False).result
    run = run_program("steady_steps", STEPS, mode, variant=variant, env={**MANAGED_ALL, **(env or {})})
    assert run.result["checksum"] == expected["checksum"]
    assert run.totals["errors"] == 0
    return run


@pytest.mark.parametrize("variant", ["plain", "asan", "tsan"])
def test_caching_allocator_steps_prefetch_once(run_program, variant):
    # Before: every step prefetched its weights and activation again (prefetch calls per step
    # [1, 1, 1, 1, 1], 70 MiB asked over 5 steps, all of it resident). Now: step 1 only.
    run = steps(run_program, "caching", variant)
    assert run.result["prefetch_calls"] == [1] + [0] * (STEPS - 1)
    # Nor does pump ask the driver for the launch stream's context again (before: 2 context
    # queries per step, one cuStreamGetCtx per launch).
    assert run.result["context_queries"][1:] == [0] * (STEPS - 1)
    assert run.totals["prefetch_bytes"] == WEIGHTS + ACTIVATION
    assert run.totals["epoch_reprefetches"] == 0


@pytest.mark.parametrize("variant", ["plain", "asan", "tsan"])
def test_a_freed_tensor_keeps_its_blocks_under_a_budget(run_program, variant):
    # Under a budget that holds the weights and the activation (14 MiB), the activation the
    # caching allocator hands out again is still believed resident, and counted: step 1
    # prefetches, no step after, and nothing is evicted. Before, a freed tensor's blocks left
    # the accounting under a budget: prefetch calls [1, 1, 1, 1, 1], 38 MiB asked of which 24
    # MiB were resident.
    run = steps(run_program, "caching", variant, env={"PUMP_BUDGET": "14MiB"})
    assert run.result["prefetch_calls"] == [1] + [0] * (STEPS - 1)
    assert run.totals["prefetch_bytes"] == WEIGHTS + ACTIVATION
    assert run.totals["evictions"] == 0 and run.totals["resident_bytes_peak"] == WEIGHTS + ACTIVATION


@pytest.mark.parametrize("variant", ["plain", "asan", "tsan"])
@pytest.mark.parametrize("budget", [None, "14MiB"])
def test_memory_carved_anew_keeps_its_residency(run_program, variant, budget):
    # PyTorch's allocator splits and merges its blocks: the activation's 6 MiB is one tensor,
    # then two split 2.5 MiB in, then two split 1 MiB in (steady_steps split). A tensor carved
    # over freed ones of other extents takes what pump knew of its memory, and what is left of
    # them outside it stays known, so only step 1 prefetches; under a budget that holds it all,
    # the memory counts once and nothing is evicted. Before (PyTorch's real allocator on
    # fakecuda: 58 prefetch calls a step of memory already resident), prefetch calls per step
    # [1, 2, 2, 1, 2]: each new extent believed nowhere.
    run = steps(run_program, "split", variant, env={"PUMP_BUDGET": budget} if budget else None)
    assert run.result["prefetch_calls"] == [1] + [0] * (STEPS - 1)
    assert run.totals["prefetch_bytes"] == WEIGHTS + ACTIVATION
    assert run.totals["evictions"] == 0
    if budget:
        assert run.totals["resident_bytes_peak"] == WEIGHTS + ACTIVATION


@pytest.mark.parametrize("variant", ["plain", "asan", "tsan"])
def test_memory_carved_anew_while_another_thread_launches(run_program, variant):
    # tests/c/carve_race.c: one thread hands a 16 MiB segment out in ever other extents, freeing
    # them again, while another launches over it under a 4 MiB budget: the replacement of
    # records and their residency races the launch rule's decisions and evictions. No sanitizer
    # report, no deadlock, the bare run's values, the budget held, and nothing left counted.
    env = {"PUMP_BUDGET": "4MiB", "TSAN_OPTIONS": "halt_on_error=1"}
    bare = run_program("carve_race", ROUNDS, pump=False).result
    run = run_program("carve_race", ROUNDS, variant=variant, env=env, timeout=600)
    assert run.proc.returncode == 0, run.proc.stderr[-4000:]
    assert "Sanitizer" not in run.proc.stderr and "runtime error" not in run.proc.stderr, run.proc.stderr[-4000:]
    assert run.result["checksum"] == bare["checksum"]
    t = run.totals
    assert t["errors"] == 0 and t["torch_tensor_allocs"] == t["torch_tensor_frees"] > ROUNDS
    assert t["evictions"] > 0 and t["resident_bytes_peak"] <= 4 * MIB and t["resident_bytes"] == 0


def test_discarded_memory_handed_out_again_is_prefetched_again(run_program):
    # pump's allocator discards each dead activation; the next one at its address is prefetched
    # again (a discard is undone only by a write or a prefetch), the weights never again.
    # Before: 70 MiB asked over 5 steps, the weights every step.
    run = steps(run_program, "pluggable")
    assert run.result["prefetch_calls"] == [1] * STEPS
    assert run.totals["prefetch_bytes"] == WEIGHTS + STEPS * ACTIVATION
    assert run.totals["bytes_discarded"] == STEPS * ACTIVATION + WEIGHTS  # the weights at the end


def test_memory_the_program_made_managed_expires_at_synchronisations(run_program):
    # The host may touch it after a synchronisation: each step prefetches it again.
    run = steps(run_program, "managed")
    assert run.result["prefetch_calls"] == [1] * STEPS
    assert run.totals["prefetch_bytes"] == STEPS * (WEIGHTS + ACTIVATION)


def test_the_epoch_of_launches_prefetches_again_and_counts_it(run_program):
    # The safety net: every 4 managed launches (2 per step) every belief expires; the launch that
    # starts an epoch (the update of steps 2 and 4) prefetches its 7 blocks again.
    run = steps(run_program, "caching", env={"PUMP_EPOCH_LAUNCHES": "4"})
    assert run.result["prefetch_calls"] == [1, 1, 0, 1, 0]
    assert run.totals["epoch_reprefetches"] == 2 * (WEIGHTS + ACTIVATION) // (2 * MIB)


@pytest.mark.parametrize("variant", ["plain", "tsan"])
def test_the_legacy_streams_context_follows_the_current_one(run_program, variant):
    # Each step makes another device's context current and launches on the legacy stream: pump
    # remembers the stream's context, and forgets it at cuCtxSetCurrent. Without that (the
    # hook not forgetting), 448 GPU faults: prefetches went to the previous step's device.
    two = {"FAKECUDA_DEVICES": "2"}
    bare = run_program("steady_steps", STEPS, "switch", pump=False, env=two).result
    assert bare["gpu_faults"] > 0
    run = run_program("steady_steps", STEPS, "switch", variant=variant, env={**MANAGED_ALL, **two})
    assert run.result["checksum"] == bare["checksum"] and run.result["gpu_faults"] == 0
    assert run.result["prefetch_calls"] == [1] * STEPS and run.totals["errors"] == 0


@pytest.mark.parametrize("variant", ["plain", "asan", "tsan"])
def test_victims_keep_the_launch_rules_order(c_build, variant):
    """tests/c/evict_order.c: random jobs over the rules' steps (launches making room, uses of
    resident blocks, frees, tensors taken over, plan triggers naming blocks, uses recorded late
    by a racing thread); every victim search's victims are, in order, those of a sort of all the
    device's resident blocks, the launch rule's order before shim/policy/residency_rank.c kept it. Then
    threads record uses and frees while launches make room (TSan: without the device locks
    pump_rank_used takes, a data race)."""
    proc = subprocess.run([str(c_build / variant / "evict_order")], capture_output=True, text=True, timeout=300,
                          env={"TSAN_OPTIONS": "halt_on_error=1", "ASAN_OPTIONS": "detect_leaks=1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().endswith(", 0 failed"), proc.stdout
