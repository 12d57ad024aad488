"""`pump simulate --timeline`: one simulated step per policy as a timeline (pump/timeline.py),
one process per policy, so that naive and lookahead can be compared by eye.

The step drawn is the first steady one (engine.steady_steps), the same for every policy; time 0
is the host's first launch call of that step.  Drawn is what the engine does while it makes
that step's launches: the host's launch calls; the kernels on the compute stream, each as long
as the model says (roofline time plus its faults' stall plus the driver's evictions on its
fault path); the bytes that move on the two copy streams (prefetches host->GPU, evictions
GPU->host; calls that move nothing are not drawn) and on the fault path (drawn at the start
of the kernel that faulted: the model adds the stall to the kernel, not at a place in it);
each transfer again as an async span from the host's call to its completion, since queued
transfers overlap; and as counters the bytes resident on the GPU, the bytes the shim believes
resident, and the capacity.  All of it modelled, not measured.
"""

import numpy as np

from pump.simulate import engine

HOST, COMPUTE, H2D, D2H, FAULTS = 1, 2, 3, 4, 5
TRACKS = {HOST: "host: launch calls", COMPUTE: "GPU compute stream: kernels",
          H2D: "copy host->GPU: prefetches", D2H: "copy GPU->host: evictions",
          FAULTS: "fault path: migrations on faults, the driver's evictions"}


class StepTimeline:
    """Recorders for each policy `pump simulate` runs, into one timeline."""

    def __init__(self, timeline, workload, capacity: int, model, policies):
        self.t, self.w, self.capacity, self.m = timeline, workload, int(capacity), model
        self.policies = tuple(policies)
        self.step = engine.steady_steps(workload)[0]
        self.lo, self.hi = engine._step_bounds(workload)[self.step]
        self.functions = np.concatenate([b.launch_function for _, b in workload.batches])
        self.names = {}
        for _, b in workload.batches:
            self.names.update(b.functions)
        self.recorders = []

    def recorder(self, policy):
        """The recorder for one policy's run (engine.run's recorder), or None if it is not drawn."""
        if policy not in self.policies:
            return None
        pid = self.policies.index(policy) + 1
        what = "unlimited memory" if policy == "ideal" else f"capacity {self.capacity / (1 << 20):.1f} MiB"
        self.t.name_process(pid, f"{policy} (simulated)", sort_index=pid,
                            labels=f"modelled, not measured: {self.m.name}, {what}, step {self.step} "
                                   f"(launches {self.lo}..{self.hi - 1})")
        for tid, name in TRACKS.items():
            self.t.name_thread(pid, tid, name)
        self.recorders.append(_Recorder(self, pid, policy != "ideal"))
        return self.recorders[-1]

    def finish(self) -> dict:
        """Close the capacity counters where each policy's step ends; the notes for "otherData"."""
        for r in self.recorders:
            if r.memory_limited and r.t0 is not None:
                self.t.counter(r.pid, "capacity", r.end, bytes=self.capacity)
        return {"source": f"pump simulate --timeline of {self.w.path}", "model": self.m.name,
                "capacity_bytes": self.capacity, "step": self.step, "launches": [self.lo, self.hi - 1],
                "policies": {p: i + 1 for i, p in enumerate(self.policies)},
                "note": "modelled, not measured: one simulated step per policy (pid), "
                        "time 0 at the step's first launch call"}


class _Recorder:
    def __init__(self, owner: StepTimeline, pid: int, memory_limited: bool):
        self.o, self.t, self.pid = owner, owner.t, pid
        self.memory_limited = memory_limited
        self.active = False
        self.t0 = None
        self.end = 0.0

    def _us(self, seconds: float) -> float:
        return (seconds - self.t0) * 1e6

    def launch(self, k: int, cpu: float):
        o = self.o
        self.active = o.lo <= k < o.hi
        if self.active and self.t0 is None:
            self.t0 = cpu
            if self.memory_limited:
                self.t.counter(self.pid, "capacity", 0.0, bytes=o.capacity)
        if self.active:
            self.t.instant(self.pid, HOST, "launch call", self._name(k), self._us(cpu), {"launch": k})

    def _name(self, k: int) -> str:
        f = int(self.o.functions[k])
        return self.o.names.get(f) or f"function 0x{f:x}"

    def kernel(self, k, start, duration, faults, faulted, moved_back, resident, believed):
        if not self.active:
            return
        m = self.o.m
        ts, end = self._us(start), self._us(start + duration)
        self.end = max(self.end, end)
        self.t.slice(self.pid, COMPUTE, "kernel", self._name(k), ts, end,
                     {"launch": k, "faults": faults, "fault_stall_us": faults * m.fault_seconds * 1e6})
        if faults:
            stall = ts + faults * m.fault_seconds * 1e6
            self.t.slice(self.pid, FAULTS, "fault migration", f"{faults} faults", ts, stall,
                         {"bytes_host_to_gpu": faulted, "launch": k})
            if moved_back:
                self.t.slice(self.pid, FAULTS, "driver eviction", "driver evicts", stall,
                             stall + moved_back / m.link_out * 1e6, {"bytes_gpu_to_host": moved_back, "launch": k})
        if self.memory_limited:
            self.t.counter(self.pid, "GPU-resident", ts, bytes=resident)
            self.t.counter(self.pid, "believed resident by the shim", ts, bytes=believed)

    def transfer(self, kind: str, block: int, moved: int, issued: float, start: float, end: float):
        if not self.active:
            return
        tid, cat = (H2D, "prefetch") if kind == "prefetch" else (D2H, "evict")
        address = int(self.o.w.block_address[block])
        args = {"address": f"0x{address:x}", "bytes": moved}
        a, b = self._us(start), self._us(end)
        self.end = max(self.end, b)
        self.t.slice(self.pid, tid, cat, f"{cat} {moved >> 10} KiB", a, b, args)
        self.t.span(self.pid, tid, cat, f"{cat} in flight", self._us(issued), b,
                    dict(args, queued_us=a - self._us(issued)))
