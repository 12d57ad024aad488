"""pump simulate keeps a caching allocator's segments whole (issue 44, pump/simulate/segments.py):
a dead tensor's memory stays in its segment, resident and counted until evicted, the first
victim, copied out when evicted and brought back for the next tensor there; --no-segments frees
it as before.  The carve is found as bench/replay_trace.c finds it."""

import json
import subprocess
import sys

import numpy as np
import pytest

from pump.simulate import bound, engine, report, segments, workload
from synthetic_trace import MIB, TraceBuilder, training_trace

SIZE = 4 * MIB   # every allocation and tensor: two whole 2 MiB blocks


def _tensor(t, base, size=SIZE):
    t._record("alloc", 0, base, size, 1)


def segment_trace(steps=4, read_first=False):
    """Two plain allocations W and B, and a segment carved at step 0 whose one tensor A is
    allocated, written and freed each step; per step: W read, A written, A freed, B read.  With
    room for four blocks: A is used after W, so only its being dead makes it the victim.
    read_first: the tensor placed again is read before it is written (the old tensor's data is
    dead all the same)."""
    t = TraceBuilder()
    w, b = t.alloc(SIZE), t.alloc(SIZE)
    for s in range(steps):
        t.step(s)
        if s == 0:
            seg = t.alloc(SIZE)        # the shim carving it: ALLOC, FREE, ALLOC at its base
            t.free(seg, SIZE)
        _tensor(t, seg)
        if read_first:
            t.launch(4, [seg], [(seg, SIZE, False)])
        t.launch(1, [w], [(w, SIZE, False)])
        t.launch(2, [seg], [(seg, SIZE, True)])
        t.free(seg, SIZE)
        t.launch(3, [b], [(b, SIZE, False)])
    return t


@pytest.fixture
def carved(tmp_path):
    return segment_trace().write(str(tmp_path / "segment.trace"))


def _per_step(path, policy, model, keep=True):
    r = engine.run(workload.load(path, segments=keep), policy, 4 * 2 * MIB, model)
    return list(zip(r.per_step["h2d"], r.per_step["d2h"]))


def test_the_trace_has_one_segment_and_its_tensor_events(carved):
    w = workload.load(carved)
    kinds = [e[0] for k in sorted(w.events) for e in w.events[k]]
    assert w.segments == 1
    assert kinds[:4] == ["alloc", "alloc", "alloc", "carve"]
    assert kinds[4:8] == ["tensor_alloc", "tensor_free", "dead", "tensor_alloc"]
    # The segment counts whole: three allocations of 4 MiB, the tensor inside the third.
    assert w.peak_footprint == 3 * SIZE
    old = workload.load(carved, segments=False)
    assert old.segments == 0 and {e[0] for es in old.events.values() for e in es} == {"alloc", "free"}


@pytest.mark.parametrize("model", [engine.fakecuda(), engine.h100()], ids=["fakecuda", "h100"])
def test_launch_keeps_the_dead_tensor_and_evicts_it_first(carved, model):
    """Step 0: W and A come in unpopulated (nothing moves), A dies, B's room is A's: A's 4 MiB
    are copied out.  Each step after: A's tensor is placed again, evicted meanwhile: B (least
    recently used) goes for it and A's stale bytes come back; A dies, and B's room is A's again
    (W, used before A, stays): 8 MiB in and 8 out.  Freed, as before (--no-segments), A's memory
    exists nowhere when it is written again: 4 MiB each way, B's."""
    M = MIB
    assert _per_step(carved, "launch", model) == [(0, 4 * M), (8 * M, 8 * M), (8 * M, 8 * M), (8 * M, 8 * M)]
    assert _per_step(carved, "launch", model, keep=False) == [(0, 0), (4 * M, 4 * M), (4 * M, 4 * M), (4 * M, 4 * M)]


def test_the_driver_alone_copies_the_dead_memory_out_and_back(carved):
    """naive on a GPU of four 2 MiB chunks, evicted in the order they were allocated: kept in
    its segment, A's dead pages are evicted and copied out like any other and come back when A
    is written again: each step after the first moves all three allocations in and out (12 MiB
    each way).  Freed, A's pages are dropped with its chunks and populated again in place: the
    GPU holds W and B and has room for A every other step (A's room taken from W, then from B,
    which comes back after it)."""
    M = MIB
    assert _per_step(carved, "naive", engine.h100()) == [(0, 4 * M), (12 * M, 12 * M), (12 * M, 12 * M),
                                                         (12 * M, 12 * M)]
    assert _per_step(carved, "naive", engine.h100(), keep=False) == [(0, 0), (0, 4 * M), (8 * M, 4 * M), (0, 4 * M)]


def test_a_tensor_placed_over_dead_blocks_ranks_them_by_their_last_use_again(tmp_path):
    """Per step: W read, A written, A freed and at once placed again (the caching allocator's
    steady state), C read, with room for two of the three.  A's blocks stay resident and
    believed through its death, and the tensor placed over them takes them back: they rank by
    A's last use again, so C's room is W's, the least recently used (the shim's record of a
    freed tensor taken over by the next one at its extent, ranges.h).  Each step after the
    first then moves all three in and out; had A stayed dead, C's room would be A's (8 MiB)."""
    t = TraceBuilder()
    w, c = t.alloc(SIZE), t.alloc(SIZE)
    for s in range(4):
        t.step(s)
        if s == 0:
            seg = t.alloc(SIZE)
            t.free(seg, SIZE)
            _tensor(t, seg)
        t.launch(1, [w], [(w, SIZE, False)])
        t.launch(2, [seg], [(seg, SIZE, True)])
        t.free(seg, SIZE)
        _tensor(t, seg)
        t.launch(3, [c], [(c, SIZE, False)])
    path = t.write(str(tmp_path / "again.trace"))
    M = MIB
    assert workload.load(path).segments == 1
    for model in (engine.fakecuda(), engine.h100()):
        assert _per_step(path, "launch", model) == [(0, 4 * M)] + [(12 * M, 12 * M)] * 3


def test_the_bound_is_the_same_with_segments(tmp_path):
    """The bound counts what the data needs: a dead tensor's pages need no copy, kept in a
    segment or freed (a policy that discards them moves none).  Here the tensor placed again is
    read first: were A's death not counted, its 4 MiB written each step would be live."""
    path = segment_trace(6, read_first=True).write(str(tmp_path / "read.trace"))
    kept, freed = workload.load(path), workload.load(path, segments=False)
    assert kept.segments == 1
    for capacity in (2 * MIB, 8 * MIB):
        assert bound.lower_bound(kept, capacity, engine.h100()) == bound.lower_bound(freed, capacity, engine.h100())
    assert bound.lower_bound(kept, 2 * MIB, engine.h100())["live_written_bytes"] == 0


def test_a_trace_without_a_carve_is_simulated_as_before(tmp_path):
    """No carve, no segment: the events, and so every run, are those of --no-segments."""
    t, _, _ = training_trace(steps=6, layers=6, free_activations=True)
    t.free(t.alloc(SIZE), SIZE)                  # freed after a launch-free gap: not carved ...
    path = t.write(str(tmp_path / "plain.trace"))
    kept, freed = workload.load(path, batch_launches=5), workload.load(path, batch_launches=5, segments=False)
    assert kept.segments == 0 and kept.events == freed.events and kept.peak_footprint == freed.peak_footprint
    model = engine.h100()
    docs = [report.simulate(w, w.peak_footprint // 2, model) for w in (kept, freed)]
    assert json.dumps(docs[0]) == json.dumps(docs[1]) and "segments_kept" not in docs[0]


@pytest.mark.parametrize("case, carved", [
    ("alloc free alloc", True),
    ("alloc sync free alloc", True),            # only a LAUNCH parts the ALLOC from its FREE
    ("alloc free alloc-smaller", True),
    ("alloc launch free alloc", False),
    ("alloc free sync alloc", False),           # anything between the FREE and the ALLOC settles it
    ("alloc free alloc-larger", False),
    ("alloc free alloc-elsewhere", False),
    ("alloc alloc2 free alloc", False),         # the FREE is not of the last ALLOC
])
def test_the_carve_is_found_as_replay_trace_finds_it(case, carved):
    t = TraceBuilder()
    base = t.alloc(SIZE) if case.startswith("alloc ") else None
    for word in case.split()[1:]:
        if word == "sync":
            t._record("sync", 0, 1)
        elif word == "launch":
            t.launch(1, [base], [(base, SIZE, True)])
        elif word == "alloc2":
            t.alloc(SIZE)
        elif word == "free":
            t.free(base, SIZE)
        else:
            size = {"alloc": SIZE, "alloc-smaller": SIZE // 2, "alloc-larger": 2 * SIZE}.get(word, SIZE)
            _tensor(t, base + (2 * MIB if word == "alloc-elsewhere" else 0), size)
    _tags, kept = segments.classify(np.concatenate(t.records))
    assert (kept == [(base, SIZE)]) == carved, (case, kept)


def test_a_dead_tensor_leaves_its_shared_blocks_to_the_live_one():
    """Blocks another live tensor reaches into stay live; the dead tensor's own are dead."""
    live = {10 * MIB: 3 * MIB}      # [10, 13) MiB reaches into the dead tensor [13, 19)'s first block
    assert segments.dead_blocks(13 * MIB, 6 * MIB, live, [10 * MIB]) == (14 * MIB, 6 * MIB)
    assert segments.dead_blocks(12 * MIB, 1 * MIB, {13 * MIB: MIB}, [13 * MIB]) is None
    assert segments.dead_blocks(12 * MIB, 4 * MIB, {}, []) == (12 * MIB, 4 * MIB)


def test_no_segments_on_the_command_line(carved):
    run = lambda *extra: json.loads(subprocess.run(
        [sys.executable, "-m", "pump.cli", "simulate", carved, "--gpu", "fakecuda", "--capacity", str(8 * MIB),
         "--policy", "launch", "--json", *extra], capture_output=True, text=True, check=True).stdout)
    kept, freed = run(), run("--no-segments")
    assert kept["segments_kept"] == 1 and "segments_kept" not in freed
    assert kept["policies"]["launch"]["total"]["bytes_d2h"] == (4 + 3 * 8) * MIB
    assert freed["policies"]["launch"]["total"]["bytes_d2h"] == 3 * 4 * MIB
