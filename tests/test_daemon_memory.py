"""pumpd's memory at its caps (issue 45 item 6): limits.memory_at_most adds up what the caps let
pumpd and its planner hold, from bytes per entry measured here through the code that keeps each
entry (tracemalloc, the peak while it is made), and the sum must stay well within the unit's
MemoryMax. A measurement above its figure in limits.BYTES_PER fails, and so does a sum past the
unit's limit, so a cap raised or a table made dearer is seen."""

import os
import pathlib
import re
import tracemalloc

import numpy as np
import pytest

from pump import channel

ROOT = pathlib.Path(__file__).resolve().parent.parent
N = 20_000
MIB = 1 << 20
SMALL = 1 << 41


def peak_bytes_per_entry(make, n=N) -> float:
    """The peak traced bytes while make() keeps n entries (what it returns is held), per entry."""
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        kept = make()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    del kept
    return (peak - before) / n


def session():
    from pumpd import limits
    from pumpd.jobs import Session
    return Session(1, os.getpid(), 0.0, None, None, limits.Quota(7, limits.table_tallies()))


def launches(n, function=lambda i: 16 + (i % 64) * 16, bases=lambda i: [SMALL], extents=None):
    """A decoded batch of n launches (channel.decode of the records the shim writes)."""
    rows = []
    for i in range(n):
        b = bases(i)
        rows.append(("launch", [function(i), 0, *b[:3]], len(b)))
        if extents is not None:
            rows.append(("extent", list(extents(i)) + [0, 0], 1))
    records = np.zeros(len(rows), channel.EVENT)
    for r, (kind, args, count) in enumerate(rows):
        records[r]["kind"], records[r]["count"], records[r]["seq"] = channel.KIND[kind], count, r + 1
        records[r]["arg"][:len(args)] = args
    return channel.decode(records)


def lookahead(share=None):
    from pumpd import limits
    from pumpd.lookahead import Lookahead
    planner = Lookahead(1 << 30, 25e9)
    planner.limit(share or limits.planner_share(1, 1))
    # one allocation of N blocks the extents fall in, one of a block the launches name
    planner.learn(channel.Batch(allocs=[(1 << 40, N << 21), (SMALL, 1 << 21)]))
    return planner


def measure_functions():
    s = session()
    longest = channel.C.PUMP_FUNCTION_NAME_MAX

    def names():  # made here, as decode makes each name
        s.ingest(channel.Batch(functions={f: (f"{f:08x}" + "k" * longest)[:longest] for f in range(N)}))
        return s
    return peak_bytes_per_entry(names)


def measure_allocations():
    s = session()
    return peak_bytes_per_entry(lambda: s.ingest(channel.Batch(allocs=[(b << 21, 4096) for b in range(1, N + 1)])) or s)


def measure_pending_records():
    from pumpd import limits
    from pumpd.backlog import Backlog
    backlog = Backlog(limits.Quota(9, limits.table_tallies()))
    records = np.zeros(N, channel.EVENT)
    records["kind"], records["count"], records["seq"] = channel.KIND["launch"], 5, np.arange(1, N + 1)
    records["arg"][:, 0], records["arg"][:, 2:] = np.arange(N) % 64 + 16, 1 << 40
    return peak_bytes_per_entry(lambda: backlog.add(channel.decode(records)) or backlog)


def measure_planned_blocks():
    from pumpd.lookahead import Lookahead
    planner = Lookahead(1 << 30, 25e9)
    return peak_bytes_per_entry(lambda: planner.learn(channel.Batch(allocs=[(1 << 40, N << 21)])) or planner)


def measure_refs():
    """Launches whose extents each name 1,000 blocks of a large allocation."""
    planner = lookahead()
    batch = launches(N // 1000, extents=lambda i: (1 << 40, 1000 << 21))
    return peak_bytes_per_entry(lambda: planner.learn(batch) or planner)


def measure_launches():
    """Launches of a few kernels on one block each: what a launch costs the detector and the
    history beyond its one block reference."""
    planner = lookahead()
    batch = launches(N, extents=lambda i: (1 << 40, 1 << 21))
    return peak_bytes_per_entry(lambda: planner.learn(batch) or planner)


def measure_cached_keys():
    """Launches without extents, each of a new kernel: a cached key each."""
    planner = lookahead()
    batch = launches(N, function=lambda i: 16 + i * 16)
    per_launch = peak_bytes_per_entry(lambda: planner.learn(batch) or planner)
    return per_launch


def measure_freed_blocks():
    planner = lookahead()
    batch = launches(1)
    batch.block_frees = [(0, (1 << 40) + (i << 21), 1 << 21) for i in range(N)]
    return peak_bytes_per_entry(lambda: planner.learn(batch) or planner)


def measure_kernel_keys():
    from pumpd.lookahead import KERNEL_SAMPLES
    planner = lookahead()
    kernels = [(0, key, 1000 + s) for key in range(1, N + 1) for s in range(KERNEL_SAMPLES)]
    return peak_bytes_per_entry(lambda: planner._note_kernels(kernels) or planner)


def measure_window():
    planner = lookahead()
    keys = np.arange(N, dtype=np.uint64)
    seconds = np.ones(N)

    def window():
        planner._per_key(keys, seconds)
        return planner
    return peak_bytes_per_entry(window)


MEASURES = {"functions": measure_functions, "allocations": measure_allocations,
            "pending_records": measure_pending_records, "planned_blocks": measure_planned_blocks,
            "refs": measure_refs, "launches": measure_launches, "cached_keys": measure_cached_keys,
            "freed_blocks": measure_freed_blocks, "kernel_keys": measure_kernel_keys, "window": measure_window}


@pytest.mark.parametrize("table", sorted(MEASURES))
def test_an_entry_costs_at_most_what_the_memory_bound_counts(table):
    from pumpd import limits
    measured = MEASURES[table]()
    print(f"\n{table}: {measured:.0f} bytes an entry at the peak (counted: {limits.BYTES_PER[table]})")
    assert 0 < measured <= limits.BYTES_PER[table]


def test_what_the_caps_let_pumpd_and_its_planner_hold_fits_the_services_memory_limit():
    """At every global cap at once (4,096 sessions, all lookahead; every table full; every
    connection with a whole message unread; every trace byte queued) pumpd and its planner stay
    within three quarters of the unit's MemoryMax, and docs/daemon-limits.md says the sum."""
    from pumpd import limits
    unit = (ROOT / "scripts" / "pumpd.service").read_text()
    number, unit_letter = re.search(r"^MemoryMax=(\d+)([KMGT]?)$", unit, re.M).groups()
    memory_max = int(number) << {"": 0, "K": 10, "M": 20, "G": 30, "T": 40}[unit_letter]
    at_most = limits.memory_at_most()
    print(f"\nat most {at_most / MIB:.0f} MiB of MemoryMax {memory_max / MIB:.0f} MiB")
    assert at_most <= memory_max * 3 // 4
    doc = " ".join((ROOT / "docs" / "daemon-limits.md").read_text().split())
    assert f"at most {at_most / MIB:,.0f} MiB" in doc


def test_a_small_share_holds_every_planner_table_to_it():
    """A process whose share is small (many users' lookahead processes) keeps each table to it,
    whatever its ring names."""
    from pumpd.lookahead import KERNEL_SAMPLES
    share = {"refs": 5000, "launches": 4000, "cached_keys": 300, "freed_blocks": 700, "kernel_keys": 50,
             "window": 600}
    planner = lookahead(share)
    for round_ in range(4):
        batch = launches(3000, function=lambda i: 16 + (round_ * 3000 + i) * 16)
        batch.block_frees = [(i, (1 << 40) + ((round_ * 3000 + i) << 21), 1 << 21) for i in range(3000)]
        batch.kernels = [(0, round_ * 3000 + k, 1000) for k in range(200) for _ in range(KERNEL_SAMPLES)]
        planner.learn(batch)
    policy = planner.policy
    assert policy._refs_held <= share["refs"]
    assert len(policy.detector.keys) <= share["launches"] * 9 // 8  # trimmed in chunks of an eighth
    assert len(policy._blocks_of_key) <= share["cached_keys"]
    assert policy._freed_kept <= share["freed_blocks"]
    assert len(planner.kernel_ns) <= share["kernel_keys"]
    assert len(planner.window_keys) <= max(share["window"], 3000)  # a batch's own are kept while it is read


def test_a_turn_of_many_batches_makes_needs_only_for_the_launches_its_history_keeps(monkeypatch):
    """A planner turn learns every batch read meanwhile (issue 45's attack 2 brought 948 batches of
    69 launches, each over 32,768 blocks): needs are made only for the launches that the turn's
    later batches leave within refs_max, not made and trimmed batch after batch (352 s of CPU for
    that turn, past its 5 s deadline, so the planner learned nothing and its cap said nothing)."""
    from pump.foresight import Foresight
    share = {"refs": 10_000, "launches": 1 << 20, "cached_keys": 1 << 17, "freed_blocks": 1 << 19,
             "kernel_keys": 1 << 17, "window": 1 << 18}
    planner = lookahead(share)
    made = []
    needed = Foresight._needed_blocks
    monkeypatch.setattr(Foresight, "_needed_blocks", lambda self, batch, i: made.append(i) or needed(self, batch, i))
    turn = [launches(4, function=lambda i, b=b: 16 + (4 * b + i) * 16, extents=lambda i: (1 << 40, 1000 << 21))
            for b in range(50)]
    planner.plan(*turn)
    policy = planner.policy
    assert len(made) == 9, made                     # 9 launches of 1,002 blocks at most fit 10,000
    assert policy.need_skipped == 200 - 9
    assert policy._refs_held <= share["refs"]
    assert [len(b) for b in policy.blocks[-9:]] == [1000] * 9   # the turn's last launches keep theirs
