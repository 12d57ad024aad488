"""A trace turned into what the simulator replays: per launch its key, the 2 MiB blocks of the
allocations its arguments point into (what the shim knows), the 64 KiB pages it really touches
(EXTENT records, else its whole allocations), its cost and kind of operator, and the allocator
events between launches.  Built once per trace and shared by every policy and capacity.

A kernel's time on a GPU preset, the one place the simulator gets it:
- kernel_seconds(flops, traffic, kind, gpu): the model, a roofline at the achieved fractions of
  peak measured for that kind of operator (constants.ACHIEVED);
- Workload.kernel_seconds(gpu): per launch, the first of: Workload.override_seconds (a table of
  measured times, NaN where a launch has none: what a profile of the model supplies), the
  trace's own measured time (COST records of pump-run on a GPU), the model."""

import bisect
import dataclasses
import functools
import gc

import numpy as np

from pump import channel, trace
from pump.iteration import IterationDetector
from pump.simulate import constants as K
from pump.simulate import segments as S

KIND = channel.KIND
BLOCK_SHIFT = K.BLOCK_BYTES.bit_length() - 1


class WorkloadError(Exception):
    """A trace the simulator cannot replay; str() says why."""


@dataclasses.dataclass
class Workload:
    path: str
    name: str
    keys: np.ndarray                  # per launch: its key (channel.launch_key)
    arg_blocks: list                  # per launch: block ids of its allocations, argument order
    touched: list                     # per launch: ((block id, page mask), ...)
    touch_order: list                 # per launch: its ranges in the order its kernel touches them
                                      # (touch_ranges), each ((block id, page mask), ...) in address order
    flops: np.ndarray                 # per launch (0 where the trace has no COST)
    traffic: np.ndarray               # per launch: bytes of device-memory traffic
    kind: np.ndarray                  # per launch: its kind of operator (op_kind; constants.ACHIEVED)
    measured_ns: np.ndarray           # per launch: measured kernel time (0: unknown)
    block_address: np.ndarray         # per block id
    block_bytes: np.ndarray           # per block id (an allocation's last block may be partial)
    block_pages: list                 # per block id: mask of its pages
    events: dict                      # launch index -> [(kind, ...)] happening before it
    steps: list                       # launch index at which each step begins
    batches: list                     # (first launch, channel.Batch) as pumpd would read them
    peak_footprint: int               # most managed bytes allocated at once
    learned_at: int                   # launch at which the iteration is first learned (or None)
    period: int
    override_seconds: np.ndarray = None   # per launch: a measured time to use instead (NaN: none)
    written: list = None              # per launch: ((block id, page mask), ...) of its written extents
    segments: int = 0                 # caching-allocator segments kept whole (segments.py)

    @property
    def launches(self) -> int:
        return len(self.keys)

    @functools.cached_property
    def block_of(self) -> dict:
        """2 MiB block number (address >> 21) -> block id."""
        return {int(a) >> BLOCK_SHIFT: b for b, a in enumerate(self.block_address.tolist())}

    @functools.cached_property
    def block_arrays(self) -> tuple:
        """Per launch, the blocks of its arg_blocks and of its touched pages as arrays (a
        launch's hundreds of blocks are ranked, timed and waited for at once in a run)."""
        return ([np.asarray(a, np.int64) for a in self.arg_blocks],
                [np.asarray([b for b, _mask in t], np.int64) for t in self.touched])

    def page_masks(self, addr: int, size: int, inward: bool = False) -> list:
        """[(block id, page mask)] over a byte range: the pages wholly inside it (inward) or
        touching it.  Kept: the allocator frees the same ranges every step, in every run."""
        known = self.__dict__.setdefault("_page_masks", {})
        out = known.get((addr, size, inward))
        if out is not None:
            return out
        lo = -(-addr // K.PAGE_BYTES) if inward else addr // K.PAGE_BYTES
        hi = (addr + size) // K.PAGE_BYTES if inward else -(-(addr + size) // K.PAGE_BYTES)
        out = known[addr, size, inward] = []
        while lo < hi:
            top = min(hi, (lo // K.PAGES_PER_BLOCK + 1) * K.PAGES_PER_BLOCK)
            b = self.block_of.get(lo // K.PAGES_PER_BLOCK)
            if b is not None:
                out.append((b, ((1 << (top - lo)) - 1) << (lo % K.PAGES_PER_BLOCK)))
            lo = top
        return out

    def kernel_seconds(self, gpu) -> np.ndarray:
        """Per launch on `gpu` (a constants.GpuPreset): an override where given, else the
        trace's measured time, else kernel_seconds() of its cost."""
        model = kernel_seconds(self.flops, self.traffic, self.kind, gpu)
        seconds = np.where(self.measured_ns > 0, self.measured_ns * 1e-9, model)
        if self.override_seconds is not None:
            seconds = np.where(np.isnan(self.override_seconds), seconds, self.override_seconds)
        return seconds

    def write_kernel_times(self, out, gpu):
        """kernel_seconds(gpu) as bench/replay_trace --kernel-times reads them (a little-endian
        uint64 of ns per launch): the replay's kernels take the model's times, so that what the
        GPU times for pumpd is what the model's planner is given."""
        np.asarray(np.round(self.kernel_seconds(gpu) * 1e9), "<u8").tofile(out)
        return out


# The kinds of operator, by the aten name a generated trace gives each launch (the first that
# matches); a name none matches is elementwise: memory-bound, its bytes at the achieved rate.
OP_KINDS = (
    ("conv", ("aten.convolution", "aten.cudnn_convolution", "aten._convolution")),
    ("matmul", ("aten.mm", "aten.addmm", "aten.bmm", "aten.baddbmm", "aten.addbmm", "aten.matmul",
                "aten.linear", "aten._scaled_dot_product")),
    ("normalization", ("aten.native_batch_norm", "aten.native_layer_norm", "aten.native_group_norm",
                       "aten._softmax", "aten._log_softmax", "aten.sum", "aten.mean", "aten.nll_loss",
                       "aten.var", "aten.norm", "aten.amax", "aten.max.", "aten.cudnn_batch_norm")),
)
KINDS = tuple(k for k, _ in OP_KINDS) + ("elementwise",)


def op_kind(name: str) -> str:
    """The kind of operator a kernel named `name` (an aten op, e.g. aten.mm.default) is."""
    for kind, prefixes in OP_KINDS:
        if name.startswith(prefixes):
            return kind
    return "elementwise"


def kernel_seconds(flops, traffic, kind, gpu):
    """A kernel's time on `gpu` (constants.GpuPreset) from its cost (scalars or per-launch
    arrays): the larger of its FLOPs at the kind's compute peak and its bytes at the memory
    bandwidth, each at the fraction of peak measured for that kind (constants.ACHIEVED).
    Where fp32 work runs (constants.py, [TF32]): convolutions on TF32 tensor cores where the
    GPU has them, everything else on the FP32 units."""
    kind = np.asarray(kind)
    peak = np.where(kind == "conv", gpu.conv_flops(), gpu.fp32_flops)
    compute = np.zeros(kind.shape)
    memory = np.zeros(kind.shape)
    for k in KINDS:
        compute = np.where(kind == k, K.ACHIEVED[k].compute, compute)
        memory = np.where(kind == k, K.ACHIEVED[k].memory, memory)
    return np.maximum(np.asarray(flops) / (peak * compute), np.asarray(traffic) / (gpu.memory_bytes_per_s * memory))


def touch_ranges(bases, extents, home, size_of):
    """The (start, end) ranges a launch's kernel touches, in bench/replay_trace.c's order (the
    order a replay on fakecuda faults them in): per base of the launch, its extents (those in
    the base's allocation, each once), else without any extents its whole allocation; each
    base's first range first, then the others, then extents outside the launch's bases.
    home(addr): the allocation holding addr, or None; size_of(base): its size."""
    clipped = []
    for addr, size, _writes in extents:
        h = home(addr)
        if h is not None and size > 0:
            clipped.append((h, addr, min(addr + size, h + size_of(h))))
    firsts, rest, used = [], [], [False] * len(clipped)
    for base in bases:
        h = home(base)
        if h is None:
            continue
        found = False
        for e, (eh, start, end) in enumerate(clipped):
            if not used[e] and eh == h:
                used[e] = True
                (rest if found else firsts).append((start, end))
                found = True
        if not found and not extents:
            firsts.append((h, h + size_of(h)))
    return firsts + rest + [(start, end) for e, (_h, start, end) in enumerate(clipped) if not used[e]]


def _profile_hint(path) -> str:
    """What to do with a file that is a profile (gzip, JSON or SQLite) given where a trace goes."""
    try:
        with open(path, "rb") as f:
            start = f.read(16)
    except OSError:
        return ""
    if start[:2] == b"\x1f\x8b" or start.lstrip()[:1] == b"{" or start.startswith(b"SQLite format 3"):
        return (": it looks like a profile (PyTorch profiler JSON or an Nsight Systems export); a profile "
                "gives kernel times to a trace: pump simulate TRACE --profile FILE, with TRACE from "
                "pump-run --trace or pump trace generate")
    return ""


def _records_of_busiest_process(path):
    try:
        header, blocks = trace.read(path)
    except trace.TraceError as exc:
        raise WorkloadError(str(exc) + _profile_hint(path)) from None
    by_pid = {}
    for pid, records in blocks:
        by_pid.setdefault(pid, []).append(records)
    if not by_pid:
        raise WorkloadError(f"{path}: the trace holds no records")
    merged = {pid: np.concatenate(parts) for pid, parts in by_pid.items()}
    pid = max(merged, key=lambda p: int(np.count_nonzero(merged[p]["kind"] == KIND["launch"])))
    return header, merged[pid]


def _split(records, launches_per_batch, at_steps):
    """Cut records into batches as pumpd reads them: at each STEP record (at_steps, where the
    trace has them), else every launches_per_batch launches, at a LAUNCH record."""
    steps = np.flatnonzero(records["kind"] == KIND["step"])
    if at_steps and len(steps):
        return np.split(records, steps)
    starts = np.flatnonzero(records["kind"] == KIND["launch"])
    cuts = starts[launches_per_batch::launches_per_batch]
    return np.split(records, cuts)


def collector_paused(make):
    """`make` with the garbage collector off: it makes millions of tuples that live as long as
    the workload (or a run), which the collector would walk again and again, freeing none."""
    @functools.wraps(make)
    def paused(*args, **kwargs):
        was_on = gc.isenabled()
        gc.disable()
        try:
            return make(*args, **kwargs)
        finally:
            if was_on:
                gc.enable()
    return paused


@collector_paused
def load(path, batch_launches: int = K.DAEMON_READ_LAUNCHES, daemon_reads_steps: bool = False,
         segments: bool = True) -> Workload:
    """daemon_reads_steps: pumpd reads each step whole (a replay that pauses between steps),
    rather than every batch_launches launches.  segments: a caching allocator's segments the
    trace shows carved stay whole, a dead tensor's memory in them (segments.py); else each
    tensor's memory is freed when it dies (replay_trace --no-segments)."""
    header, records = _records_of_busiest_process(path)
    tags, kept = S.classify(records) if segments else (None, [])
    page_shift = K.PAGE_BYTES.bit_length() - 1
    ppb = K.PAGES_PER_BLOCK

    block_id, block_address, block_bytes, block_pages = {}, [], [], []

    made = {}   # (base, size) -> its block ids: a launch names its allocations again and again

    def blocks_of(base, size):
        known = made.get((base, size))
        if known is not None:   # what it did the first time changes nothing the second
            return known
        ids = made[base, size] = []
        for addr in range(base, base + size, K.BLOCK_BYTES):
            nbytes = min(K.BLOCK_BYTES, base + size - addr)
            b = block_id.get(addr >> BLOCK_SHIFT)
            if b is None:
                b = block_id[addr >> BLOCK_SHIFT] = len(block_address)
                block_address.append(addr)
                block_bytes.append(nbytes)
                block_pages.append(0)
            block_bytes[b] = max(block_bytes[b], nbytes)
            pages = -(-nbytes // K.PAGE_BYTES)
            block_pages[b] |= (1 << pages) - 1
            ids.append(b)
        return ids

    allocations, sorted_bases = {}, []

    def home(addr):
        """The live allocation holding addr, or None."""
        j = bisect.bisect_right(sorted_bases, addr) - 1
        if j < 0 or addr >= sorted_bases[j] + allocations[sorted_bases[j]]:
            return None
        return sorted_bases[j]

    cut = {}   # (start, end) -> spans(start, end): each step's kernels touch the same ranges

    def spans(start, end):
        """((block id, page mask), ...) of the pages of [start, end), block by block."""
        known = cut.get((start, end))
        if known is not None:
            return known
        out, p, last = [], start >> page_shift, (end - 1) >> page_shift
        while p <= last:
            hi = min(last, (p // ppb + 1) * ppb - 1)
            out.append((block_id[p // ppb], ((1 << (hi - p + 1)) - 1) << (p % ppb)))
            p = hi + 1
        cut[start, end] = out = tuple(out)
        return out

    def takes(bases, extents):
        """(its allocations' blocks, the pages it touches, in touch order, those it writes) of
        a launch given `bases` and `extents`, with the allocations as they are now."""
        args = []
        for base in bases:
            if base in allocations:
                args.extend(blocks_of(base, allocations[base]))
        args = tuple(dict.fromkeys(args))
        masks, wmasks = {}, {}
        for addr, size, writes in extents:
            h = home(addr)
            if h is None or size <= 0:
                continue
            for blk, bits in spans(addr, min(addr + size, h + allocations[h])):
                masks[blk] = masks.get(blk, 0) | bits
                if writes:
                    wmasks[blk] = wmasks.get(blk, 0) | bits
        if not extents:
            for b in args:
                masks[b] = block_pages[b]
        order = tuple(spans(start, end) for start, end in touch_ranges(bases, extents, home, allocations.get))
        return args, tuple(masks.items()), order, tuple(wmasks.items())   # none known written without extents

    # A step's launches take what the step before's took, once the allocations stay: each
    # (allocations' version, bases, extents) is worked out once.
    version, taken = 0, {}
    live = peak = 0
    keys, arg_blocks, touched, touch_order, written = [], [], [], [], []
    flops, traffic, measured, kinds = [], [], [], []
    names = {}
    events, steps, batches = {}, [], []
    first = offset = 0
    for part in _split(records, batch_launches, daemon_reads_steps):
        batch = channel.decode(part)
        n = len(batch.launch_function)
        batches.append((first, batch))
        kind = part["kind"]
        valid_launch = (kind == KIND["launch"]) & (part["count"] <= channel.LAUNCH_BASES_MAX)
        before = np.cumsum(valid_launch) - valid_launch      # launches of this part before record i
        tag = None if tags is None else tags[offset:offset + len(part)]
        offset += len(part)
        for i in np.flatnonzero((kind == KIND["alloc"]) | (kind == KIND["free"])).tolist():
            base, size = int(part["arg"][i, 0]), int(part["arg"][i, 1])
            if tag is None:
                what = "alloc" if kind[i] == KIND["alloc"] else "free"
            else:
                what = S.EVENT_OF[int(kind[i]), int(tag[i])]
            events.setdefault(first + int(before[i]), []).append((what, base, size))
        for at, addr, size in batch.block_allocs:
            events.setdefault(first + at, []).append(("block_alloc", addr, size))
        for at, addr, size in batch.block_frees:
            events.setdefault(first + at, []).append(("block_free", addr, size))
        steps.extend(first + at for at, _ in batch.steps)
        keys.append(channel.launch_keys(batch))
        names.update(batch.functions)
        kinds.extend(op_kind(names.get(f, "")) for f in batch.launch_function.tolist())
        for i in range(n):
            g = first + i
            dead = []
            for j, (what, base, size) in enumerate(events.get(g, ())):
                if what in ("alloc", "tensor_alloc"):   # a tensor's bytes are its segment's
                    if base not in allocations:
                        bisect.insort(sorted_bases, base)
                    if what == "alloc":
                        live += size - allocations.get(base, 0)
                    allocations[base] = size
                    peak = max(peak, live)
                    blocks_of(base, size)
                    version += 1
                elif what in ("free", "carve", "tensor_free") and base in allocations:
                    held = allocations.pop(base)
                    sorted_bases.remove(base)
                    version += 1
                    if what == "free":
                        live -= held
                    elif what == "tensor_free":
                        dead.append((j + 1, S.dead_blocks(base, held, allocations, sorted_bases)))
            for j, blocks in reversed(dead):   # each right after its tensor_free
                if blocks is not None:
                    events[g].insert(j, ("dead",) + blocks)
            bases, extents = tuple(batch.launch_bases(i).tolist()), tuple(batch.extents.get(i) or ())
            known = taken.get((version, bases, extents))
            if known is None:
                known = taken[version, bases, extents] = takes(bases, extents)
            for out, part in zip((arg_blocks, touched, touch_order, written), known):
                out.append(part)
            cost = batch.costs.get(i, (0, 0, 0))
            flops.append(cost[0])
            traffic.append(cost[1])
            measured.append(cost[2])
        # Events after the last launch of this part belong before the next part's first.
        first += n
    if not arg_blocks:
        raise WorkloadError(f"{path}: the trace holds no launches")
    keys = np.concatenate(keys)
    detector = IterationDetector()
    learned_at, period = None, 0
    for start, batch in batches:
        detector.extend(keys[start:start + len(batch.launch_function)])
        period = detector.detect()
        if period:
            learned_at = detector.seen
            break
    return Workload(
        path=path, name=header["name"] or header["job"], keys=keys, arg_blocks=arg_blocks, touched=touched,
        touch_order=touch_order,
        flops=np.asarray(flops, float), traffic=np.asarray(traffic, float),
        kind=np.asarray(kinds), measured_ns=np.asarray(measured, float), block_address=np.asarray(block_address, np.uint64),
        block_bytes=np.asarray(block_bytes, np.int64), block_pages=block_pages, events=events,
        steps=sorted(set(steps)), batches=batches, peak_footprint=peak, learned_at=learned_at, period=period,
        written=written, segments=len(kept))
