"""pump's allocator for PyTorch places a training step's tensors where they went the step
before (issue 41 item 1, shim/policy/placement.c), so that the launch keys pumpd's lookahead plans by
repeat: tests/c/torch_placement.c makes a step's allocations as PyTorch's pluggable allocator
does, with the optimizer's step marks, and prints each step's addresses.

fakecuda's pools hand out, of several freed blocks of a size, the one reserved last by default;
FAKECUDA_POOL_REUSE=freed hands out the one freed last, under which two temporaries freed first
in, first out swap blocks every step (which the driver's pool does is not documented). Placement
must hold the addresses either way, keep the values (fakecuda runs the kernels), and fall back
where a step differs (an evaluation pass before it) without losing the next step's places."""

import json

import pytest

STEPS, EVAL = 10, 4
MANAGED_ALL = {"PUMP_MANAGED_ALL": "1", "PUMP_SOCKET": "", "TSAN_OPTIONS": "halt_on_error=1"}


def steps_of(run_program, *, pump=True, placement=True, pool_reuse="freed", variant="plain", extra=("eval=4", "side"),
             env=None, steps=STEPS):
    env = dict(MANAGED_ALL, FAKECUDA_POOL_REUSE=pool_reuse, PUMP_TORCH_PLACEMENT="1" if placement else "0",
               **(env or {}))
    run = run_program("torch_placement", steps, *extra, pump=pump, variant=variant, env=env, timeout=600)
    assert run.proc.returncode == 0, run.proc.stderr[-4000:]
    assert "Sanitizer" not in run.proc.stderr and "runtime error" not in run.proc.stderr, run.proc.stderr[-4000:]
    return run


def training_steps(steps):
    """The steps with no evaluation pass before them (the program's eval=4), from the second on:
    the first is made before any mark, and its successor has no earlier step to follow."""
    return [s for i, s in enumerate(steps) if i >= 1 and i % EVAL != 0]


@pytest.mark.parametrize("pool_reuse", ["created", "freed"])
@pytest.mark.parametrize("variant", ["plain", "asan", "tsan"])
def test_each_step_gets_the_addresses_of_the_step_before(run_program, variant, pool_reuse):
    bare = steps_of(run_program, pump=False, pool_reuse=pool_reuse).result
    run = steps_of(run_program, variant=variant, pool_reuse=pool_reuse)
    result, t = run.result, run.totals
    assert result["checksum"] == bare["checksum"]
    steps = result["steps"]
    assert len(steps) == STEPS and all(len(s) == 7 for s in training_steps(steps))
    # From the second step on, every step without an evaluation pass has the same addresses, the
    # ones after an evaluation pass included; the steps with one agree with each other too.
    assert training_steps(steps) == [steps[1]] * len(training_steps(steps)), steps
    assert steps[EVAL] == steps[2 * EVAL] and len(steps[EVAL]) == 9
    assert t["placement_steps"] == STEPS
    assert t["placement_hits"] == t["placement_wanted"] > 0
    assert t["placement_reuses"] > 0 and t["placement_releases"] == 0
    assert t["torch_allocs"] == t["torch_frees"] and t["errors"] == 0


def test_without_placement_a_pool_handing_out_the_last_freed_block_moves_tensors(run_program):
    """What placement guards against: the two temporaries swap blocks from one step to the next."""
    run = steps_of(run_program, placement=False)
    steps = training_steps(run.result["steps"])
    assert any(a != b for a, b in zip(steps, steps[1:])), steps
    assert run.totals["placement_steps"] == 0 and run.totals["placement_reuses"] == 0


def test_a_placed_tensor_keeps_what_pump_knew_of_its_memory(run_program):
    """A block placement keeps stays in pump's table as a freed tensor, and the allocation placed
    on it takes back its residency: a step's tensors are not prefetched again each step for having
    been freed and allocated again (before: 76 prefetch calls in the run, the same as without
    placement; since: 14, the first steps')."""
    placed, unplaced = steps_of(run_program), steps_of(run_program, placement=False)
    assert placed.result["checksum"] == unplaced.result["checksum"]
    p, u = placed.totals, unplaced.totals
    assert p["prefetch_calls"] * 4 <= u["prefetch_calls"], (p["prefetch_calls"], u["prefetch_calls"])
    assert placed.result["checksum"] and p["errors"] == 0


SHRINK = 5


def test_a_shape_that_changes_is_followed_and_its_old_blocks_go_back(run_program):
    """From step 5 on the activations are 3 MiB instead of 4 (a shorter last batch, a changed
    sequence length): that step agrees with no earlier one past its first allocation, the next
    follows it, and the two 4 MiB blocks no step asks for again go back to the pool once three
    steps passed without taking them."""
    bare = steps_of(run_program, pump=False, extra=(f"shrink={SHRINK}",)).result
    run = steps_of(run_program, extra=(f"shrink={SHRINK}",))
    t, steps = run.totals, run.result["steps"]
    assert run.result["checksum"] == bare["checksum"] and t["errors"] == 0
    assert steps[1:SHRINK] == [steps[1]] * (SHRINK - 1), steps
    assert steps[SHRINK + 1:] == [steps[SHRINK + 1]] * (STEPS - SHRINK - 1), steps
    assert t["placement_releases"] == 2



# fakecuda takes the pool's first 13 prefetches (the probe's, and those of steps 0 and 1 but the
# last), and refuses every later one.
REFUSED_AFTER_13 = {"FAKECUDA_POOL_PREFETCH_REFUSE_AFTER": "13"}


@pytest.mark.parametrize("variant", ["plain", "tsan"])
def test_a_pool_the_driver_stops_prefetching_hands_out_no_more_blocks(run_program, variant):
    """An H200's driver 580 took managed_all's probe of the device's pool, then refused 151 of the
    pool's allocations in a GPT-2 run (bench/results/gpu-20261126-nvidia-h200), while placement
    handed the pool's blocks out again step after step, outside pump's control. Here the refusal
    comes in step 1: the device turns to cuMemAllocManaged, the pool's blocks pump kept go back to
    it and none is handed out again, and from step 2 on the tensors are cuMemAllocManaged's, placed
    as before. Before: the pool's blocks, the refused one included, taken again every step
    (placement_reuses 62, placement_releases 0, unpooled_allocs 0)."""
    bare = steps_of(run_program, pump=False).result
    run = steps_of(run_program, variant=variant, env=REFUSED_AFTER_13)
    result, t = run.result, run.totals
    assert result["checksum"] == bare["checksum"] and t["errors"] == 0
    assert t["prefetch_refusals"] == 1
    steps = training_steps(result["steps"])  # steps 1, 2, 3, 5, ...
    assert steps[1] != steps[0] and steps[1:] == [steps[1]] * (len(steps) - 1), result["steps"]
    assert t["placement_reuses"] < len(steps[0]), t["placement_reuses"]  # step 1's only, before the refusal
    assert t["unpooled_allocs"] > 0 and t["unpooled_reuses"] > t["unpooled_allocs"]
    assert t["torch_allocs"] == t["torch_frees"]
    # The pool's kept blocks go back at once, not once placement's 3 steps without a taker passed:
    # in a run of 3 steps the blocks kept in step 1 would still be kept at its end (before: 0).
    short = steps_of(run_program, variant=variant, env=REFUSED_AFTER_13, steps=3).totals
    assert short["prefetch_refusals"] == 1 and short["placement_releases"] > 0 and short["errors"] == 0


def test_placed_tensors_stay_under_the_budget(run_program, tmp_path):
    """A placed tensor's memory stays in pump's view after its first free: the allocation pump's
    allocator keeps is carved into a segment of its own, and its record, residency included, is the
    tensor's (shim/lookup/ranges.c). Before, the allocation's record went (its blocks counted out,
    its pages still on the GPU) and the tensor came back without blocks: never prefetched, never
    evicted, never counted, so under a budget the device filled with memory pump did not know of
    (a real-client GPT-2 under lookahead: 700 MiB of a 1.6 GB device, 54,000 faults a step). Here
    under a 12 MiB budget on fakecuda's 80 GB device, where nothing but pump evicts, the device
    holds 10.1 MiB at the end, pump believing 10.0 (before: 22.1 MiB)."""
    fake = tmp_path / "fakecuda.json"
    run = steps_of(run_program, env={"PUMP_BUDGET": "12MiB", "FAKECUDA_STATS": str(fake)})
    bare = steps_of(run_program, pump=False).result
    t, device = run.totals, json.loads(fake.read_text())
    assert run.result["checksum"] == bare["checksum"] and t["errors"] == 0
    assert t["placement_reuses"] > 0 and t["evictions"] > 0
    assert device["device_resident_bytes"] <= 12 << 20, (device["device_resident_bytes"], t["resident_bytes"])


@pytest.mark.parametrize("variant", ["plain", "tsan"])
def test_dead_placed_tensors_are_discarded_on_the_legacy_stream(run_program, tmp_path, variant):
    """With PUMP_HELD_DISCARDS=1, pump's allocator discards the dead tensors of the blocks it keeps
    for placement (managed_all_cache.c) once the GPU has passed their frees: nothing of the
    program's touches such a block until pump hands it out again, so the discard waits for no
    stream of the program's and is made on pump's worker (shim/policy/held_discards.c), the legacy
    stream's tensors included, where the driver refuses a discard and pump discarded none before.
    The program frees each step's activations and temporaries while the kernels reading them wait
    behind a host function (`hold`): taken as passed before the GPU got there, they are discarded
    early and the sums come out NaN. The values stay the bare run's (fakecuda poisons discarded
    memory and counts a discard racing a move), and under a 16 MiB budget the evictions copy
    168 MiB out against 198 MiB without (17 tensors discarded). Off by default: none then."""
    def run(name, **env):
        fake = tmp_path / f"{name}.json"
        done = steps_of(run_program, extra=("legacy", "hold"), variant=variant,
                        env={"PUMP_BUDGET": "16MiB", "FAKECUDA_STATS": str(fake), **env})
        return done, json.loads(fake.read_text())
    bare = steps_of(run_program, pump=False, extra=("legacy", "hold")).result
    (discarding, device), (keeping, _) = run("discarding", PUMP_HELD_DISCARDS="1"), run("keeping")
    t, k = discarding.totals, keeping.totals
    assert discarding.result["checksum"] == keeping.result["checksum"] == bare["checksum"]
    assert t["errors"] == 0 and t["placement_reuses"] > 0
    assert t["held_discards"] > 0 and t["bytes_discarded"] >= t["held_discards"] * (2 << 20), t
    assert t["worker_jobs"] > 0
    assert device.get("discard_races", 0) == 0 and device.get("bytes_read_discarded", 0) == 0, device
    assert k["held_discards"] == 0 and k["bytes_discarded"] == 0
    assert t["bytes_evicted"] < k["bytes_evicted"], (t["bytes_evicted"], k["bytes_evicted"])
