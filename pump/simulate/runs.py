"""The engine's runs for one command, each made once: a run is known by what it reads, so the
table, the range's other case, the plot and the sweep share the runs that read the same
things (a gpt2-medium run takes seconds, and a sweep asks for the same ones again and again).

- The policies in RATE_FREE read none of the rates the range of cases varies
  (engine.range_models: explicit migrations each way, duplex) on a GPU that evicts at its
  memory: unlimited memory, and the driver alone (its faults and evictions go at the link's
  line rate).  tests/test_simulate.py holds them equal across the cases.
- ideal reads no capacity either: it has unlimited memory.
"""

import dataclasses
import time

from pump.simulate import engine

RATE_FREE = ("ideal", "naive")


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

    @staticmethod
    def key(policy, capacity, model):
        if policy == "ideal" or (policy in RATE_FREE and model.gpu_limits_memory):
            model = dataclasses.replace(model, name="", bandwidth=0.0, d2h_bandwidth=0.0, full_duplex=True)
            capacity = None if policy == "ideal" else int(capacity)
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
        r = self.done[key] = engine.run(self.w, policy, capacity, model, recorder)
        self.seconds.append(time.perf_counter() - start)
        return r

    def step(self, policy, capacity, model) -> float:
        """The run's mean steady step, in seconds."""
        return self.run(policy, capacity, model).step_mean_seconds
