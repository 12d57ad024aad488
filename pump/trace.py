"""Trace files: what pumpd ingested for one job (layout: pump_channel.h).

pump-run opens the file (with the user's own permissions, pump/outfile.py's open_in_place) and hands the open
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


def header_bytes(job: str, name: str) -> bytes:
    """A trace file's header, starting its clock now."""
    header = ffi.new(HEADER + " *")
    header.magic, header.version = C.PUMP_TRACE_MAGIC, C.PUMP_TRACE_VERSION
    header.record_size = channel.RECORD_SIZE
    header.start_ns = time.monotonic_ns()
    header.job = job.encode()[: len(header.job) - 1]
    header.name = name.encode()[: len(header.name) - 1]
    return bytes(ffi.buffer(header))


def block_bytes(pid: int, records: np.ndarray) -> bytes:
    """One block: a process's records from one ring read."""
    block = ffi.new(BLOCK + " *")
    block.magic, block.pid, block.records = C.PUMP_TRACE_BLOCK_MAGIC, pid, len(records)
    return bytes(ffi.buffer(block)) + records.tobytes()


class TraceWriter:
    """A trace written in one go (the trace generator); pumpd writes its jobs'
    traces off its event loop instead (pumpd/tracing.py)."""

    def __init__(self, fd: int, job: str, name: str):
        self.file = os.fdopen(fd, "wb", buffering=1 << 20)
        self.file.write(header_bytes(job, name))

    def write(self, pid: int, records: np.ndarray):
        self.file.write(block_bytes(pid, records))

    def close(self):
        self.file.close()


def count_records(path) -> int:
    """The whole records a trace holds (what a cut-off file still holds)."""
    try:
        _header, blocks = read(path)
    except TraceError:
        return 0
    return sum(len(records) for _pid, records in blocks)


def report(path, sent: int, status) -> str:
    """pump-run's line on the trace: written, or incomplete and why.  sent: the records
    the job's shims put in their rings; status: pumpd's word on the trace at the job's
    end (None if pumpd could not be asked)."""
    held = count_records(path)
    if status is None:
        why = "pumpd ended before the job did"
    elif status.get("problem"):
        why = status["problem"]
    elif status.get("records_dropped"):
        why = f"{status['records_dropped']} records were dropped (writing fell behind)"
    elif held < sent:
        why = "pumpd did not read every record"
    else:
        return f"trace written: {path} ({held} records)"
    return f"warning: trace incomplete: {path} holds {held} of the {sent} records the job sent ({why})"


def read(path):
    """(header dict, [(pid, records)]) of a trace file; TraceError if it is bad.

    A file cut short (a full disk, pumpd killed mid-write) reads up to its last whole
    record; header["cut"] then says where it ends ({"at_byte", "file_bytes"}; else None)."""
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
              "start_ns": h.start_ns, "cut": None}
    blocks, offset = [], hsize
    ends = hsize  # the byte after the last whole record (or block)
    while len(data) - offset >= bsize:
        b = ffi.cast(BLOCK + " *", buf + offset)
        if b.magic != C.PUMP_TRACE_BLOCK_MAGIC:
            raise TraceError(f"{path}: bad block magic 0x{b.magic:08x} at byte {offset}")
        whole = min(b.records, (len(data) - offset - bsize) // channel.RECORD_SIZE)
        if whole:
            blocks.append((b.pid, np.frombuffer(data, channel.EVENT, whole, offset + bsize).copy()))
        if whole or not b.records:
            ends = offset + bsize + whole * channel.RECORD_SIZE
        if whole < b.records:
            break  # cut inside this block's records
        offset = ends
    if ends < len(data):
        header["cut"] = {"at_byte": ends, "file_bytes": len(data)}
    return header, blocks


# ---- reading a trace for people: `pump trace show|stats FILE` ----
def function_names(blocks) -> dict:
    """Every kernel name the trace records: function handle -> name."""
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
    if k == "budget":
        return k, f"device {int(record['device'])}: pump's own budget {int(arg[0])} bytes"
    if k == "link":
        moved, ns = int(arg[0]), int(arg[1])
        rate = f", {moved / ns:.2f} GB/s" if ns else ""
        return k, f"device {int(record['device'])}: a prefetch of {moved} bytes took {ns} ns on the GPU{rate}"
    if k == "kernel":
        return k, f"device {int(record['device'])}: a launch of key 0x{int(arg[0]):x} ran {int(arg[1])} ns on the GPU"
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
    names = function_names(blocks)
    out.write(f"# pump trace of job {header['job']} ({header['name']})\n")
    for pid, records in blocks:
        for r in records:
            line = _describe(r, names)
            if line is not None:
                ms = (int(r["time_ns"]) - header["start_ns"]) / 1e6
                out.write(f"{pid:>8} {ms:12.3f} {line[0]:<9} {line[1]}\n")
    if header["cut"]:
        out.write(f"# {cut_text(header['cut'])}\n")


def cut_text(cut: dict) -> str:
    """Where a trace cut short ends."""
    return (f"cut short: the last whole record ends at byte {cut['at_byte']:,} of {cut['file_bytes']:,} "
            "(the file's end was never written: a full disk, or its writer killed)")


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
    names = function_names(blocks)
    busiest = sorted(launches_of.items(), key=lambda kv: -kv[1])[:10]
    return {
        "iteration": iteration(blocks),
        "job": header["job"], "name": header["name"], "processes": len(pids),
        "records": sum(len(r) for _, r in blocks), "kinds": kinds,
        "launches": kinds.get("launch", 0), "functions": len(launches_of),
        "managed_bytes_peak": peak,
        "steps": kinds.get("step", 0), "flops": flops,
        "seconds": (max(times) - min(times)) / 1e9 if times else 0.0,
        "busiest_functions": [{"function": f"0x{f:x}", "name": names.get(f, "?"), "launches": n}
                              for f, n in busiest],
        "cut": header["cut"],
    }


ITERATION_MULTIPLES = 16  # multiples of the kernels' period tried as the iteration
NEAR_SHARE = 0.01          # shares of repeated keys this close are equals: the shorter period wins


def iteration(blocks) -> dict:
    """The busiest process's iteration as its kernels repeat, and how many of the last
    iteration's launches have the launch key they had an iteration before: lookahead plans on
    keys (pump_channel.h: the kernel and the allocations its arguments point into), so where an
    allocator gives a step's tensors other memory than the step before, keys do not repeat and
    no plan is learned.  The kernels' own period may be shorter than a step's (two kernels
    alternating on other buffers), so the iteration is the multiple of it, up to
    ITERATION_MULTIPLES, under which the most launches repeat, by key or by naming a step's
    allocations by their order (_same_in_allocation_order: on PyTorch's caching allocator, where
    keys do not repeat, that order finds the step; the shortest period of those within NEAR_SHARE
    of the most); None where the kernels do not repeat."""
    from pump.iteration import IterationDetector
    per_pid = {}
    for pid, records in blocks:
        batch = channel.decode(records)
        per_pid.setdefault(pid, []).append((records, batch))
    if not per_pid:
        return None
    read = max(per_pid.values(), key=lambda rb: sum(len(b.launch_function) for _, b in rb))
    functions = np.concatenate([b.launch_function for _, b in read]).astype(np.uint64)
    keys = np.concatenate([channel.launch_keys(b) for _, b in read])
    detector = IterationDetector()
    detector.extend(functions)
    kernels = detector.detect()
    if not kernels:
        return None
    allocations = _launch_allocations(read)
    periods = range(kernels, min(ITERATION_MULTIPLES * kernels, len(keys) // 2) + 1, kernels)
    # Each period judged over the same last launches (the longest period's), each against the
    # launch a period before, so that no period gains by diluting one launch that did not repeat.
    span = periods[-1]
    judged = []
    for period in periods:
        keys_same = int(np.count_nonzero(keys[-span:] == keys[-span - period:-period]))
        order_same = _same_in_allocation_order(allocations, period, span)
        judged.append((max(keys_same, order_same), period))
    most = max(same for same, _ in judged)
    period = next(p for same, p in judged if same >= most - NEAR_SHARE * span)  # the shortest of the best
    same = int(np.count_nonzero(keys[-period:] == keys[-2 * period:-period]))
    ordered = _same_in_allocation_order(allocations, period, period)
    return {"launches": period, "keys_repeated": same, "keys_repeated_share": same / period,
            "order_repeated": ordered, "order_repeated_share": ordered / period}


def _launch_allocations(read):
    """Per launch, in order: (function, ((allocation number, size) or (None, base) per base)),
    the allocations made before each launch, and each allocation's size by its number: the
    allocations a launch's bases name, numbered in the order they were made (ALLOC records; a
    base no ALLOC names keeps its address). read: [(records, their channel.decode())] in order;
    the bases are decode's."""
    live, launches, allocs_before, sizes = {}, [], [], []
    alloc, free = channel.KIND["alloc"], channel.KIND["free"]
    for records, batch in read:
        kinds, args = records["kind"], records["arg"]
        changes = np.flatnonzero((kinds == alloc) | (kinds == free)).tolist()
        # each ALLOC or FREE takes effect before the launches whose records come after it
        launches_before = np.searchsorted(batch.launch_record, changes).tolist()
        functions, at = batch.launch_function.tolist(), 0
        for i in range(len(functions) + 1):
            while at < len(changes) and launches_before[at] <= i:
                k, base = changes[at], int(args[changes[at], 0])
                if kinds[k] == alloc:
                    live[base] = (len(sizes), int(args[k, 1]))
                    sizes.append(int(args[k, 1]))
                else:
                    live.pop(base, None)
                at += 1
            if i < len(functions):
                allocs_before.append(len(sizes))
                launches.append((functions[i], tuple(live.get(b, (None, b)) for b in batch.launch_bases(i).tolist())))
    return launches, allocs_before, sizes


def _same_in_allocation_order(allocations, period: int, span: int) -> int:
    """How many of the last `span` launches name what the launch `period` launches before named,
    where an allocation made during an iteration (the trace's last launches cut into `period`s) is
    named by its size and its place among that iteration's allocations of that size (the k-th of
    12 MiB), relative to the launch's own iteration (this one's, or the one before's): what keys
    that named a step's allocations by that order, not their address, would repeat. An allocation
    of another size made or left out (the H200's GPT-2 made one more every other step) shifts no
    other size's names. One made before both iterations keeps its number (weights, optimizer
    state). allocations: _launch_allocations' answer."""
    launches, before, sizes = allocations
    n = len(launches)
    if n < span + period:
        return 0
    # window w: launches [n - (w + 1) * period, n - w * period), newest first, and its allocations
    count = -(-span // period) + 2
    edges = [len(sizes)] + [before[n - w * period] if n - w * period >= 0 else 0 for w in range(1, count + 1)]
    names = []
    for hi, lo in zip(edges, edges[1:]):
        seen, named = {}, {}
        for number in range(lo, hi):
            seen[sizes[number]] = seen.get(sizes[number], 0) + 1
            named[number] = (sizes[number], seen[sizes[number]])
        names.append(named)

    def name(base, w: int):
        number, size = base
        if number is None:
            return ("address", size)
        for back in (0, 1):
            if w + back < len(names) and number in names[w + back]:
                return ("made", back, names[w + back][number])
        return ("kept", number)

    same = 0
    for i in range(n - span, n):
        w = (n - 1 - i) // period
        (f0, named0), (f1, named1) = launches[i - period], launches[i]
        same += f0 == f1 and len(named0) == len(named1) and all(
            name(a, w + 1) == name(b, w) for a, b in zip(named0, named1))
    return same


def _flops(n: float) -> str:
    for unit, scale in (("PFLOP", 1e15), ("TFLOP", 1e12), ("GFLOP", 1e9), ("MFLOP", 1e6)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n:.0f} FLOP"


def iteration_text(it) -> str:
    if it is None:
        return "none: the kernels do not repeat"
    return (f"{it['launches']:,} launches; {it['keys_repeated_share']:.0%} of them with the launch key they had "
            f"an iteration before (lookahead needs most); {it['order_repeated_share']:.0%} on the same allocations "
            "in the iteration's order")


def stats_text(doc: dict) -> str:
    """`pump trace stats`' table: stats() in human units, the busiest functions last."""
    from pump.protocol import printable  # names come from the traced program: escaped
    from pump.stats import human_bytes
    kinds = ", ".join(f"{k} {n:,}" for k, n in sorted(doc["kinds"].items(), key=lambda kv: -kv[1]) if n)
    processes = f"{doc['processes']} process{'es' if doc['processes'] != 1 else ''}"
    rows = [
        ("job", f"{printable(doc['job'])} ({printable(doc['name'])}), {processes}"),
        ("records", f"{doc['records']:,}" + (f" ({kinds})" if kinds else "")),
        ("launches", f"{doc['launches']:,} of {doc['functions']:,} functions"),
        ("managed peak", human_bytes(doc["managed_bytes_peak"])),
        ("steps", f"{doc['steps']:,}" if doc["steps"] else "none marked"),
        ("FLOPs", _flops(doc["flops"]) if doc["flops"] else "none recorded (a trace from pump-run has none)"),
        ("span", f"{doc['seconds']:.3f} s of its clock"),
        ("ends", cut_text(doc["cut"]) if doc["cut"] else "whole"),
        ("iteration", iteration_text(doc["iteration"])),
    ]
    lines = [f"{name:<14}{value}" for name, value in rows]
    if doc["busiest_functions"]:
        lines += ["", f"{'launches':>14}  function (the busiest)"]
        lines += [f"{f['launches']:>14,}  {printable(f['name'])} [{f['function']}]"
                  for f in doc["busiest_functions"]]
    return "\n".join(lines)
