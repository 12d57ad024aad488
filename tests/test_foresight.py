"""Foresight (pump/foresight.py): iteration detection, Belady planning, budget, lifetime."""

import numpy as np
import pytest

from pump import channel
from pump.channel import NAMES_BASE
from pump.foresight import BLOCK, Foresight, discard_range, plan_cycle
from pump.iteration import MATCH_WINDOW, IterationDetector
from helpers import make_plan_pages, ringless_session
from synthetic_trace import BASE, MIB, TraceBuilder, training_trace


def _observe_in_batches(t, f, launches_per_batch=7):
    recs = np.concatenate(t.records)
    starts = np.flatnonzero(recs["kind"] == channel.KIND["launch"])
    for part in np.split(recs, starts[launches_per_batch::launches_per_batch]):
        f.observe(channel.decode(part))


def _periods_in_batches(t, launches_per_batch):
    """The period Foresight has learned after each batch of the trace, read in batches."""
    f = Foresight(64 * MIB, 50e9)
    periods = []
    recs = np.concatenate(t.records)
    starts = np.flatnonzero(recs["kind"] == channel.KIND["launch"])
    for part in np.split(recs, starts[launches_per_batch::launches_per_batch]):
        f.observe(channel.decode(part))
        periods.append(f.period)
    return periods


def test_detects_the_training_period():
    t, _, _ = training_trace(steps=4, layers=6)
    f = Foresight(64 * MIB, 50e9)
    _observe_in_batches(t, f)
    assert f.learned and f.period == 12
    assert f.triggers() and all(isinstance(k, int) and k for k in f.triggers())


def test_not_learned_from_one_iteration():
    t, _, _ = training_trace(steps=1, layers=6)
    f = Foresight(64 * MIB, 50e9)
    f.observe(t.batch())
    assert not f.learned and f.triggers() == {}


def test_eval_step_and_short_last_batch_do_not_derail_it():
    t, _, _ = training_trace(steps=7, layers=6, eval_after=3, short_last=True)
    periods = _periods_in_batches(t, 5)
    learned = [p for p in periods if p]
    assert learned and set(learned) == {12}, periods


def test_relearns_after_a_lasting_change():
    t, weights, acts = training_trace(steps=3, layers=4)
    # The program changes for good (other kernels, a different order): relearnt once the
    # detector's window holds only the new program.
    for s in range(MATCH_WINDOW // 4 + 2):
        for i in range(4):
            t.launch(900 + i, [acts[i]], [(acts[i], MIB, True)])
    f = Foresight(64 * MIB, 50e9)
    _observe_in_batches(t, f, 64)
    # Learnt while the window still held the change: a multiple of the new program's period
    # (the plan then covers two of its iterations), of its keys only.
    assert f.period in (4, 8) and set(f.schedule_keys.tolist()) == set(f.detector.keys[-4:].tolist())


def test_a_multiple_of_the_step_learned_once_gives_way_to_the_step():
    """Three steps whose keys differ (the real client's first steps under load, before its tensors
    were placed) repeat once, so a period of three steps is learned; then every step is the same.
    Its keys are all in that schedule, which held for good (the real client learned 1,353
    launches for its 451-launch step): the step is learned once the last learned period repeats
    under it."""
    t, weights, acts = training_trace(steps=0, layers=4)
    others = [t.alloc(4 * MIB) for _ in range(8)]

    def step(a):
        for i in range(4):
            t.launch(100 + i, [weights[i], a[i]], [(a[i], MIB, True)])

    for _ in range(2):   # three steps on other activations, twice: a period of 12 launches
        step(acts)
        step(others[:4])
        step(others[4:])
    for _ in range(8):   # then the step itself, on the first step's activations
        step(acts)
    periods = _periods_in_batches(t, 4)
    assert 12 in periods and periods[-1] == 4, periods


def test_a_launch_that_differs_every_other_step_does_not_make_the_step_flip_with_its_double():
    """One launch of a 21-launch step takes an extra allocation every other step (the real
    client under PUMP_TORCH_NAMES=1 under load: 7 of its 451 launches, an argument word that
    fell in a tensor or not). Read in small batches, a batch holding that launch's other key
    was beyond the tolerance, the detector anchored on that rarer key found two steps, and the
    next batch gave way to the step again: 451 and 902 in turn, a plan made anew each time,
    and pump-run said whichever came last. A period found is first cut to its shortest divisor
    under which the last period repeats."""
    t, weights, acts = training_trace(steps=0, layers=4)
    extra = t.alloc(4 * MIB)
    for s in range(40):
        for i in range(21):
            bases = [weights[i % 4], acts[i % 4]] + ([extra] if i == 20 and s % 2 else [])
            t.launch(100 + i, bases, [(acts[i % 4], MIB, True)])
    learned = [p for p in _periods_in_batches(t, 4) if p]
    assert learned and set(learned) == {21}, learned


@pytest.mark.parametrize("steps", [3, 6, 40])
def test_a_short_run_inside_the_iteration_is_not_the_iteration(steps):
    """bench/gpu/chain.py's step as the H100 ran it (pairs 4, repeat 4): saxpy and scale on one
    pair four times, then the next pair; matching the last period against only the one before
    took the alternation for the iteration (2 launches) wherever a read ended inside a pair."""
    step = [key for pair in range(4) for _ in range(4) for key in (10 + 2 * pair, 11 + 2 * pair)]
    d = IterationDetector()
    found = set()
    for s in range(steps):
        for cut in range(0, len(step), 5):  # reads end everywhere in a step
            d.extend(np.array(step[cut:cut + 5], np.uint64))
            if s >= 2:  # before two steps the history may be periodic at 2 (then relearnt)
                found.add(d.detect())
    assert found <= {0, len(step)} and len(step) in found


def test_detector_tolerates_a_few_differences():
    d = IterationDetector(tolerance=0.1)
    seq = np.tile(np.arange(1, 21, dtype=np.uint64), 3)
    seq[45] = 999  # one launch in 20 differs in the last period
    d.extend(seq)
    assert d.detect() == 20
    strict = IterationDetector(tolerance=0.0)
    strict.extend(seq)
    assert strict.detect() != 20


def _misses(uses, sizes, budget, evict_rule):
    """Loads of a cyclic schedule played with `evict_rule` (returns the victim)."""
    resident, loads = [], 0
    for _ in range(3):
        for i, blocks in enumerate(uses):
            for b in blocks:
                if b in resident:
                    continue
                while sum(sizes[x] for x in resident) + sizes[b] > budget:
                    resident.remove(evict_rule(resident, i))
                resident.append(b)
                loads += 1
    return loads


def test_belady_plan_beats_least_recently_migrated_on_a_cycle():
    uses = [(b * BLOCK,) for b in range(8)]          # a cycle over 8 blocks
    sizes = {b * BLOCK: BLOCK for b in range(8)}
    budget = 4 * BLOCK
    prefetch, evict = plan_cycle(uses, sizes, [1e-3] * 8, budget, horizon_seconds=1.0)
    # Play the plan as the shim does: a block missing at its launch comes in then (evicting the
    # least recently used block), then the trigger's evictions and prefetches.
    resident, misses = [], 0
    for cycle in range(3):
        for i, blocks in enumerate(uses):
            for b in blocks:
                if b not in resident:
                    misses += cycle == 2
                    if len(resident) == 4:
                        resident.pop(0)
                    resident.append(b)
                else:
                    resident.append(resident.pop(resident.index(b)))
            resident = [b for b in resident if b not in evict[i]]
            resident += [b for b in prefetch[i] if b not in resident]
            assert len(resident) <= 4
    lrm = _misses(uses, sizes, budget, lambda resident, i: resident[0]) / 3
    assert lrm == 8                      # LRM misses every access of a cycle larger than memory
    assert misses <= 8 - 3               # Belady keeps all but one block of the budget


def test_evictions_come_after_the_last_use():
    uses = [(0,), (BLOCK,), (2 * BLOCK,), (0, 3 * BLOCK), (BLOCK,), (4 * BLOCK,)]
    sizes = {b * BLOCK: BLOCK for b in range(5)}
    prefetch, evict = plan_cycle(uses, sizes, [1e-3] * 6, 2 * BLOCK, horizon_seconds=1.0)
    assert any(evict)
    for i, victims in enumerate(evict):
        for v in victims:  # the launch the eviction follows is the block's last user
            assert v in uses[i] or v in prefetch[i - 1], (i, v)


def test_an_eviction_waits_for_the_free_that_makes_it_copy_nothing():
    """A victim the framework frees between its last use and the launch that needs its room
    is evicted after the free (the shim discards at the free: nothing is copied back), and the
    prefetch that needed the room follows it; a free at the needing launch is too late."""
    a, b, y = 0, BLOCK, 2 * BLOCK
    uses = [(a,), (b,), (a,), (a,), (y,)]      # at y, b (used again furthest) makes room
    sizes = {a: BLOCK, b: BLOCK, y: BLOCK}
    plain = plan_cycle(uses, sizes, [1e-4] * 5, 2 * BLOCK, horizon_seconds=1.0)
    freed = plan_cycle(uses, sizes, [1e-4] * 5, 2 * BLOCK, 1.0, freed=[(), (), (), (b,), ()])
    late = plan_cycle(uses, sizes, [1e-4] * 5, 2 * BLOCK, 1.0, freed=[(), (), (), (), (b,)])
    assert b in plain[1][1] and y in plain[0][1]            # after b's last use
    assert b in freed[1][3] and not b in freed[1][1] and y in freed[0][3]
    assert late == plain


def test_lookahead_horizon_follows_bandwidth():
    a, b, c = 0, BLOCK, 2 * BLOCK
    uses = [(a,)] + [(c,)] * 14 + [(b, c)]   # room for b exists from launch 0 on (a is done)
    sizes = {a: BLOCK, b: BLOCK, c: BLOCK}
    far, _ = plan_cycle(uses, sizes, [1e-4] * 16, 2 * BLOCK, horizon_seconds=1.0)
    near, _ = plan_cycle(uses, sizes, [1e-4] * 16, 2 * BLOCK, horizon_seconds=2.5e-4)
    assert b in far[0]                        # as early as the room allows
    assert b in near[12] and not any(b in p for p in near[:12])  # 3 launches of 0.1 ms ahead


def test_discard_is_aligned_inward():
    assert discard_range(BLOCK + 4096, 3 * BLOCK) == (2 * BLOCK, 2 * BLOCK)
    assert discard_range(BLOCK + 4096, BLOCK) is None
    assert discard_range(2 * BLOCK, 2 * BLOCK) == (2 * BLOCK, 2 * BLOCK)


def test_need_is_the_touched_blocks_not_the_whole_allocation():
    t = TraceBuilder()
    seg = t.alloc(32 * MIB)                  # one allocator segment, two tensors in it
    for s in range(3):
        t.launch(1, [seg], [(seg + 3 * MIB, 2 * MIB, True)])   # blocks 1 and 2 of 16
        t.launch(2, [seg], [(seg + 20 * MIB, 100, False)])     # block 10
    f = Foresight(64 * MIB, 50e9)
    f.observe(t.batch())
    assert f.learned
    key1, key2 = (channel.launch_key(fn, [seg]) for fn in (1, 2))
    assert f.triggers()[key1][0] == [(seg + 2 * MIB, 4 * MIB)]
    assert f.triggers()[key2][0] == [(seg + 20 * MIB, 2 * MIB)]


def test_a_key_met_twice_per_iteration_carries_no_evictions_or_prefetches():
    t = TraceBuilder()
    bufs = [t.alloc(4 * MIB) for _ in range(6)]
    for s in range(4):
        for i in range(6):
            t.launch(10 + i, [bufs[i]], [(bufs[i], 4 * MIB, True)])
            t.launch(99, [bufs[0]], [(bufs[0], MIB, False)])   # the same key six times
    f = Foresight(12 * MIB, 50e9)
    f.observe(t.batch())
    assert f.learned and f.period == 12
    need, prefetch, evict = f.triggers()[channel.launch_key(99, [bufs[0]])]
    assert need == [(bufs[0], 2 * MIB)] and prefetch == [] and evict == []
    assert any(p or e for _, p, e in f.triggers().values())


def test_set_budget_replans_and_launch_seconds_updates():
    t, _, _ = training_trace(steps=4, layers=6)
    f = Foresight(40 * MIB, 50e9)
    f.observe(t.batch())
    tight = f.triggers()
    f.set_budget(1 << 30)                      # all of it fits: nothing to evict
    assert f.changed and not any(e for _, _, e in f.triggers().values())
    assert any(e for _, _, e in tight.values())
    f.set_launch_seconds(2e-3)
    f.observe(training_trace(steps=1, layers=6)[0].batch())
    assert f.seconds[-1] == 2e-3
    for bad in (0, -1):
        with pytest.raises(ValueError, match="allowed > 0"):
            f.set_budget(bad)
        with pytest.raises(ValueError, match="allowed > 0"):
            f.set_launch_seconds(bad)


def test_reserve_follows_bandwidth_and_the_longest_kernel():
    t, _, _ = training_trace(steps=3, layers=4, flops=2e9)
    f = Foresight(64 * MIB, 10e9)
    f.observe(t.batch(), kernel_seconds=np.tile([1e-4] * 7 + [1e-3], 3))
    assert f.reserve_bytes(f.period) == int(10e9 * 1e-3)
    assert Foresight(8 * MIB, 10e9, launch_seconds=1.0).reserve_bytes(0) == 0


def test_detection_in_small_batches_over_a_long_history():
    period = np.arange(1, 1001, dtype=np.uint64)
    d = IterationDetector()
    found = []
    for step in range(5):
        seq = period.copy()
        for part in np.split(seq, range(256, 1000, 256)):
            d.extend(part)
            found.append(d.detect())
    assert found.index(1000) == 7              # two whole periods seen: 2000 keys, 8th batch
    assert set(found[7:]) == {1000}


def test_triggers_publish_into_a_plan():
    t, _, _ = training_trace(steps=4, layers=6)
    f = Foresight(40 * MIB, 50e9)
    f.observe(t.batch())
    plan = channel.Plan.create()
    make_plan_pages(plan.fd)
    try:
        plan.publish(40 * MIB, f.triggers(), f.order)
        assert plan.dropped_triggers == 0 and plan.plan.trigger_count == len(f.triggers())
        assert plan.plan.order == channel.C.PUMP_ORDER_USED
    finally:
        plan.close()


def _cycle_at(bases, steps=4):
    """Training-like steps over five allocations placed at `bases` (in allocation order),
    each launch given two of them; no extents (pumpd's view: allocation bases only)."""
    t = TraceBuilder()
    allocs = []
    for base, size in zip(bases, (6 * MIB, 4 * MIB, 8 * MIB, 4 * MIB, 6 * MIB)):
        t.next_base = base
        allocs.append(t.alloc(size))
    for _ in range(steps):
        for i in (0, 1, 2, 3, 4, 3, 2, 1, 0):
            t.launch(10 + i, [allocs[i], allocs[(i + 2) % 5]])
    return t, allocs


def test_a_plan_does_not_depend_on_where_the_allocations_lie():
    """A replay maps a trace's allocations elsewhere (fakecuda's mmap places them top-down):
    its plan must be the trace's, moved; ranges follow argument order, never address order."""
    up = [BASE + i * 16 * MIB for i in range(5)]
    down = [BASE + (4 - i) * 16 * MIB for i in range(5)]
    plans = []
    for bases in (up, down):
        t, allocs = _cycle_at(bases)
        f = Foresight(14 * MIB, 50e9)
        f.observe(t.batch())
        assert f.learned
        to_up = dict(zip(allocs, up))

        def moved(ranges):
            out = []
            for a, n in ranges:
                base = max(b for b in allocs if b <= a)
                out.append((to_up[base] + a - base, n))
            return out
        keys = {channel.launch_key(10 + i, [allocs[i], allocs[(i + 2) % 5]]): i for i in range(5)}
        plans.append({keys[k]: tuple(moved(r) for r in parts) for k, parts in f.triggers().items()})
    assert plans[0] == plans[1]
    assert any(p or e for _, p, e in plans[0].values())


def test_a_range_never_crosses_allocations():
    t = TraceBuilder()
    a, b = t.alloc(4 * MIB), t.alloc(4 * MIB)       # adjacent: b starts where a ends
    assert b == a + 4 * MIB
    for _ in range(3):
        t.launch(1, [a, b])
        t.launch(2, [a])
    f = Foresight(64 * MIB, 50e9)
    f.observe(t.batch())
    assert f.learned
    need = f.triggers()[channel.launch_key(1, [a, b])][0]
    assert need == [(a, 4 * MIB), (b, 4 * MIB)]      # the shim refuses a range over two allocations


def test_pumpd_takes_no_pause_for_a_kernel_when_a_read_brings_few_launches():
    """pumpd's kernel times are launch intervals with pauses left out (a pause: over
    PAUSE_FACTOR times the median of the recent intervals, not of the read's own few)."""
    lookahead = pytest.importorskip("pumpd.lookahead")
    t, _, _ = training_trace(steps=4, layers=6)
    recs = np.concatenate(t.records)
    launches = np.flatnonzero(recs["kind"] == channel.KIND["launch"])
    gaps = np.full(len(launches), 5_000)              # 5 us a kernel...
    gaps[-2:] = 3_000_000                             # ...then two launches after 3 ms each
    recs["time_ns"][launches] = np.cumsum(gaps)
    la = lookahead.Lookahead(64 * MIB, 50e9)
    la.learn(channel.decode(recs[:launches[-2]]))
    la.learn(channel.decode(recs[launches[-2]:]))   # one read, only those two
    assert la.policy.seconds[-2:].tolist() == [5e-6, 5e-6]
    assert la.policy.reserve_bytes(la.policy.period) == int(50e9 * 5e-6)


def test_a_batch_of_distinct_kernels_is_read_in_linear_time():
    """pumpd reads up to 65,536 launches per batch from a ring a job fills: each new key's
    blocks are found in one pass (a search per key was quadratic: 23 s for this batch)."""
    import time
    rng = np.random.default_rng(1)
    recs = np.zeros(1 << 16, channel.EVENT)
    recs["kind"], recs["count"] = channel.KIND["launch"], 3
    recs["arg"][:, 0] = rng.integers(1, 1 << 40, len(recs), dtype=np.uint64) * 16
    recs["arg"][:, 2:5] = rng.integers(1, 1 << 40, (len(recs), 3), dtype=np.uint64) << 21
    f = Foresight(64 * MIB, 50e9)
    started = time.process_time()
    f.observe(channel.decode(recs))
    assert time.process_time() - started < 3.0


def test_the_blocks_kept_per_launch_key_are_bounded():
    """A ring may name a new launch key in every record: pumpd keeps the blocks of at
    most KEY_CACHE_MAX keys per session, however many batches come."""
    from pump.foresight import KEY_CACHE_MAX
    rng = np.random.default_rng(2)
    f = Foresight(64 * MIB, 50e9)
    for _ in range(3):
        recs = np.zeros(1 << 16, channel.EVENT)
        recs["kind"], recs["count"] = channel.KIND["launch"], 1
        recs["arg"][:, 0] = rng.integers(1, 1 << 40, len(recs), dtype=np.uint64) * 16
        f.observe(channel.decode(recs))
    assert len(f._blocks_of_key) <= KEY_CACHE_MAX


def test_the_frees_carried_to_the_next_launch_are_bounded():
    """A ring may free without ever launching: pumpd carries at most FREED_CARRIED_MAX blocks
    freed after a read's last launch to the next read's first."""
    from pump.foresight import FREED_CARRIED_MAX
    f = Foresight(64 * MIB, 50e9)
    t = TraceBuilder()
    t.alloc(3 * (1 << 15) * BLOCK)               # BASE: the frees fall in a known allocation
    f.observe(t.batch())
    for part in range(3):
        recs = np.zeros(1 << 15, channel.EVENT)
        recs["kind"] = channel.KIND["block_free"]
        recs["arg"][:, 0] = BASE + (np.arange(len(recs), dtype=np.uint64) + part * len(recs)) * BLOCK
        recs["arg"][:, 1] = BLOCK
        batch = channel.decode(recs)
        assert len(batch.block_frees) == len(recs)
        f.observe(batch)
    assert len(f._freed_next) == FREED_CARRIED_MAX


def test_the_history_keeps_the_newest_frees_up_to_its_cap(monkeypatch):
    """A free outside every known allocation is not kept, and the history keeps at most
    FREED_KEPT_MAX freed blocks, the newest: a ring that frees a whole allocation before each
    launch cannot grow pumpd's planner without end."""
    from pump import foresight
    monkeypatch.setattr(foresight, "FREED_KEPT_MAX", 10)
    t = TraceBuilder()
    base = t.alloc(8 * MIB)
    for i in range(20):
        t.block_free(base, 8 * MIB)
        t.block_free(base + (1 << 36), 8 * MIB)      # no allocation there
        t.launch(0x10 + i, [base])
    f = Foresight(64 * MIB, 50e9)
    _observe_in_batches(t, f, 3)
    kept = [blocks for blocks in f.freed if blocks]
    assert kept == [tuple(base + k * BLOCK for k in range(4))] * 2 and f.freed[-2:] == kept
    assert f._freed_kept == 8


@pytest.mark.parametrize("budget_mib", [40, 56, 72])
def test_the_plan_does_not_depend_on_where_the_reads_cut_the_stream(budget_mib):
    """pumpd reads a ring in pieces of any size (the simulator whole steps): the iteration is
    learned at whichever launch a read ends, and planned from its canonical start, so every
    way of cutting the same launches gives the same plan."""
    t, _, _ = training_trace(steps=6, layers=6)
    plans = set()
    for per_batch in (1, 5, 7, 12, 17):
        f = Foresight(budget_mib * MIB, 50e9)
        _observe_in_batches(t, f, per_batch)
        assert f.learned
        plans.add(repr(sorted(f.triggers().items())))
    assert len(plans) == 1


def test_frees_are_placed_at_their_launch_wherever_the_reads_cut_the_stream():
    """A free belongs to the launch after it, also when a read ends between the two: every
    cut gives the same plan; each activation is freed once an iteration, after its backward
    kernel (the last one's before the next step's first launch); the plan differs from the
    one made without the frees."""
    t, _, acts = training_trace(steps=6, layers=6, free_activations=True)
    plans = set()
    for per_batch in (1, 5, 7, 12):
        f = Foresight(40 * MIB, 50e9)
        _observe_in_batches(t, f, per_batch)
        plans.add(repr(sorted(f.triggers().items())))
    assert len(plans) == 1
    freed = [b for blocks in f.freed[-f.period:] for b in blocks]
    assert sorted(freed) == sorted(a + k * BLOCK for a in acts for k in range(2))
    plain = Foresight(40 * MIB, 50e9)
    _observe_in_batches(training_trace(steps=6, layers=6)[0], plain, 7)

    assert f.triggers() != plain.triggers()


def test_pumpd_takes_a_kernels_time_from_its_keys_intervals_not_one_stretched_by_the_host():
    """One launch interval the host stretched (under the pause threshold) is not its kernel's
    time: pumpd gives each launch the median of its key's recent intervals, so the plan's
    room for transfers in flight (the longest kernel) does not follow the stretch."""
    lookahead = pytest.importorskip("pumpd.lookahead")
    t, _, _ = training_trace(steps=4, layers=6)
    recs = np.concatenate(t.records)
    launches = np.flatnonzero(recs["kind"] == channel.KIND["launch"])
    gaps = np.full(len(launches), 5_000)              # 5 us a kernel...
    gaps[-5] = 200_000                                # ...one stretched to 200 us (under 50 x 5 us)
    recs["time_ns"][launches] = np.cumsum(gaps)
    la = lookahead.Lookahead(64 * MIB, 50e9)
    la.learn(channel.decode(recs))
    assert la.policy.seconds.max() == 5e-6
    assert la.policy.reserve_bytes(la.policy.period) == int(50e9 * 5e-6)


def _realloc_in_one_read():
    """A read holding a free and then an allocation at the same base (a caching allocator's
    memory handed out again at once), and a launch on it; the next read launches the kernel
    given it, a key met for the first time."""
    t = TraceBuilder()
    first = t.alloc(4 * MIB)
    t.launch(0x10, [first])
    t.free(first, 4 * MIB)
    t.records.append(np.zeros(1, channel.EVENT))  # the re-allocation, at the same base
    t.records[-1]["kind"], t.records[-1]["arg"][0, :3] = channel.KIND["alloc"], [first, 6 * MIB, 1]
    t.launch(0x20, [first])
    one = t.batch()
    t.records.clear()
    t.launch(0x30, [first])
    return first, one, t.batch()


def test_an_allocation_freed_and_made_again_in_one_read_stays_known():
    """Readers add a read's allocations, then take its frees away: the free before the
    re-allocation took the new allocation away too, and a key met first in a later read was
    planned with no blocks, so its launches found no trigger (bench-steady's lookahead runs: 2
    launches of 516 a step, in about 1 run of 8)."""
    first, one, two = _realloc_in_one_read()
    assert one.allocs == [(first, 4 * MIB), (first, 6 * MIB)] and one.frees == []
    f = Foresight(64 * MIB, 50e9)
    f.observe(one)
    f.observe(two)
    assert f.allocations == {first: 6 * MIB} and len(f.blocks[-1]) == 3  # 6 MiB: three blocks
    session = ringless_session()
    session.ingest(one)
    assert session.allocations == {first: 6 * MIB} and session.live_bytes == 6 * MIB


def test_a_free_after_the_last_allocation_of_its_base_still_counts():
    t = TraceBuilder()
    base = t.alloc(4 * MIB)
    t.free(base, 4 * MIB)
    assert t.batch().frees == [(base, 4 * MIB)]



def _layered_trace(alloc_order, function_ids, steps=6, layers=6):
    """A training job of `layers` layers of growing weights (2, 4, ... MiB; activations 4 MiB),
    its allocations made in `alloc_order` (other addresses for the same tensors) and its
    kernels' handles renamed by function_ids: what a replay of a trace, or another run of a
    job, looks like to pumpd. Returns the trace and each tensor's address and size (weights,
    then activations)."""
    t = TraceBuilder()
    sizes = [(i + 1) * 2 * MIB for i in range(layers)] + [4 * MIB] * layers
    base = {}
    for i in alloc_order:
        base[i] = t.alloc(sizes[i])
    tensors = [(base[i], sizes[i]) for i in range(2 * layers)]
    for s in range(steps):
        t.step(s)
        for i in range(layers):
            (w, ws), (a, _) = tensors[i], tensors[layers + i]
            t.launch(function_ids[100 + i], [w, a], [(w, ws, False), (a, 4 * MIB, True)], 2e9, ws)
        for i in reversed(range(layers)):
            (w, ws), (a, _) = tensors[i], tensors[layers + i]
            t.launch(function_ids[200 + i], [w, a], [(w, ws, True), (a, 4 * MIB, False)], 4e9, ws)
    return t, tensors


@pytest.mark.parametrize("budget_mib", [24, 32, 40])
def test_the_plan_does_not_depend_on_addresses_or_kernel_handles(budget_mib):
    """A job's addresses and kernels' handles differ from run to run and between a trace and
    its replay, and its launch keys with them: the iteration starts where its launches' shapes
    say, never at a key's value, so the plan, read as which tensor moves after which launch of
    the step, is the same (started at the least key, a replay on fakecuda let 192, 256 or 320
    faults a step through from run to run)."""
    layers = 6
    ids = list(range(100, 100 + layers)) + list(range(200, 200 + layers))
    rng = np.random.default_rng(7)
    plans = set()
    for attempt in range(6):
        order = rng.permutation(2 * layers) if attempt else np.arange(2 * layers)
        renamed = dict(zip(ids, (rng.permutation(1000)[:len(ids)] + 0x1000).tolist())) if attempt else \
            {i: i for i in ids}
        t, tensors = _layered_trace(order.tolist(), renamed, layers=layers)
        f = Foresight(budget_mib * MIB, 50e9)
        _observe_in_batches(t, f, 5)
        assert f.learned
        where = {base + k * BLOCK: (n, k) for n, (base, size) in enumerate(tensors) for k in range(size // BLOCK)}
        named = lambda ranges: tuple(where[a + k * BLOCK] for a, size in ranges for k in range(size // BLOCK))  # noqa: E731
        triggers = f.triggers()
        keys = channel.launch_keys(t.batch())[-2 * layers:]  # the last step's launches, in order
        plans.add(tuple(tuple(named(r) for r in triggers[key]) for key in keys.tolist()))
    assert len(plans) == 1 and any(p or e for _, p, e in next(iter(plans)))


def test_the_history_holds_at_most_its_block_references():
    """Issue 45, attack 2: launch after launch with a new kernel and an EXTENT over a whole
    64 GiB allocation grew pumpd's planner by ~400 MB/s (2.7 GB in 10 s). The history now holds
    at most refs_max block references: past it the oldest launches are forgotten (counted),
    and one batch naming more keeps only its last launches' needs."""
    size = 32768 * BLOCK
    f = Foresight(64 * MIB, 50e9)
    f.refs_max = 4 * (32768 + 2)                      # four of these launches' needs (an extent's bound)
    t = TraceBuilder()
    base = t.alloc(size)
    f.observe(t.batch())
    for batch in range(3):
        t = TraceBuilder()
        for i in range(8):
            t.launch(0x100 + 16 * (8 * batch + i), [base], extents=[(base, size, True)])
        f.observe(t.batch())
        assert f._refs_held <= f.refs_max and f._refs_held == sum(max(1, len(b)) for b in f.blocks)
    assert sum(len(b) for b in f.blocks) <= f.refs_max
    assert f.need_skipped == 3 * 4                    # each batch of 8 kept its last 4 launches' needs
    assert f.history_trimmed > 0 and len(f.blocks) == len(f.detector.keys) == len(f.seconds) == len(f.refs)


def test_new_kernels_on_a_huge_allocation_hold_at_most_the_block_references():
    """Without extents a launch needs every block of the allocations it names, made once per
    new launch key: a batch of launches each of a new kernel on a 1 TiB allocation made a
    tuple of 524,288 blocks per key, all of them, before the cap was looked at (found by
    tests/test_daemon_memory.py: 24 GB and the OOM killer). One batch now keeps only its last
    keys' needs within refs_max; and one launch whose extent alone is past refs_max needs nothing
    known (it was kept whole)."""
    size = 32768 * BLOCK
    f = Foresight(64 * MIB, 50e9)
    f.refs_max = 4 * 32768 + 4
    t = TraceBuilder()
    base = t.alloc(size)
    f.observe(t.batch())
    t = TraceBuilder()
    for i in range(8):
        t.launch(0x100 + 16 * i, [base])
    f.observe(t.batch())
    assert f._cache_refs <= f.refs_max and f._refs_held <= f.refs_max
    assert f.need_skipped == 4 and [len(b) for b in f.blocks[-8:]] == [0] * 4 + [32768] * 4
    one = Foresight(64 * MIB, 50e9)
    one.refs_max = 1000
    t = TraceBuilder()
    base = t.alloc(size)
    one.observe(t.batch())
    t = TraceBuilder()
    t.launch(0x100, [base], extents=[(base, size, True)])
    one.observe(t.batch())
    assert one.need_skipped == 1 and one._refs_held <= one.refs_max


def test_a_history_within_its_references_learns_as_before():
    """The cap takes nothing from a job that fits it: a training loop is learned the same."""
    trace, _, _ = training_trace(steps=4, layers=6)
    batch = channel.decode(np.concatenate(trace.records))
    plain, capped = Foresight(64 * MIB, 50e9), Foresight(64 * MIB, 50e9)
    plain.observe(batch)
    capped.refs_max = plain._refs_held
    capped.observe(batch)
    assert capped.period == plain.period > 0 and capped.history_trimmed == 0 and capped.triggers() == plain.triggers()


def test_a_cache_cleared_mid_stream_still_gives_every_launch_its_blocks(monkeypatch):
    """The key cache is cleared when it would hold too many keys (or references): a batch
    mixing keys cached before with new ones then finds every key's blocks (it raised KeyError
    in a CI run: four hostile processes' 30,000-key iterations)."""
    from pump import foresight
    monkeypatch.setattr(foresight, "KEY_CACHE_MAX", 6)
    t = TraceBuilder()
    bases = [t.alloc(8 * BLOCK) for _ in range(4)]
    f = Foresight(64 * MIB, 50e9)
    f.observe(t.batch())
    t = TraceBuilder()
    for i in range(4):
        t.launch(0x100 + 16 * i, [bases[i]])
    f.observe(t.batch())  # four keys cached
    t = TraceBuilder()
    for i in range(8):
        t.launch(0x100 + 16 * i, [bases[i % 4]])      # the four cached keys, four new ones: past 6
    f.observe(t.batch())
    assert [len(b) for b in f.blocks[-8:]] == [8] * 8 and len(f._blocks_of_key) == 6  # the cap, not the batch


def test_a_named_tensor_freed_since_its_last_use_is_the_first_victim():
    """A named tensor the framework freed is dead until its name's next tensor (names.h): its
    memory went to other tensors, counted as blocks of their own. MIN takes it before a live
    block used again later, whose data would have to come back: the activation a, freed
    before y, makes y's room where b (used again furthest, but live) made it without the free.
    A block of an address freed so keeps its next use (the next tensor there is in it)."""
    for base in (NAMES_BASE, 0):
        a, b, y = base, base + BLOCK, base + 2 * BLOCK
        uses = [(a,), (b,), (y,), (a,), (b,)]
        sizes = {a: BLOCK, b: BLOCK, y: BLOCK}
        plain = plan_cycle(uses, sizes, [1e-4] * 5, 2 * BLOCK, horizon_seconds=1.0)
        freed = plan_cycle(uses, sizes, [1e-4] * 5, 2 * BLOCK, 1.0, freed=[(), (), (a,), (), ()])
        assert any(b in victims for victims in plain[1])
        if base:
            assert not any(b in victims for victims in freed[1]) and any(a in victims for victims in freed[1])
        else:
            assert freed == plain


def test_a_dead_name_is_neither_evicted_nor_brought_back():
    """The shim finds no tensor holding a name between its tensor's free and its next tensor's
    allocation (names.c counts such a range in tensor_names_unheld and moves nothing), and the
    next tensor's data is made by its kernels: a plan gives a dead name no eviction (its free
    made the room) and its next use no prefetch ahead, where it filled the trigger's ranges
    (256 at most) with ones that moved nothing. By address the free changes nothing: the next
    tensor there is in the same memory."""
    for base in (NAMES_BASE, 0):
        a, b, y = base, base + BLOCK, base + 2 * BLOCK
        uses, sizes = [(a,), (b,), (), (y,), (a,), (b,)], {a: BLOCK, b: BLOCK, y: BLOCK}
        plain = plan_cycle(uses, sizes, [1e-4] * 6, 2 * BLOCK, horizon_seconds=1.0)
        prefetch, evict = plan_cycle(uses, sizes, [1e-4] * 6, 2 * BLOCK, 1.0, freed=[(), (a,), (), (), (), ()])
        assert any(y in blocks for blocks in prefetch)
        if base:  # y's room is a's, dead since launch 1; b stays
            assert not any(a in blocks or b in blocks for blocks in prefetch + evict)
        else:
            assert (prefetch, evict) == plain


def test_a_named_tensor_dead_at_the_plan_is_one_range():
    """Two names are a free 2 MiB block apart in the name space (shim/lookup/names.h), so a plan
    joins a named tensor's blocks into one range though it is dead when the plan is made (a
    GPT-2's 393-block logits, freed at each step's end, went as 393 ranges, past the 128 need
    ranges the shim carries), and never joins two names. By address, memory no allocation
    holds is never joined: the shim refuses a range that crosses allocations."""
    f = Foresight(64 * MIB, 50e9)
    first, second = NAMES_BASE, NAMES_BASE + 4 * BLOCK  # three blocks, a gap, then the next name
    f._add_allocation(first, 3 * BLOCK)
    f._add_allocation(second, BLOCK + 4096)
    f._drop_allocation(first)
    blocks = [first, first + BLOCK, first + 2 * BLOCK, second, second + BLOCK]
    assert f._ranges(blocks) == [(first, 3 * BLOCK), (second, BLOCK + 4096)]
    f._add_allocation(BASE, 3 * BLOCK)
    f._drop_allocation(BASE)
    assert f._ranges([BASE, BASE + BLOCK]) == [(BASE, BLOCK), (BASE + BLOCK, BLOCK)]
