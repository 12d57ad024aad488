"""The half-duplex link of `pump simulate`'s worst case (pump/simulate/link.py): one copy at a
time, either way, and a stream waiting on an event does not hold it."""

import random

import pytest

from pump.simulate import engine, workload
from pump.simulate.link import HalfDuplexLink
from synthetic_trace import MIB, TraceBuilder


def test_copies_never_overlap_and_take_the_first_gap_long_enough():
    link = HalfDuplexLink()
    assert link.place(10.0, 2.0, 0.0) == 10.0        # [10, 12)
    assert link.place(0.0, 3.0, 0.0) == 0.0          # [0, 3): before it, in the gap
    assert link.place(2.0, 5.0, 0.0) == 3.0          # [3, 8): after the first, in time for the gap
    assert link.place(7.0, 3.0, 0.0) == 12.0         # 8..10 is too short: after [10, 12)
    assert link.place(8.5, 1.5, 0.0) == 8.5          # but it holds this one
    rng = random.Random(7)
    for _ in range(300):
        link.place(rng.uniform(0, 50), rng.uniform(0.01, 2), 0.0)
    spans = list(zip(link.starts, link.ends))
    assert all(end <= nxt for (_, end), (nxt, _) in zip(spans, spans[1:]))


def test_intervals_before_the_floor_are_forgotten():
    link = HalfDuplexLink()
    for t in range(10):
        link.place(float(t), 0.5, 0.0)
    assert len(link.starts) == 10
    assert link.place(20.0, 1.0, 5.0) == 20.0
    assert link.starts == [5.0, 6.0, 7.0, 8.0, 9.0, 20.0]  # those ended by 5 are gone


def test_a_prefetch_ready_now_is_not_queued_behind_an_eviction_waiting_for_its_kernel(tmp_path):
    """Half duplex: pump's eviction of a frees its room only after the kernel that last used a
    (10 s here); a prefetch of b issued after it, with room, moves at once. Before, every copy
    waited for every copy issued before it, ready or not. The eviction's copy is the wait inside
    its call, as fakecuda charges it (its stream then has nothing left to copy)."""
    t = TraceBuilder()
    a, b = t.alloc(2 * MIB), t.alloc(2 * MIB)
    t.launch(1, [a], [(a, 2 * MIB, True)])
    t.launch(2, [b], [(b, 2 * MIB, True)])
    w = workload.load(t.write(str(tmp_path / "l.trace")))
    model = dict(engine.range_models("a100-40gb"))["worst"]
    run = engine._Run(w, "launch", 8 * MIB, model)
    ia, ib = 0, 1
    run.gpu.add(ia, w.block_pages[ia])
    run.gpu.populated[ib] = w.block_pages[ib]          # b's pages were written on the host
    run.streams.last_user_end[ia] = 10.0
    run._evict(ia, 0.0)
    assert run.streams.ev_free >= 10.0
    done = run._prefetch(ib, 0.0)
    assert done < 1.0, done
    assert run.thread.seconds >= 2 * MIB / model.d2h_rate  # the copy, waited for in the call


def test_a_link_given_each_way_prices_each_direction_at_its_own_rate():
    """--link-gbps IN,OUT (the first H100 measured 49.8 GB/s in and 11.2 out): the range's rates
    are fractions of each direction's own line rate; one figure is both, as before."""
    from pump.simulate import cli, constants as K
    assert cli._bandwidth("49.8,11.2") == (49.8, 11.2) and cli._bandwidth("63") == (63.0, None)
    for bad in ("", "1,2,3", "0,5", "x", "5,"):
        try:
            cli._bandwidth(bad)
        except ValueError:
            continue
        raise AssertionError(bad)
    both = dict(engine.range_models("h100-pcie", 49.8e9, 11.2e9))
    same = dict(engine.range_models("h100-pcie", 49.8e9))
    for case, h2d, d2h, _ in K.RANGE_CASES:
        assert both[case].link_bytes_per_s == same[case].link_bytes_per_s == 49.8e9
        assert (both[case].link_out, same[case].link_out) == (11.2e9, 49.8e9)
        assert both[case].bandwidth == same[case].bandwidth == 49.8e9 * h2d
        assert both[case].d2h_rate == 11.2e9 * d2h and same[case].d2h_rate == 49.8e9 * d2h
    f = engine.fakecuda(20e9, 5e9)
    assert (f.bandwidth, f.d2h_rate, f.link_out) == (20e9, 5e9, 5e9)


def test_the_driver_evictions_of_a_slower_way_out_take_longer(tmp_path):
    """naive on a GPU smaller than its cycle: every eviction the driver makes goes out at the
    GPU->host line rate, so a slower way out lengthens the step by what it moves."""
    t = TraceBuilder()
    bufs = [t.alloc(8 * MIB) for _ in range(4)]
    for s in range(6):
        t.step(s)
        for i, b in enumerate(bufs):
            t.launch(10 + i, [b], [(b, 8 * MIB, True)], 1e9, 8 * MIB)
    w = workload.load(t.write(str(tmp_path / "out.trace")))
    fast = engine.run(w, "naive", 16 * MIB, engine.gpu_model("a100-40gb", 31.5e9))
    slow = engine.run(w, "naive", 16 * MIB, engine.gpu_model("a100-40gb", 31.5e9, link_out=10e9))
    out = fast.steady_mean("d2h")
    assert out > 0 and slow.steady_mean("d2h") == out
    assert slow.step_mean_seconds - fast.step_mean_seconds == \
        pytest.approx(out / 10e9 - out / 31.5e9, rel=0.05), (slow.step_mean_seconds, fast.step_mean_seconds)
