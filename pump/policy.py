"""Prefetch policy beyond the launch-time rule, run by pumpd on each job's events.

The policy turns what a job's launches touched into a plan (pump_channel.h):
per function, the allocations to prefetch when it is launched.  This first
policy is the successor rule: a launch of f prefetches what the launch that
followed f last time touched, one launch of lookahead learned from history.
It costs pumpd O(launches) vectorised work per batch and O(distinct functions)
in Python.
"""

import numpy as np

from pump.channel import Batch


class SuccessorPolicy:
    def __init__(self):
        self.next_of = {}    # function -> the function launched after it, last time
        self.bases_of = {}   # function -> the allocation bases its last launch touched
        self.last = None     # the last launch's function, carried across batches
        self.changed = False # triggers() would now answer differently

    def observe(self, batch: Batch):
        functions = batch.launch_function
        if functions is None or len(functions) == 0:
            return
        seq = functions.tolist()
        previous = ([self.last] if self.last is not None else []) + seq[:-1]
        following = seq if self.last is not None else seq[1:]
        successors = dict(zip(previous, following))  # the last pair of each function wins
        for f, g in successors.items():
            if self.next_of.get(f) != g:
                self.next_of[f] = g
                self.changed = True
        # Each distinct function's last launch in this batch.
        distinct, first_from_end = np.unique(functions[::-1], return_index=True)
        for f, i in zip(distinct.tolist(), (len(seq) - 1 - first_from_end).tolist()):
            bases = tuple(batch.launch_bases(i).tolist())
            if self.bases_of.get(f) != bases:
                self.bases_of[f] = bases
                self.changed = True
        self.last = seq[-1]

    def forget(self, bases):
        """Allocations freed: no trigger names them any more."""
        dead = set(bases)
        if not dead:
            return
        for f, touched in list(self.bases_of.items()):
            if dead.intersection(touched):
                self.bases_of[f] = tuple(b for b in touched if b not in dead)
                self.changed = True

    def triggers(self) -> dict:
        """function -> allocation bases to prefetch before its launch."""
        self.changed = False
        return {f: self.bases_of[g] for f, g in self.next_of.items() if self.bases_of.get(g)}
