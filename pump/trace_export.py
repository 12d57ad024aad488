"""`pump trace export --perfetto`: a recorded job's trace (pump-run --trace) as a timeline.

What a trace holds is what the shim saw on the host: when each launch call, allocation, free
and synchronisation happened, by the host's CLOCK_MONOTONIC.  The shim does not use CUPTI,
so nothing here says when a kernel ran on the GPU or how long: launches are instants at the
host's launch call.  pump's prefetches and evictions are not recorded one by one either; the
shim's COUNTERS records (about twice a second) carry its bytes prefetched and evicted so far
and the bytes it believes resident, and those become counter tracks.

Tracks, per process (pid): tid 0 the host's calls that name no stream (allocations, frees,
synchronisations, the framework allocator's blocks), then one track per stream, numbered in
the order streams first appear, with the launches made on it.
"""

import numpy as np

from pump import channel, trace

KIND = channel.KIND
HOST_TID = 0
GENERATED = "generated"   # the job of traces `pump trace generate` writes (pump/tracegen)
HOST_ONLY = ("host-side times only: launch calls, not kernels on the GPU (no CUPTI); "
             "prefetches and evictions as the shim's counters")
# The driver's special stream handles (cuda.h), named as people know them.
STREAM_NAMES = {0: "stream 0 (the default stream)", 1: "CU_STREAM_LEGACY", 2: "CU_STREAM_PER_THREAD"}


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"


def export(path: str, timeline, budget: int = None) -> dict:
    """Write the trace at `path` into `timeline`; returns the notes for its "otherData".
    TraceError if the trace cannot be read."""
    header, blocks = trace.read(path)
    names = trace.function_names(blocks)
    times = [int(r["time_ns"].min()) for _, r in blocks if len(r)]
    origin = min([header["start_ns"], *times])
    processes = {}   # pid -> _Process
    for pid, records in blocks:
        p = processes.get(pid)
        if p is None:
            p = processes[pid] = _Process(timeline, pid, header, len(processes))
        p.add(records, names, origin)
    for p in processes.values():
        p.finish(budget)
    clock = "the host's CLOCK_MONOTONIC, microseconds from the trace's start"
    if header["job"] == GENERATED:
        clock = "none: a generated trace's records are 1 us apart in program order (pump simulate --timeline models time)"
    notes = {"source": f"pump trace export of {path}", "job": header["job"], "name": header["name"],
             "clock": clock, "note": HOST_ONLY,
             "processes": len(processes), "records": sum(len(r) for _, r in blocks)}
    if header["cut"]:
        notes["cut"] = trace.cut_text(header["cut"])
    return notes


class _Process:
    def __init__(self, timeline, pid, header, index):
        self.t, self.pid = timeline, pid
        timeline.name_process(pid, f"pid {pid}: {header['name'] or 'job'} (job {header['job']})",
                              labels=HOST_ONLY, sort_index=index)
        timeline.name_thread(pid, HOST_TID, "host: allocations, frees, synchronisations")
        self.streams = {}      # stream handle -> tid
        self.devices = {}
        self.live = {}         # base -> bytes of the managed allocations alive
        self.first_us = self.last_us = None

    def _tid(self, stream: int) -> int:
        tid = self.streams.get(stream)
        if tid is None:
            tid = self.streams[stream] = len(self.streams) + 1
            self.t.name_thread(self.pid, tid, f"{STREAM_NAMES.get(stream, f'stream 0x{stream:x}')}: launch calls")
        return tid

    def add(self, records, names, origin):
        if not len(records):
            return
        ts = (records["time_ns"].astype(np.int64) - origin) / 1e3
        self.first_us = ts[0] if self.first_us is None else min(self.first_us, ts[0])
        self.last_us = ts[-1] if self.last_us is None else max(self.last_us, ts[-1])
        batch = channel.decode(records)
        launch_at = np.flatnonzero((records["kind"] == KIND["launch"]) & (records["count"] <= channel.LAUNCH_BASES_MAX))
        launch = 0
        kinds, args = records["kind"].tolist(), records["arg"]
        for i, k in enumerate(kinds):
            if k == KIND["launch"] and launch < len(launch_at) and launch_at[launch] == i:
                self._launch(batch, launch, int(args[i, 1]), float(ts[i]), names)
                launch += 1
            elif k in self._RARE:
                self._RARE[k](self, [int(a) for a in args[i]], float(ts[i]), int(records["count"][i]),
                              int(records["device"][i]))

    def _launch(self, batch, i, stream, ts, names):
        function = int(batch.launch_function[i])
        bases = batch.launch_bases(i).tolist()
        args = {"function": f"0x{function:x}", "stream": f"0x{stream:x}", "allocations": len(bases),
                "bases": [f"0x{b:x}" for b in bases[:8]]}
        cost = batch.costs.get(i)
        if cost:
            args.update(flops=cost[0], bytes=cost[1])
        self.t.instant(self.pid, self._tid(stream), "launch", names.get(function, f"function 0x{function:x}"),
                       ts, args)

    def _alloc(self, a, ts, _count, _device):
        self.live[a[0]] = a[1]
        self.t.instant(self.pid, HOST_TID, "memory", f"cuMemAllocManaged {_mib(a[1])}", ts,
                       {"base": f"0x{a[0]:x}", "bytes": a[1], "flags": a[2]})
        self._managed(ts)

    def _free(self, a, ts, _count, _device):
        self.live.pop(a[0], None)
        self.t.instant(self.pid, HOST_TID, "memory", f"cuMemFree {_mib(a[1])}", ts,
                       {"base": f"0x{a[0]:x}", "bytes": a[1]})
        self._managed(ts)

    def _managed(self, ts):
        self.t.counter(self.pid, "managed memory allocated", ts, bytes=sum(self.live.values()))

    def _block(self, what, a, ts):
        self.t.instant(self.pid, HOST_TID, "allocator", f"{what} {_mib(a[1])}", ts,
                       {"address": f"0x{a[0]:x}", "bytes": a[1]})

    def _block_alloc(self, a, ts, _count, _device):
        self._block("framework allocator: block handed out", a, ts)

    def _block_free(self, a, ts, _count, _device):
        self._block("framework allocator: block taken back", a, ts)

    def _sync(self, a, ts, _count, _device):
        self.t.instant(self.pid, HOST_TID, "sync", "synchronisation returned", ts, {"epoch": a[0]})

    def _step(self, a, ts, _count, _device):
        self.t.instant(self.pid, HOST_TID, "step", f"step {a[0]}", ts, {"step": a[0]}, scope="p")

    def _counters(self, a, ts, _count, _device):
        self.t.counter(self.pid, "GPU-resident (the shim's belief)", ts, bytes=a[3])
        self.t.counter(self.pid, "prefetched so far", ts, bytes=a[2])
        self.t.counter(self.pid, "evicted so far", ts, bytes=a[4])

    def _device(self, a, ts, count, device):
        try:
            uuid = channel.device_record(device, count, a)
        except ValueError:
            return
        self.t.instant(self.pid, HOST_TID, "device", f"device {device}: {uuid}", ts, scope="p")

    def _budget(self, a, ts, count, device):
        self.t.counter(self.pid, f"pump's own budget, device {device}", ts, bytes=a[0])

    def _link(self, a, ts, count, device):
        if a[1]:
            self.t.counter(self.pid, f"link rate measured, device {device}", ts, gb_per_s=round(a[0] / a[1], 3))

    def _kernel(self, a, ts, count, device):
        self.t.counter(self.pid, f"kernel time measured, device {device}", ts, us=round(int(a[1]) / 1e3, 3))

    _RARE = {KIND["alloc"]: _alloc, KIND["free"]: _free, KIND["sync"]: _sync, KIND["step"]: _step,
             KIND["counters"]: _counters, KIND["device"]: _device, KIND["budget"]: _budget, KIND["link"]: _link,
             KIND["kernel"]: _kernel, KIND["block_alloc"]: _block_alloc, KIND["block_free"]: _block_free}

    def finish(self, budget):
        """The budget the job ran with, where the caller says (the trace does not record it)."""
        if budget and self.first_us is not None:
            for ts in (self.first_us, self.last_us):
                self.t.counter(self.pid, "budget (given to export)", ts, bytes=budget)
