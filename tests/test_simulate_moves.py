"""The range's second case times the first case's moves (pump/simulate/link.py, Streams) instead of
deciding them again: a run doing so gives the Result of a run of its own, whole for the launch
rule and up to the first plan for lookahead, and decides for itself where its first plan comes
elsewhere.  And a trace's launches are worked out once per allocations' version (workload.py)."""

import copy
import dataclasses

import pytest

from pump.simulate import engine, link, runs, workload
from synthetic_trace import MIB, TraceBuilder, training_trace


def _training(tmp_path, **kw):
    t, _, _ = training_trace(steps=8, layers=6, **kw)
    return workload.load(t.write(str(tmp_path / "t.trace")), batch_launches=5)


def _cases(gpu="h100-pcie"):
    return dict(engine.range_models(gpu))


@pytest.mark.parametrize("policy", ["launch", "lookahead"])
@pytest.mark.parametrize("share", [0.3, 0.5, 0.8])
@pytest.mark.parametrize("free_activations", [False, True])   # True: lookahead discards
def test_the_other_case_timing_the_recorded_moves_gets_its_own_result(tmp_path, policy, share, free_activations):
    w = _training(tmp_path, free_activations=free_activations)
    capacity, cases = int(w.peak_footprint * share), _cases()
    moves = link.Moves()
    best = engine.run(w, policy, capacity, cases["best"], moves=moves)
    assert dataclasses.asdict(best) == dataclasses.asdict(engine.run(w, policy, capacity, cases["best"]))
    if policy == "launch":
        assert moves.until == w.launches and moves.state is None
    else:   # recorded up to lookahead's first plan, with what it had decided there
        assert 0 < moves.until < w.launches and moves.state is not None
    assert sum(map(len, moves.before)) > 0
    timed = engine.run(w, policy, capacity, cases["worst"], moves=moves)
    own = engine.run(w, policy, capacity, cases["worst"])
    assert dataclasses.asdict(timed) == dataclasses.asdict(own)
    assert dataclasses.asdict(engine.run(w, policy, capacity, cases["worst"], moves=moves)) == \
        dataclasses.asdict(own)   # the recording stays as it was: it can be timed again


def test_a_run_whose_first_plan_comes_elsewhere_decides_for_itself(tmp_path, monkeypatch):
    """The recorded moves end one launch before where this run's first plan comes (or where
    it has none yet): it cannot go on from them, and makes the whole run itself."""
    w = _training(tmp_path)
    capacity, cases = w.peak_footprint // 2, _cases()
    moves = link.Moves()
    engine.run(w, "lookahead", capacity, cases["best"], moves=moves)
    own = dataclasses.asdict(engine.run(w, "lookahead", capacity, cases["worst"]))
    made = []
    monkeypatch.setattr(engine._Run, "__init__", _counting(engine._Run.__init__, made))
    for until in (moves.until - 1, moves.until + 1):
        shifted = copy.copy(moves)
        shifted.until = until
        made.clear()
        assert dataclasses.asdict(engine.run(w, "lookahead", capacity, cases["worst"], moves=shifted)) == own
        assert [replay is not None for replay in made] == [True, False]   # tried, then its own


def _counting(init, made):
    def counted(self, *args, replay=None, **kw):
        made.append(replay)
        init(self, *args, replay=replay, **kw)
    return counted


def test_runs_keeps_a_run_moves_for_the_other_case_only(tmp_path):
    """The table's order: each policy in the best case, then in the worst; the worst case's
    runs take the moves (and keep none), and no more than MOVES_KEPT recordings are held."""
    w = _training(tmp_path)
    capacity, cases = w.peak_footprint // 2, _cases()
    table = runs.Runs(w)
    for policy in ("ideal", "naive", "launch", "lookahead"):
        table.run(policy, capacity, cases["best"])
    assert len(table.moves) == runs.MOVES_KEPT == 2
    for policy in ("ideal", "naive", "launch", "lookahead"):
        assert dataclasses.asdict(table.run(policy, capacity, cases["worst"])) == \
            dataclasses.asdict(engine.run(w, policy, capacity, cases["worst"]))
    assert not table.moves
    for share in (0.3, 0.4, 0.6):   # the plot's runs, best case only: the oldest recordings go
        table.run("launch", int(w.peak_footprint * share), cases["best"])
    assert len(table.moves) == runs.MOVES_KEPT


def test_a_launch_after_its_allocation_is_made_again_takes_the_new_one(tmp_path):
    """The same launch (bases, no extents) before and after its allocation is freed and made
    again at the same address, larger: it takes the new allocation's blocks, not the first's."""
    t = TraceBuilder()
    a = t.alloc(4 * MIB)
    for s in range(3):
        t.step(s)
        t.launch(1, [a])
    t.free(a, 4 * MIB)
    t._record("alloc", 0, a, 8 * MIB, 1)
    t.launch(1, [a])
    w = workload.load(t.write(str(tmp_path / "a.trace")))
    assert [len(blocks) for blocks in w.arg_blocks] == [2, 2, 2, 4]
    assert [len(pages) for pages in w.touched] == [2, 2, 2, 4]
