"""The engine's runs for one command, each made once: a run is known by what it reads, so the
table, the range's other case, the plot and the sweep share the runs that read the same
things (a gpt2-medium run takes seconds, and a sweep asks for the same ones again and again).

- The policies in RATE_FREE read none of the rates the range of cases varies
  (engine.range_models: explicit migrations each way, duplex) on a GPU that evicts at its
  memory: unlimited memory, and the driver alone (its faults and evictions go at the link's
  line rate).  tests/test_simulate.py holds them equal across the cases.
- ideal reads no capacity either: it has unlimited memory.
- The other policies' runs in the range's two cases make the same moves, launch's throughout and
  lookahead's up to its first plan (link.py): a run records them, and the run of the other
  case only times them.
"""

import dataclasses
import time

from pump.simulate import engine, link

RATE_FREE = ("ideal", "naive")
# Recorded moves kept for a run of the other case (the oldest dropped first): the table asks for
# each policy's in turn in one case, then in the other; launch's take 70 MB on gpt2-medium.
MOVES_KEPT = 2


def _size(n: float) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n:.0f} B"


class Runs:
    """engine.run's Results for one workload, by (policy, capacity, model) less what the run
    does not read; progress(what): called as each run that is made begins."""

    def __init__(self, workload, progress=None):
        self.w, self.progress = workload, progress
        self.done = {}
        self.seconds = []           # each run's wall time, in order (an ETA's basis)
        self.moves = {}             # decided_by's key -> the link.Moves a run recorded

    @staticmethod
    def key(policy, capacity, model):
        if policy == "ideal" or (policy in RATE_FREE and model.gpu_limits_memory):
            return Runs.decided_by(policy, None if policy == "ideal" else capacity, model)
        return policy, int(capacity), model

    @staticmethod
    def decided_by(policy, capacity, model):
        """What a run's moves depend on: all but the rates the range varies and their names."""
        model = dataclasses.replace(model, name="", bandwidth=0.0, d2h_bandwidth=0.0, full_duplex=True)
        return policy, capacity if capacity is None else int(capacity), model

    def to_make(self, plan) -> int:
        """How many runs of `plan` ([(policy, capacity, model)]) are not made yet."""
        return len({self.key(*p) for p in plan} - set(self.done))

    def run(self, policy, capacity, model, recorder=None, note="") -> engine.Result:
        """The run's Result, made now unless made before (a run recording a timeline is made
        again: the recorder must see it); note: said after the run in the progress."""
        key = self.key(policy, capacity, model)
        if key in self.done and recorder is None:
            return self.done[key]
        if self.progress:
            self.progress(f"{policy} at {_size(capacity)}{note}")
        start = time.perf_counter()
        r = self.done[key] = engine.run(self.w, policy, capacity, model, recorder, self._moves(policy, capacity, model))
        self.seconds.append(time.perf_counter() - start)
        return r

    def _moves(self, policy, capacity, model):
        """The moves recorded for this run in the other case (link.Moves), taken; else where
        this run records its own (kept for the other case's); None for the runs no other makes."""
        if policy in RATE_FREE:
            return None
        decided = self.decided_by(policy, capacity, model)
        moves = self.moves.pop(decided, None)
        if moves is None:
            moves = self.moves[decided] = link.Moves()
            while len(self.moves) > MOVES_KEPT:
                del self.moves[next(iter(self.moves))]
        return moves

    def step(self, policy, capacity, model) -> float:
        """The run's mean steady step, in seconds."""
        return self.run(policy, capacity, model).step_mean_seconds
