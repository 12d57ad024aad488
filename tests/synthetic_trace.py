"""Small pump traces built by hand (TraceWriter), for the policy's and the simulator's tests:
allocations, launches with their bases, exact extents and costs, steps and allocator frees."""

import os

import numpy as np

from pump import channel, trace

KIND = channel.KIND
MIB = 1 << 20
BASE = 1 << 40          # managed allocations start here, 2 MiB aligned


class TraceBuilder:
    def __init__(self):
        self.records = []
        self.next_base = BASE
        self.functions = {}

    def _record(self, kind, count=0, *args):
        r = np.zeros(1, channel.EVENT)
        r["kind"], r["count"], r["device"] = KIND[kind], count, 0
        r["seq"] = len(self.records) + 1
        r["time_ns"] = len(self.records)
        arg = list(args) + [0] * (5 - len(args))
        r["arg"][0] = [int(a) for a in arg]
        self.records.append(r)

    def alloc(self, size: int) -> int:
        base = self.next_base
        self.next_base += -(-size // (2 * MIB)) * 2 * MIB
        self._record("alloc", 0, base, size, 1)
        return base

    def free(self, base: int, size: int):
        self._record("free", 0, base, size)

    def launch(self, function: int, bases, extents=None, flops=0, traffic=0):
        """One launch of `function` given `bases`; extents: [(address, bytes, written)]."""
        bases = list(bases)
        self._record("launch", len(bases), function, 7, *bases[:3])
        for i in range(3, len(bases), 5):
            chunk = bases[i:i + 5]
            self._record("launch_more", len(chunk), *chunk)
        for i in range(0, len(extents or ()), 2):
            pair = extents[i:i + 2]
            written = sum(1 << j for j, e in enumerate(pair) if e[2])
            flat = [v for a, n, _ in pair for v in (a, n)]
            flat += [0] * (4 - len(flat))
            self._record("extent", len(pair), *flat, written)
        if flops or traffic:
            self._record("cost", 0, flops, traffic, 0)

    def step(self, n: int):
        self._record("step", 0, n)

    def block_free(self, address: int, size: int):
        self._record("block_free", 0, address, size)

    def block_alloc(self, address: int, size: int):
        self._record("block_alloc", 0, address, size)

    def write(self, path, per_block: int = 1000):
        recs = np.concatenate(self.records)
        w = trace.TraceWriter(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "job", "synthetic")
        for i in range(0, len(recs), per_block):
            w.write(4242, recs[i:i + per_block])
        w.close()
        return path

    def batch(self):
        return channel.decode(np.concatenate(self.records))


def training_trace(steps=6, layers=8, layer_bytes=8 * MIB, act_bytes=4 * MIB, flops=2e9,
                   eval_after=None, short_last=False, free_activations=False):
    """A model of `layers` weights: each step runs forward (weight i, activation i) then
    backward in reverse, as training does; eval_after: an evaluation pass (forward only, other
    kernels) after that step; short_last: the last step touches half of each activation;
    free_activations: the framework's allocator takes each activation back after its backward
    kernel and hands it out again before its forward one (BLOCK_FREE, BLOCK_ALLOC)."""
    t = TraceBuilder()
    weights = [t.alloc(layer_bytes) for _ in range(layers)]
    acts = [t.alloc(act_bytes) for _ in range(layers)]
    for s in range(steps):
        t.step(s)
        frac = 2 if short_last and s == steps - 1 else 1
        for i in range(layers):
            if free_activations:
                t.block_alloc(acts[i], act_bytes)
            t.launch(100 + i, [weights[i], acts[i]],
                     [(weights[i], layer_bytes, False), (acts[i], act_bytes // frac, True)], flops, layer_bytes)
        for i in reversed(range(layers)):
            t.launch(200 + i, [weights[i], acts[i]],
                     [(weights[i], layer_bytes, True), (acts[i], act_bytes // frac, False)], 2 * flops, layer_bytes)
            if free_activations:
                t.block_free(acts[i], act_bytes)
        if eval_after is not None and s == eval_after:
            for i in range(layers):
                t.launch(300 + i, [weights[i], acts[0]],
                         [(weights[i], layer_bytes, False), (acts[0], act_bytes, True)], flops, layer_bytes)
    return t, weights, acts
