"""Trace files: what pumpd ingested for one job (layout: pump_channel.h).

pump-run opens the file (with the user's own permissions) and hands the open
descriptor to pumpd with the job's registration; pumpd appends one block per
process per ring read.  read() checks everything it reads and names what is
wrong with a corrupt or truncated file.
"""

import os
import time

import numpy as np

from pump import channel

ffi, C = channel.ffi, channel.C
HEADER = "struct pump_trace_header"
BLOCK = "struct pump_trace_block"


class TraceError(Exception):
    """A trace file that cannot be read; str() names the file and what is wrong."""


class TraceWriter:
    def __init__(self, fd: int, job: str, name: str):
        self.file = os.fdopen(fd, "wb", buffering=1 << 20)
        header = ffi.new(HEADER + " *")
        header.magic, header.version = C.PUMP_TRACE_MAGIC, C.PUMP_TRACE_VERSION
        header.record_size = channel.RECORD_SIZE
        header.start_ns = time.monotonic_ns()
        header.job = job.encode()[: len(header.job) - 1]
        header.name = name.encode()[: len(header.name) - 1]
        self.file.write(ffi.buffer(header))

    def write(self, pid: int, records: np.ndarray):
        block = ffi.new(BLOCK + " *")
        block.magic, block.pid, block.records = C.PUMP_TRACE_BLOCK_MAGIC, pid, len(records)
        self.file.write(ffi.buffer(block))
        self.file.write(records.tobytes())

    def close(self):
        self.file.close()


def read(path):
    """(header dict, [(pid, records)]) of a trace file; TraceError if it is bad."""
    try:
        data = open(path, "rb").read()
    except OSError as exc:
        raise TraceError(f"{path}: cannot read: {exc.strerror}") from None
    hsize, bsize = ffi.sizeof(HEADER), ffi.sizeof(BLOCK)
    if len(data) < hsize:
        raise TraceError(f"{path}: truncated: {len(data)} bytes, a trace header is {hsize}")
    buf = ffi.from_buffer(data)  # kept alive while the casts below point into it
    h = ffi.cast(HEADER + " *", buf)
    if h.magic != C.PUMP_TRACE_MAGIC:
        raise TraceError(f"{path}: not a pump trace (magic 0x{h.magic:08x})")
    if not 1 <= h.version <= C.PUMP_TRACE_VERSION or h.record_size != channel.RECORD_SIZE:
        raise TraceError(f"{path}: trace version {h.version} with {h.record_size}-byte records; "
                         f"this pump reads versions 1 to {C.PUMP_TRACE_VERSION}, {channel.RECORD_SIZE}-byte")
    header = {"job": ffi.string(h.job).decode(errors="replace"), "name": ffi.string(h.name).decode(errors="replace"),
              "start_ns": h.start_ns}
    blocks, offset = [], hsize
    while offset < len(data):
        if len(data) - offset < bsize:
            raise TraceError(f"{path}: truncated block header at byte {offset}")
        b = ffi.cast(BLOCK + " *", buf + offset)
        if b.magic != C.PUMP_TRACE_BLOCK_MAGIC:
            raise TraceError(f"{path}: bad block magic 0x{b.magic:08x} at byte {offset}")
        n, pid = b.records, b.pid
        offset += bsize
        if n > (len(data) - offset) // channel.RECORD_SIZE:
            raise TraceError(f"{path}: truncated: block at byte {offset - bsize} promises {n} records")
        blocks.append((pid, np.frombuffer(data, channel.EVENT, n, offset).copy()))
        offset += n * channel.RECORD_SIZE
    return header, blocks


# ---- reading a trace for people: `pump trace show|stats FILE` ----
def _names(blocks) -> dict:
    names = {}
    for _pid, records in blocks:
        names.update(channel.decode(records).functions)
    return names


def _describe(record, names: dict):
    """One record's kind and details, or None for records that continue the one before."""
    kind, count, arg = int(record["kind"]), int(record["count"]), record["arg"]
    k = {v: n for n, v in channel.KIND.items()}.get(kind, f"kind-{kind}")
    if k == "alloc":
        return k, f"0x{int(arg[0]):x} {int(arg[1])} bytes flags {int(arg[2])}"
    if k == "free":
        return k, f"0x{int(arg[0]):x} {int(arg[1])} bytes"
    if k == "launch":
        name = names.get(int(arg[0]), "?")
        shown = ", ".join(f"0x{int(b):x}" for b in arg[2:2 + min(count, 3)])
        more = f" (+{count - 3} more)" if count > 3 else ""
        return k, f"{name} [0x{int(arg[0]):x}] stream 0x{int(arg[1]):x}: {count} allocations {shown}{more}"
    if k == "function":
        return k, f"0x{int(arg[0]):x} {names.get(int(arg[0]), '')}"
    if k == "sync":
        return k, f"epoch {int(arg[0])}"
    if k == "counters":
        return k, ("launches {} managed {} prefetched {} resident {} evicted {}"
                   .format(*(int(a) for a in arg)))
    if k == "extent":
        return k, ", ".join(f"{'w' if int(arg[4]) >> j & 1 else 'r'} 0x{int(arg[2 * j]):x} {int(arg[2 * j + 1])} bytes"
                            for j in range(min(count, 2)))
    if k == "cost":
        return k, f"{int(arg[0])} flops, {int(arg[1])} bytes" + (f", {int(arg[2])} ns" if int(arg[2]) else "")
    if k in ("block_alloc", "block_free"):
        return k, f"0x{int(arg[0]):x} {int(arg[1])} bytes"
    if k == "step":
        return k, f"{int(arg[0])}"
    if k == "device":
        device = int(record["device"])
        try:
            return k, f"{device} {channel.device_record(device, count, arg)}"
        except ValueError as exc:
            return k, f"invalid: {exc}"
    return None if k in ("launch_more", "name") else (k, "")


def show(path, out):
    """Every record, one line each: pid, time (ms from the trace's start), kind, what."""
    header, blocks = read(path)
    names = _names(blocks)
    out.write(f"# pump trace of job {header['job']} ({header['name']})\n")
    for pid, records in blocks:
        for r in records:
            line = _describe(r, names)
            if line is not None:
                ms = (int(r["time_ns"]) - header["start_ns"]) / 1e6
                out.write(f"{pid:>8} {ms:12.3f} {line[0]:<9} {line[1]}\n")


def stats(path) -> dict:
    """What a trace holds, in totals: per kind, per process, and the busiest functions."""
    header, blocks = read(path)
    kinds, launches_of = {}, {}
    live = peak = flops = 0
    sizes = {}
    pids = set()
    times = []
    for pid, records in blocks:
        pids.add(pid)
        if len(records):
            times += [int(records["time_ns"].min()), int(records["time_ns"].max())]
        batch = channel.decode(records)
        for k, v in channel.KIND.items():
            kinds[k] = kinds.get(k, 0) + int((records["kind"] == v).sum())
        for f in batch.launch_function.tolist():
            launches_of[f] = launches_of.get(f, 0) + 1
        for base, size in batch.allocs:
            live += size - sizes.get(base, 0)
            sizes[base] = size
            peak = max(peak, live)
        for base, _ in batch.frees:
            live -= sizes.pop(base, 0)
        flops += sum(cost[0] for cost in batch.costs.values())
    names = _names(blocks)
    busiest = sorted(launches_of.items(), key=lambda kv: -kv[1])[:10]
    return {
        "job": header["job"], "name": header["name"], "processes": len(pids),
        "records": sum(len(r) for _, r in blocks), "kinds": kinds,
        "launches": kinds.get("launch", 0), "functions": len(launches_of),
        "managed_bytes_peak": peak,
        "steps": kinds.get("step", 0), "flops": flops,
        "seconds": (max(times) - min(times)) / 1e9 if times else 0.0,
        "busiest_functions": [{"function": f"0x{f:x}", "name": names.get(f, "?"), "launches": n}
                              for f, n in busiest],
    }
