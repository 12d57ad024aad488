"""pump simulate (pump/simulate/): the engine's policies, its accounting, its CLI."""

import gzip
import json
import subprocess
import sys

import pytest

from pump.foresight import Foresight
from pump.simulate import constants as K
from pump.simulate import bound, engine, report, workload
from synthetic_trace import MIB, TraceBuilder, training_trace


def _cyclic(steps=8, layers=8, size=8 * MIB):
    t = TraceBuilder()
    bufs = [t.alloc(size) for _ in range(layers)]
    for s in range(steps):
        t.step(s)
        for i in range(layers):
            t.launch(10 + i, [bufs[i]], [(bufs[i], size, i % 2 == 0)], 1e9, size)
    return t


@pytest.fixture
def cyclic(tmp_path):
    return workload.load(_cyclic().write(str(tmp_path / "cyclic.trace")), batch_launches=4)


def test_policies_order_on_a_cycle_larger_than_memory(cyclic):
    cap = cyclic.peak_footprint // 2
    m = engine.h100()
    t = {p: engine.run(cyclic, p, cap, m).step_seconds for p in engine.POLICIES}
    assert t["ideal"] < t["lookahead"] < t["launch"] < t["naive"]
    bound = report.lower_bound(cyclic, cap, m)["lower_bound_seconds"]
    assert t["ideal"] <= bound <= t["lookahead"]


@pytest.mark.parametrize("gpu", ["h100-pcie", "l4"])
def test_the_rate_free_policies_and_the_bound_bytes_are_the_same_in_every_case_of_the_range(cyclic, gpu):
    """What lets pump simulate run ideal and naive, and the bound's byte counts, once for the
    range of explicit-migration rates: every case of the range gives them the same results."""
    cap = cyclic.peak_footprint // 2
    results = {}
    for case, model in engine.range_models(gpu):
        results[case] = {p: engine.run(cyclic, p, cap, model) for p in report.RATE_FREE}
        results[case]["bound"] = bound.lower_bound(cyclic, cap, model)
        fresh = workload.load(cyclic.path, batch_launches=4)   # no bytes cached
        assert bound.lower_bound(fresh, cap, model) == results[case]["bound"]
    best, worst = results["best"], results["worst"]
    for p in report.RATE_FREE:
        assert (best[p].step_seconds, best[p].faults, best[p].bytes_d2h) == \
               (worst[p].step_seconds, worst[p].faults, worst[p].bytes_d2h), p
    for key in ("must_move_bytes", "whole_launch_must_move_bytes", "live_written_bytes", "touched_bytes"):
        assert best["bound"][key] == worst["bound"][key], key
    doc = report.simulate_range(cyclic, cap, engine.range_models(gpu))
    for p in report.RATE_FREE:
        same = lambda case: {k: v for k, v in doc["cases"][case]["policies"][p].items() if k != "ratio_to_lower_bound"}
        assert same("worst") == same("best"), p


def test_the_answer_says_where_pump_is_slower_than_the_driver_alone():
    policy = lambda ms: {"step_mean_seconds": ms / 1e3, "ratio_to_lower_bound": 1.0}
    case = lambda launch, full: {"bandwidth_bytes_per_s": 17.5e9, "d2h_bandwidth_bytes_per_s": 5.6e9, "full_duplex": full,
                                 "lower_bound_seconds": 0.2, "policies": {"naive": policy(1330), "launch": policy(launch)}}
    doc = {"link_bytes_per_s": 31.5e9, "cases": {"best": case(700, True), "worst": case(1743, False)}}
    assert report._slower_than_the_driver(doc) == [
        "  in the worst case pump is slower than the driver alone (launch 1743.000 ms against naive 1330.000 ms): "
        "its moves go at that case's rates (17.5 GB/s in, 5.6 out), the driver's faults and evictions at the link's "
        "31.5 GB/s; which case a machine is in, gpu-check's prefetch_bandwidth probe measures"]
    doc["cases"]["worst"]["policies"]["launch"] = policy(1300)
    assert report._slower_than_the_driver(doc) == []


@pytest.mark.parametrize("policy", ["naive", "launch"])
def test_a_freed_and_allocated_again_range_comes_from_nowhere(tmp_path, policy):
    """64 MiB allocated, written by a kernel, freed, allocated again at the same address each
    step: its pages exist nowhere when each step's kernel writes them, so nothing crosses the
    link (the freed range's pages were charged as coming from the host: 64 MiB a step)."""
    t = TraceBuilder()
    size = 64 * MIB
    base = t.alloc(size)
    for s in range(6):
        t.step(s)
        t.launch(10, [base], [(base, size, True)], 1e9, size)
        t.free(base, size)
        t._record("alloc", 0, base, size, 1)
    w = workload.load(t.write(str(tmp_path / "again.trace")))
    r = engine.run(w, policy, 2 * size, engine.h100())
    assert r.steady_mean("h2d") == 0 and r.steady_mean("d2h") == 0, (r.steady_mean("h2d"), r.steady_mean("d2h"))


def _optimal_fetches(refs, slots, cycles):
    """Exhaustive search over every cache content: the fewest fetches of any demand-paging
    policy on refs repeated `cycles` times from empty (MIN must reach it)."""
    states = {frozenset(): 0}
    for b in refs * cycles:
        nxt = {}
        for state, cost in states.items():
            if b in state:
                options = [(state, cost)]
            elif len(state) < slots:
                options = [(state | {b}, cost + 1)]
            else:
                options = [((state - {v}) | {b}, cost + 1) for v in state]
            for st, c in options:
                nxt[st] = min(c, nxt.get(st, c))
        states = nxt
    return min(states.values())


@pytest.mark.parametrize("refs, slots", [
    ([0, 1, 2, 3, 4], 3),                              # a loop larger than memory
    ([0, 1, 2, 3, 3, 2, 1, 0], 2),                     # training's mirror order
    ([0, 1, 0, 2, 0, 3, 4, 1, 4, 2], 3),
])
def test_bound_min_is_the_optimum(refs, slots):
    sizes = [2 * MIB] * 8
    fetches, nbytes = bound.min_fetches([(b,) for b in refs], sizes, slots, cycles=5)
    assert fetches == _optimal_fetches(refs, slots, 5) and nbytes == fetches * 2 * MIB
    per_cycle = bound.steady_bytes_per_cycle([(b,) for b in refs], sizes, slots, cycles=5)
    assert per_cycle == (nbytes - slots * 2 * MIB) / 5


def test_bound_parts(tmp_path):
    t, _, _ = training_trace(steps=6, layers=6)
    w = workload.load(t.write(str(tmp_path / "t.trace")), batch_launches=5)
    m = engine.h100()
    b = bound.lower_bound(w, w.peak_footprint // 2, m)
    # Mirror-order reuse: MIN moves more than the touched bytes beyond capacity.
    assert b["must_move_bytes"] > b["touched_beyond_capacity_bytes"] > 0
    assert b["whole_launch_must_move_bytes"] >= b["must_move_bytes"]
    assert b["lower_bound_seconds"] == max(b["compute_seconds"], b["must_move_bytes"] / m.bandwidth,
                                           b["must_write_back_bytes"] / m.link_bytes_per_s)
    assert b["weak_lower_bound_seconds"] <= b["lower_bound_seconds"]
    full = bound.lower_bound(w, w.peak_footprint, m)
    assert full["must_move_bytes"] == 0 and full["lower_bound_seconds"] == full["compute_seconds"]


def _live_trace(tmp_path, free_b=False):
    """One step a loop: a written, then read twice; b written, then read; c written, never read
    (dead); free_b: the allocator frees b between its write and its read."""
    t = TraceBuilder()
    a, b, c = (t.alloc(2 * MIB) for _ in range(3))
    for s in range(4):
        t.step(s)
        t.launch(1, [a], [(a, 2 * MIB, True)])
        t.launch(2, [a, b], [(a, 2 * MIB, False), (b, 2 * MIB, True)])
        if free_b:
            t.block_free(b, 2 * MIB)
        t.launch(3, [b], [(b, 2 * MIB, False)])
        t.launch(4, [c], [(c, 2 * MIB, True)])
        t.launch(5, [a], [(a, 2 * MIB, False)])
    return workload.load(t.write(str(tmp_path / f"live{free_b}.trace")), batch_launches=5)


@pytest.mark.parametrize("free_b, live", [(False, 4 * MIB), (True, 2 * MIB)])
def test_live_written_bytes_by_hand(tmp_path, free_b, live):
    # a is live from its write to its last read (cuts 1-4), b across cut 2 only, c never (its
    # next access overwrites it): most at cut 2, a and b.  Freed, b is dead: a alone.
    w = _live_trace(tmp_path, free_b)
    lo, hi, _ = bound._cycle(w)
    assert hi - lo == 5 and bound.live_written_bytes(w, lo, hi) == live
    b = bound.lower_bound(w, 2 * MIB, engine.h100())
    assert b["live_written_bytes"] == live and b["must_write_back_bytes"] == live - 2 * MIB


@pytest.mark.parametrize("case", ["best", "worst"])
@pytest.mark.parametrize("capacity_share", [0.375, 0.5])
def test_the_bound_counts_write_backs_and_every_policy_respects_it(tmp_path, case, capacity_share):
    """Weights written backward and read forward next step must be copied back beyond what
    fits: on a half-duplex link those copies take the link from fetches, so the bound is above
    MIN's fetches alone (the old bound), and still below every policy's step."""
    t, _, _ = training_trace(steps=8, layers=6, flops=2e8)
    w = workload.load(t.write(str(tmp_path / "t.trace")), batch_launches=5)
    m = dict(engine.range_models("a100-40gb"))[case]
    cap = int(w.peak_footprint * capacity_share) // (2 * MIB) * (2 * MIB)
    b = bound.lower_bound(w, cap, m)
    assert b["must_write_back_bytes"] > 0
    fetch_only = max(b["compute_seconds"], b["must_move_bytes"] / m.bandwidth)
    if not m.full_duplex:
        assert b["lower_bound_seconds"] > fetch_only
    for policy in ("naive", "launch", "lookahead"):
        r = engine.run(w, policy, cap, m)
        assert r.step_mean_seconds >= b["lower_bound_seconds"], policy
        assert r.steady_mean("d2h") >= b["must_write_back_bytes"], policy


def test_chain_bound_counts_when_bytes_must_cross():
    # Launch 0 computes 10 ms on x; launches 1-4 touch p, q, r, s at once, with room for 3 blocks
    # and 1 ms per block on the link.  MIN moves 3 blocks an iteration (3 ms, under the 10 ms of
    # compute), but when launch 1 starts only x and one more block can be there beside p: one of
    # q, r, s crosses before launch 5 (the next x) can start, and nothing computes meanwhile.
    x, p, q, r, s = range(5)
    launches = [(x,), (p,), (q,), (r,), (s,)]
    sizes = [2 * MIB] * 5
    seconds = [10e-3, 0, 0, 0, 0]
    bandwidth = 2 * MIB / 1e-3
    assert bound.steady_bytes_per_cycle(launches, sizes, 3) / bandwidth < sum(seconds)
    assert bound.chain_seconds(launches, sizes, seconds, 3 * 2 * MIB, bandwidth) == pytest.approx(11e-3)
    # With room for all of them nothing need cross: compute alone.
    assert bound.chain_seconds(launches, sizes, seconds, 5 * 2 * MIB, bandwidth) == pytest.approx(10e-3)


@pytest.mark.parametrize("capacity_share", [0.375, 0.5, 0.75])
def test_no_whole_launch_policy_beats_the_chain_bound(tmp_path, capacity_share):
    t, _, _ = training_trace(steps=6, layers=6)
    w = workload.load(t.write(str(tmp_path / "t.trace")), batch_launches=5)
    m = engine.h100()
    cap = int(w.peak_footprint * capacity_share)
    b = bound.lower_bound(w, cap, m)
    assert b["whole_launch_chain_seconds"] >= b["compute_seconds"]
    for policy in ("launch", "lookahead"):
        r = engine.run(w, policy, cap, m)
        assert r.steady_mean("faults") == 0   # the bound's premise: each kernel's blocks are there
        assert r.step_seconds >= b["whole_launch_chain_seconds"] * (1 - 1e-9), policy


def test_lookahead_prefetches_what_kernels_touch_not_whole_segments(tmp_path):
    t = TraceBuilder()
    segs = [t.alloc(16 * MIB) for _ in range(4)]
    for s in range(8):
        t.step(s)
        for seg in segs + segs[::-1]:   # one 2 MiB tensor used of each 16 MiB segment
            t.launch(20 + segs.index(seg), [seg], [(seg + 4 * MIB, 2 * MIB, True)], 1e9)
    w = workload.load(t.write(str(tmp_path / "s.trace")), batch_launches=4)
    m = engine.h100()  # its policy is told the extents (fakecuda's sees what today's shim reports)
    launch = engine.run(w, "launch", 24 * MIB, m)
    ahead = engine.run(w, "lookahead", 24 * MIB, m)
    assert launch.steady_mean("h2d") >= 16 * MIB
    assert ahead.steady_mean("h2d") == 0 and ahead.steady_mean("faults") == 0  # 4 x 2 MiB fit


def test_belady_moves_fewer_bytes_than_least_recently_migrated(cyclic):
    cap = cyclic.peak_footprint // 2
    m = engine.fakecuda()
    launch = engine.run(cyclic, "launch", cap, m)
    ahead = engine.run(cyclic, "lookahead", cap, m)
    assert ahead.learned_at is not None
    assert ahead.steady_mean("h2d") < 0.8 * launch.steady_mean("h2d")


@pytest.mark.parametrize("policy", ["naive", "launch", "lookahead"])
def test_the_budget_holds(cyclic, policy):
    cap = cyclic.peak_footprint // 2
    r = engine.run(cyclic, policy, cap, engine.fakecuda())
    assert r.max_believed <= cap
    h = engine.run(cyclic, policy, cap, engine.h100())
    assert h.max_resident <= cap


def test_ideal_and_full_capacity_fault_only_once(cyclic):
    m = engine.h100()
    assert engine.run(cyclic, "ideal", 1, m).faults == 0
    naive = engine.run(cyclic, "naive", cyclic.peak_footprint, m)
    assert naive.faults == cyclic.peak_footprint // K.PAGE_BYTES  # the first touch of each page
    assert naive.bytes_d2h == 0


def test_extents_decide_what_faults(tmp_path):
    t = TraceBuilder()
    seg = t.alloc(8 * MIB)
    t.launch(1, [seg], [(seg + 100, 200 * 1024, True)])  # pages 0..3 of the segment
    w = workload.load(t.write(str(tmp_path / "x.trace")))
    r = engine.run(w, "naive", 64 * MIB, engine.h100())
    # First touch populates on the GPU: faults, but nothing crosses the link.
    assert r.faults == 4 and r.bytes_faulted_h2d == 0
    launch = engine.run(w, "launch", 64 * MIB, engine.h100())
    assert launch.faults == 0 and launch.max_believed == 8 * MIB  # PUMP takes the whole allocation
    assert launch.bytes_prefetched_h2d == 0


def test_pages_that_exist_cross_the_link(tmp_path):
    """Touched once, evicted by a budget, touched again: now the pages move."""
    t = TraceBuilder()
    a, b = t.alloc(8 * MIB), t.alloc(8 * MIB)
    for _ in range(2):
        t.launch(1, [a], [(a, 8 * MIB, True)])
        t.launch(2, [b], [(b, 8 * MIB, True)])
    w = workload.load(t.write(str(tmp_path / "y.trace")))
    r = engine.run(w, "naive", 8 * MIB, engine.fakecuda())
    assert r.faults == 4 * 8 * MIB // K.PAGE_BYTES
    assert r.bytes_faulted_h2d == 2 * 8 * MIB and r.bytes_d2h == 3 * 8 * MIB


def test_discards_only_dead_ranges(tmp_path):
    t = TraceBuilder()
    seg = t.alloc(32 * MIB)
    other = t.alloc(32 * MIB)
    for s in range(6):
        t.step(s)
        t.block_alloc(seg, 16 * MIB)
        t.launch(1, [seg], [(seg, 16 * MIB, True)], 1e9)
        t.launch(2, [other], [(other, 32 * MIB, True)], 1e9)
        t.launch(3, [seg], [(seg, 16 * MIB, False)], 1e9)
        t.block_free(seg + MIB, 15 * MIB)
        t.launch(4, [other], [(other, 32 * MIB, False)], 1e9)
    w = workload.load(t.write(str(tmp_path / "d.trace")), batch_launches=4)
    r = engine.run(w, "lookahead", 40 * MIB, engine.h100())
    assert r.unsafe_discards == 0 and r.bytes_discarded > 0
    run = engine._Run(w, "lookahead", 40 * MIB, engine.h100())
    run._discard((other, 4 * MIB), 0.0)  # live memory: refused
    assert run.r.unsafe_discards == 1


def test_lookahead_evicts_freed_memory_after_its_free(tmp_path, monkeypatch):
    """Issue 28 item 3: a victim the framework frees before the launch that needs its room is
    evicted after the free, discarded: it copies nothing back.  Planned without the frees,
    the same run writes it back."""
    t = TraceBuilder()
    a, d, b, c = t.alloc(8 * MIB), t.alloc(2 * MIB), t.alloc(16 * MIB), t.alloc(16 * MIB)
    for s in range(8):
        t.step(s)
        t.block_alloc(a, 8 * MIB)
        t.launch(1, [a], [(a, 8 * MIB, True)], 1e9)
        t.launch(2, [a], [(a, 8 * MIB, False)], 1e9)
        t.block_free(a, 8 * MIB)                   # dead from here to its next write
        t.launch(3, [d], [(d, 2 * MIB, False)], 1e9)
        t.launch(4, [b], [(b, 16 * MIB, False)], 1e9)
        t.launch(5, [c], [(c, 16 * MIB, True)], 1e9)
        t.launch(6, [c], [(c, 16 * MIB, False)], 1e9)
    w = workload.load(t.write(str(tmp_path / "f.trace")), batch_launches=6)
    known = engine.run(w, "lookahead", 24 * MIB, engine.h100())
    monkeypatch.setattr(Foresight, "_freed_blocks", lambda self, addr, size: ())
    unknown = engine.run(w, "lookahead", 24 * MIB, engine.h100())
    assert known.unsafe_discards == unknown.unsafe_discards == 0
    assert known.steady_mean("h2d") == unknown.steady_mean("h2d")
    assert known.steady_mean("d2h") <= unknown.steady_mean("d2h") - 4 * MIB
    assert known.step_mean_seconds < unknown.step_mean_seconds


def test_fakecuda_constants_are_read_from_its_header():
    f = K.fakecuda_constants()
    assert f["FAKECUDA_PAGE"] == K.PAGE_BYTES and f["FAKECUDA_H2D_BYTES_PER_US"] > 0
    assert engine.fakecuda().bandwidth == f["FAKECUDA_H2D_BYTES_PER_US"] * 1e6


def test_fakecuda_constants_missing_is_a_clear_error(tmp_path):
    bad = tmp_path / "model.h"
    bad.write_text("#define FAKECUDA_PAGE (64u * 1024u)\n")
    with pytest.raises(ValueError, match="FAKECUDA_H2D_BYTES_PER_US"):
        K.fakecuda_constants(str(bad))


def _pump(*args):
    return subprocess.run([sys.executable, "-m", "pump.cli", "simulate", *args], capture_output=True, text=True)


def test_cli_json_and_plot(tmp_path):
    path = _cyclic().write(str(tmp_path / "c.trace"))
    png = tmp_path / "c.png"
    p = _pump(path, "--capacity", "50%", "--bandwidth", "32", "--json", "--plot", str(png), "--gpu", "fakecuda")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["bandwidth_bytes_per_s"] == 32e9 and set(doc["policies"]) == set(engine.POLICIES)
    assert doc["fakecuda_counts"]["naive"]["gpu_faults"] > 0
    assert png.stat().st_size > 1000


def test_cli_checks_its_outputs_before_the_work(tmp_path):
    """An unwritable --plot (or --timeline) path fails at once, before any simulation, and
    leaves none of the other outputs behind."""
    path = _cyclic(steps=2).write(str(tmp_path / "c.trace"))
    timeline = tmp_path / "t.json"
    p = _pump(path, "--capacity", "50%", "--timeline", str(timeline), "--plot", str(tmp_path / "no" / "c.png"))
    assert (p.returncode, p.stdout) == (2, "")
    assert p.stderr == f"pump: simulate: cannot write {tmp_path / 'no' / 'c.png'}: No such file or directory\n"
    assert not timeline.exists()
    p = _pump(path, "--capacity", "50%", "--plot", str(tmp_path))  # a directory
    assert p.returncode == 2 and "cannot write" in p.stderr and "simulate: run" not in p.stderr


def test_cli_shows_progress_and_captions_the_plot(tmp_path, monkeypatch):
    path = _cyclic(steps=4).write(str(tmp_path / "c.trace"))
    p = _pump(path, "--capacity", "50%", "--plot", str(tmp_path / "c.png"))
    assert p.returncode == 0, p.stderr
    runs = [line for line in p.stderr.splitlines() if line.startswith("simulate: run ")]
    # ideal and naive once over the range; the plot's ideal and its runs at 50%, the table's
    total = len(engine.POLICIES) + 2 + len(report.PLOT_FRACTIONS) * 3 - 3
    assert len(K.RANGE_CASES) == 2 and total == 24
    # It says what it will run before it starts.
    plan = p.stderr.splitlines()[0]
    assert plan.startswith("simulate: 6 runs for the table (4 policies at ") and \
        plan.endswith(" in each of 2 cases, ideal and naive once), then 18 for --plot (naive, launch, lookahead, "
                      "ideal at 7 capacities, best case; the table's runs and ideal not repeated)"), plan
    assert len(runs) == total and runs[0].startswith(f"simulate: run 1/{total}: ideal at ")
    # After the first, each says how long the rest will take.
    assert "; about " not in runs[0] and all("; about " in r and r.endswith(" left") for r in runs[1:])
    assert runs[-1].startswith(f"simulate: run {total}/{total}: ") and "(plot); about " in runs[-1]
    # The plot says what it is and marks the capacity asked for.
    from matplotlib import axes
    titles, lines = [], []
    monkeypatch.setattr(axes.Axes, "set_title", lambda ax, text, *a, **k: titles.append(text))
    original = axes.Axes.axvline
    monkeypatch.setattr(axes.Axes, "axvline", lambda ax, x, *a, **k: lines.append((x, k["label"])) or
                        original(ax, x, *a, **k))
    w = workload.load(path)
    report.plot(w, engine.fakecuda(), str(tmp_path / "d.png"), w.peak_footprint // 2)
    assert titles and titles[0].endswith("(modelled, not measured)")
    assert lines == [(50.0, f"--capacity {report._size(w.peak_footprint // 2)}")]


def test_cli_warns_when_the_trace_has_no_kernel_costs(tmp_path):
    t = TraceBuilder()
    buf = t.alloc(8 * MIB)
    for s in range(3):
        t.step(s)
        t.launch(10, [buf], [(buf, 8 * MIB, True)])
    p = _pump(t.write(str(tmp_path / "free.trace")), "--capacity", "100%")
    assert p.returncode == 0 and "has no kernel costs (no FLOPs, bytes or measured times)" in p.stderr
    costly = _pump(_cyclic(steps=2).write(str(tmp_path / "c.trace")), "--capacity", "100%")
    assert costly.returncode == 0 and "no kernel costs" not in costly.stderr


@pytest.mark.parametrize("args, message", [
    (["--capacity", "lots"], "allowed: bytes, or a size like 8GiB"),
    (["--capacity", "0%"], "percentage of the trace's peak footprint"),
    (["--capacity", "100.5%"], "at most 100%, decimals allowed"),
    (["--capacity", "5.%"], "at most 100%, decimals allowed"),
    (["--capacity", "1G", "--bandwidth", "fast"], "GB/s as a number > 0"),
    (["--capacity", "1G", "--policy", "best"], "choose from 'naive', 'launch', 'lookahead', 'ideal'"),
    (["--capacity", "1G", "--model", "a100"], "choose from 'h100', 'fakecuda'"),
])
def test_cli_bad_inputs_say_what_is_allowed(tmp_path, args, message):
    path = _cyclic(steps=2).write(str(tmp_path / "c.trace"))
    p = _pump(path, *args)
    assert p.returncode == 2 and message in p.stderr and p.stdout == ""


def test_cli_bad_trace(tmp_path):
    bad = tmp_path / "bad.trace"
    bad.write_bytes(b"not a trace at all, clearly not" * 10)
    p = _pump(str(bad), "--capacity", "1G")
    assert p.returncode == 1 and "not a pump trace" in p.stderr and "--profile" not in p.stderr


def test_a_profile_given_as_the_trace_points_to_profile(tmp_path):
    profile = tmp_path / "p.json.gz"
    profile.write_bytes(gzip.compress(b'{"traceEvents": []}'))
    p = _pump(str(profile), "--capacity", "1G")
    assert p.returncode == 1
    assert "it looks like a profile" in p.stderr and "pump simulate TRACE --profile FILE" in p.stderr


def test_a_decimal_percentage_is_that_share_of_the_footprint(tmp_path):
    from pump.simulate import cli
    assert cli.capacity_bytes("53.74%", 10**6) == 537400
    assert cli.capacity_bytes("50%", 1001) == 500
    path = _cyclic(steps=2).write(str(tmp_path / "c.trace"))
    p = _pump(path, "--capacity", "53.74%", "--policy", "ideal", "--json")
    doc = json.loads(p.stdout)
    assert p.returncode == 0 and doc["capacity_bytes"] == int(doc["peak_footprint_bytes"] * 5374 // 10000)


@pytest.mark.parametrize("reads_steps", [False, True])
def test_a_plan_holds_only_after_pumpd_has_read_its_launches(tmp_path, reads_steps):
    """pumpd reads a batch once its launches have been made: until the launch after the one
    that completes the learning, lookahead is the launch rule, step for step."""
    path = _cyclic(steps=8).write(str(tmp_path / "c.trace"))
    w = workload.load(path, batch_launches=5, daemon_reads_steps=reads_steps)
    m = engine.fakecuda()
    cap = w.peak_footprint // 2
    look, launch = (engine.run(w, p, cap, m) for p in ("lookahead", "launch"))
    assert look.learned_at == w.learned_at and w.learned_at % (8 if reads_steps else 5) == 0
    ends = w.steps[1:] + [w.launches]
    before = sum(end <= w.learned_at for end in ends)     # the steps made before pumpd learned
    for what in ("faults", "h2d", "d2h"):
        assert look.per_step[what][:before] == launch.per_step[what][:before], what
    assert look.per_step["h2d"][before:] != launch.per_step["h2d"][before:]
