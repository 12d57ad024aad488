"""pumpd's side of a process's event ring and plan (layouts: pump_channel.h).

pumpd creates both as sealed memfds (no job can shrink or grow them under the
daemon) and passes them to the shim over the socket; after a daemon restart the
shim hands them back and adopt() checks them again before mapping.  The ring is
read in bulk: the span between the daemon's tail and the shim's head is copied
out with numpy, and only the copy is checked (a record counts once its ``seq``
says it is complete) and decoded.  Nothing read from shared memory is trusted:
a job that scribbles over its ring or plan gets wrong answers about itself and
nothing else.

Memory ordering: the copy reads ``seq`` before the rest of each record, which
x86-64's ordering of loads makes sufficient; records are validated after the copy
whatever the machine.
"""

import dataclasses
import fcntl
import mmap
import os
import time

import cffi
import numpy as np

from pump import headers

ffi, C = headers.load("pump_channel.h")
_libc_ffi = cffi.FFI()
_libc_ffi.cdef("int mincore(void *addr, size_t length, unsigned char *vec);")
_libc = _libc_ffi.dlopen(None)
PAGE = mmap.PAGESIZE

RING_HEADER = "struct pump_ring_header"
HEADER_SIZE = ffi.sizeof(RING_HEADER)
RECORD_SIZE = ffi.sizeof("struct pump_event")
PLAN_SIZE = ffi.sizeof("struct pump_plan")
PLAN_SLOTS = C.PUMP_PLAN_SLOTS
PLAN_PROBES = C.PUMP_PLAN_PROBES
PLAN_RANGES = C.PUMP_PLAN_RANGES
DEFAULT_RECORDS = 65536
SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL
# A record reserved but not completed for this long is skipped (its writer died
# or the job scribbled the ring): the reader never stalls on one job's record.
STUCK_SECONDS = 1.0
LAUNCH_BASES_MAX = 256  # shim/channel/channel.c's LAUNCH_BASES_MAX: a wider launch's first ones
NAMES_BASE = 1 << 62  # a tensor named by its place in the step (shim/lookup/names.h) goes by an address from here up
DEVICES_MAX = 64       # DEVICE records name CUDA ordinals 0..63 (shim/channel/channel.c's DEVICES_MAX)
UUID_BYTES = 16        # a DEVICE record's count
PROBLEMS_MAX = 8       # a batch says what was wrong with this many invalid records at most

_NUMPY_TYPES = {"uint64_t": "<u8", "uint32_t": "<u4", "int32_t": "<i4", "uint16_t": "<u2"}


def _dtype(struct_name: str) -> np.dtype:
    """A numpy structured dtype with the C struct's field names, offsets and size."""
    names, formats, offsets = [], [], []
    for name, field in ffi.typeof(struct_name).fields:
        t = field.type
        fmt = (_NUMPY_TYPES[t.item.cname], t.length) if t.kind == "array" else _NUMPY_TYPES[t.cname]
        names.append(name)
        formats.append(fmt)
        offsets.append(field.offset)
    return np.dtype({"names": names, "formats": formats, "offsets": offsets,
                     "itemsize": ffi.sizeof(struct_name)})


EVENT = _dtype("struct pump_event")
TRIGGER = _dtype("struct pump_plan_trigger")
KIND = {name[len("PUMP_EVENT_"):].lower(): getattr(C, name)
        for name in dir(C) if name.startswith("PUMP_EVENT_")}
assert sorted(KIND.values()) == list(range(1, len(KIND) + 1)), "decode() takes the kinds to be 1..N"


class ChannelError(Exception):
    """A ring or plan that cannot be used; str() says why."""


KEY_MULTIPLIER = 0x9E3779B97F4A7C15
_MASK = (1 << 64) - 1


def uuid_from_cuda_bytes(b: bytes) -> str:
    """The NVML spelling of a GPU UUID given as CUDA's 16 raw bytes
    (``cuDeviceGetUuid``): ``"GPU-"`` and the bytes in hex, grouped 8-4-4-4-12."""
    b = bytes(b)
    if len(b) != UUID_BYTES:
        raise ValueError(f"a CUDA UUID is {UUID_BYTES} bytes, got {len(b)}")
    h = b.hex()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def device_record(device: int, count: int, arg) -> str:
    """A DEVICE record's UUID (NVML's spelling); ValueError saying what is wrong
    with one that breaks the format."""
    if not 0 <= device < DEVICES_MAX:
        raise ValueError(f"DEVICE record with CUDA ordinal {device}; ordinals are 0..{DEVICES_MAX - 1}")
    if count != UUID_BYTES:
        raise ValueError(f"DEVICE record for device {device} with count {count}; "
                         f"it carries a {UUID_BYTES}-byte UUID")
    return uuid_from_cuda_bytes(np.asarray(arg[:2], dtype="<u8").tobytes())


def launch_key(function: int, bases) -> int:
    """A launch's key (pump_channel.h): the kernel and the first PUMP_KEY_BASES allocations it is given."""
    h = (function * KEY_MULTIPLIER) & _MASK
    for b in list(bases)[:C.PUMP_KEY_BASES]:
        h = ((h ^ int(b)) * KEY_MULTIPLIER) & _MASK
    h ^= h >> 32
    return h or 1


def launch_keys(batch: "Batch") -> np.ndarray:
    """launch_key() of every launch in a batch, vectorised over launches."""
    n = len(batch.launch_function)
    with np.errstate(over="ignore"):
        k = np.uint64(KEY_MULTIPLIER)
        h = batch.launch_function.astype(np.uint64) * k
        counts = np.diff(np.append(batch.launch_base_start, len(batch.bases))).astype(np.int64)
        for j in range(min(int(counts.max()), C.PUMP_KEY_BASES) if n else 0):
            has = counts > j
            idx = batch.launch_base_start[has] + j
            h[has] = (h[has] ^ batch.bases[idx].astype(np.uint64)) * k
        h ^= h >> np.uint64(32)
    h[h == 0] = 1
    return h


def plan_slot(key: int) -> int:
    """The plan slot a trigger for ``key`` hashes to (pump_channel.h)."""
    return key >> (64 - C.PUMP_PLAN_SLOT_BITS)


def _memfd(name: str, size: int) -> int:
    fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.fchmod(fd, 0o600)
        os.ftruncate(fd, size)
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, SEALS)
    except OSError:
        os.close(fd)
        raise
    return fd


def _map(fd: int, size: int) -> mmap.mmap:
    """A new memfd's mapping; the memfd is closed if it cannot be mapped (out of memory, or
    of descriptors: mmap keeps a duplicate of its own)."""
    try:
        return mmap.mmap(fd, size)
    except BaseException:
        os.close(fd)
        raise


def _check_sealed(fd: int, what: str, size_ok) -> int:
    """The size of a memfd handed back by a job, after checking it cannot change size."""
    try:
        seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
        size = os.fstat(fd).st_size
    except OSError as exc:
        raise ChannelError(f"{what}: not a sealed memfd ({exc.strerror})") from None
    if seals & SEALS != SEALS:
        raise ChannelError(f"{what}: not sealed against resizing (seals 0x{seals:x})")
    if not size_ok(size):
        raise ChannelError(f"{what}: unexpected size {size}")
    return size


def _map_sealed(fd: int, what: str, size_ok) -> mmap.mmap:
    """Map a memfd handed back by a job, after checking it cannot change size; the mapping
    keeps a descriptor of its own, and fd stays the caller's."""
    size = _check_sealed(fd, what, size_ok)
    return mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)


class Ring:
    """The reader of one process's event ring. ``fd`` is the memfd to hand the shim (None
    once handed over, or for an adopted ring).

    pumpd maps only the header page; records are read with pread on a descriptor of its own
    (``reader``). A memfd's page exists once touched, and is charged to the memory cgroup of
    the process that touched it first: read through a mapping, a page the shim never wrote
    (a head set past what it wrote, by a job writing its own ring) would be made by pumpd,
    4 MiB a session in pumpd's cgroup and for as long as the job keeps the memfd. A pread
    of a page never written reads zeros and makes nothing."""

    def __init__(self, fd, reader: int, header_mm: mmap.mmap, capacity: int, tail: int):
        self.fd, self.reader, self.mm, self.capacity = fd, reader, header_mm, capacity
        self.header = ffi.cast(RING_HEADER + " *", ffi.from_buffer(header_mm))
        self.tail = tail      # the daemon's own copy: never read back from the ring
        self.lost = 0         # records skipped as never completed
        self._stuck_since = None

    @classmethod
    def _open(cls, fd, reader_of: int, capacity: int, tail: int) -> "Ring":
        """A Ring on a dup of reader_of (and the header's mapping, which keeps its own); what
        it made is closed if it cannot be made."""
        reader = os.dup(reader_of)
        try:
            header_mm = mmap.mmap(reader, HEADER_SIZE)
        except BaseException:
            os.close(reader)
            raise
        return cls(fd, reader, header_mm, capacity, tail)

    @classmethod
    def create(cls, session: int, job: str, records: int = DEFAULT_RECORDS) -> "Ring":
        if records & (records - 1) or not C.PUMP_RING_RECORDS_MIN <= records <= C.PUMP_RING_RECORDS_MAX:
            raise ValueError(f"ring records {records}: a power of two in "
                             f"{C.PUMP_RING_RECORDS_MIN}..{C.PUMP_RING_RECORDS_MAX}")
        fd = _memfd(f"pump-ring-{session}", HEADER_SIZE + records * RECORD_SIZE)
        try:
            ring = cls._open(fd, fd, records, 0)
        except BaseException:
            os.close(fd)
            raise
        h = ring.header
        h.version, h.record_size, h.capacity, h.session = C.PUMP_PROTOCOL_VERSION, RECORD_SIZE, records, session
        h.job = job.encode()[: len(h.job) - 1]
        h.magic = C.PUMP_RING_MAGIC
        return ring

    @classmethod
    def adopt(cls, fd: int) -> "Ring":
        """A ring a shim hands back on resume: checked, then read from where the shim
        says the last daemon stopped (clamped to what the ring can hold). fd stays the
        caller's to close: the ring keeps descriptors of its own."""
        size = _check_sealed(fd, "ring", lambda size: size > HEADER_SIZE and (size - HEADER_SIZE) % RECORD_SIZE == 0)
        capacity = (size - HEADER_SIZE) // RECORD_SIZE
        ring = cls._open(None, fd, capacity, 0)
        h = ring.header
        problem = None
        if h.magic != C.PUMP_RING_MAGIC or h.version != C.PUMP_PROTOCOL_VERSION:
            problem = f"bad magic or version (0x{h.magic:x}, {h.version})"
        elif h.record_size != RECORD_SIZE or h.capacity != capacity or capacity & (capacity - 1):
            problem = f"bad geometry (record size {h.record_size}, capacity {h.capacity})"
        head, tail = int(h.head), int(h.tail)
        del h  # a view of the mapping, which close() unmaps
        if problem:
            ring.close()
            raise ChannelError(f"ring: {problem}")
        ring.tail = tail if 0 <= head - tail <= capacity else head  # nonsense: start afresh at the shim's head
        return ring

    @property
    def job(self) -> str:
        return ffi.string(self.header.job, len(self.header.job)).decode("ascii", "replace")

    @property
    def written(self) -> int:
        return int(self.header.written)

    @property
    def dropped(self) -> int:
        return int(self.header.dropped)

    def _records(self, position: int, n: int) -> np.ndarray:
        """n records from ring position `position` on, read with pread (see the class)."""
        out = np.empty(n, EVENT)
        raw = out.view(np.uint8)
        start = position % self.capacity
        first = min(n, self.capacity - start)
        got = os.preadv(self.reader, [raw[:first * RECORD_SIZE]], HEADER_SIZE + start * RECORD_SIZE)
        if first < n:
            got += os.preadv(self.reader, [raw[first * RECORD_SIZE:]], HEADER_SIZE)
        if got != raw.nbytes:  # a sealed memfd of the ring's size: cannot happen
            raise ChannelError(f"ring: read {got} of {raw.nbytes} bytes")
        return out

    def read(self, limit: int = 1 << 20) -> np.ndarray:
        """Copy out the complete records from the tail on (at most ``limit``) and
        advance the tail past them; returns a private array of EVENT. A group (a launch
        and the records that extend it) is handed over whole: one its writer is still
        writing waits for the next read."""
        head = int(self.header.head)
        n = min(head - self.tail, self.capacity, limit)
        if n <= 0:
            return np.empty(0, EVENT)
        out = self._records(self.tail, n)
        complete = out["seq"] == np.arange(self.tail + 1, self.tail + n + 1, dtype=np.uint64)
        written = n if complete.all() else int(np.argmin(complete))
        done = self._whole_groups(out, written, head)
        if done == 0:
            done = self._skip_if_stuck(complete, n, written)
            out = out[:done] if written else out[:0]
        else:
            self._stuck_since = None
            out = out[:done]
        self.tail += done
        self.header.tail = self.tail
        return out

    def _whole_groups(self, out: np.ndarray, done: int, head: int) -> int:
        """done, or less where the `done` complete records read end inside a group: a LAUNCH and
        its MORE, EXTENT or COST records, a FUNCTION and its NAME records. decode reads a batch on
        its own, so the group is left whole for the next read. A LAUNCH or FUNCTION says how many
        records it has (_group_length): one whose last records are not read yet waits for them,
        whether they lie past the read's limit or are reserved and not yet written (the shim
        writes a group's records one by one, and a writer preempted there left the end of a
        launch's bases to the next read: seen as a launch's last allocations missing from a CI
        run's trace). Another group ends where the record after it, complete, is no continuation.
        0: the one group read is still being written."""
        after = self.tail + done
        if done == 0 or after >= head:
            return done
        starts = np.flatnonzero(~np.isin(out["kind"][:done], CONTINUATION_KINDS))
        if not len(starts):
            return done  # the rest of a group handed over in part: nothing to keep whole
        last = int(starts[-1])
        length = _group_length(out[last])
        if length is not None:
            return done if last + length <= done else last
        following = out[done] if done < len(out) else self._records(after, 1)[0]
        if int(following["seq"]) != after + 1 or int(following["kind"]) not in CONTINUATION_KINDS:
            return done
        return last if last > 0 else done

    def _skip_if_stuck(self, complete: np.ndarray, n: int, written: int) -> int:
        """0 until the read has been held up for STUCK_SECONDS; then, where a group was begun
        (`written` records of it complete), the part written, the rest to be counted invalid;
        else the records never completed, as lost."""
        now = time.monotonic()
        if self._stuck_since is None:
            self._stuck_since = now
            return 0
        if now - self._stuck_since < STUCK_SECONDS:
            return 0
        self._stuck_since = None
        if written > 0:
            return written
        skip = int(np.argmax(complete)) if complete.any() else n
        self.lost += skip
        return skip

    def hand_over(self) -> int:
        """The memfd, for the shim: the caller owns it from now on."""
        fd, self.fd = self.fd, None
        return fd

    def close(self):
        self.header = None
        self.mm.close()
        os.close(self.reader)
        if self.fd is not None:
            os.close(self.fd)


class Plan:
    """The writer of one process's plan; ``fd`` as Ring's."""

    def __init__(self, fd, mm: mmap.mmap):
        self.fd, self.mm = fd, mm
        self.plan = ffi.cast("struct pump_plan *", ffi.from_buffer(mm))
        self.slots = np.frombuffer(ffi.buffer(self.plan.trigger, PLAN_SLOTS * TRIGGER.itemsize), dtype=TRIGGER)
        self.occupied = None   # the trigger slots written last; None: unknown (every slot is written)
        self.dropped_triggers = 0
        self.unmade_writes = 0  # plans whose triggers were left out: the job had not made the pages

    @classmethod
    def create(cls) -> "Plan":
        fd = _memfd("pump-plan", PLAN_SIZE)
        plan = cls(fd, _map(fd, PLAN_SIZE))
        plan.occupied = np.zeros(0, dtype=np.intp)   # a new memfd reads as zeros
        plan.plan.version = C.PUMP_PLAN_VERSION
        plan.plan.magic = C.PUMP_PLAN_MAGIC
        return plan

    @classmethod
    def adopt(cls, fd: int) -> "Plan":
        """A plan handed back on resume: rewritten from scratch by the next publish(). fd
        stays the caller's, as with Ring.adopt."""
        plan = cls(None, _map_sealed(fd, "plan", lambda size: size == PLAN_SIZE))
        plan.plan.generation &= ~1  # its last writer may have died mid-write
        plan.plan.version = C.PUMP_PLAN_VERSION
        plan.plan.magic = C.PUMP_PLAN_MAGIC
        return plan

    def publish(self, budget_bytes: int, triggers: dict, order: int = C.PUMP_ORDER_MIGRATED):
        """Write a whole plan: the budget (0: none), the victim order between planned
        evictions, and per launch key a triple (need, prefetch, evict) of lists of
        (address, bytes) ranges (pump_channel.h says what the shim does with each).
        Triggers that do not fit (no free slot within PLAN_PROBES of their hash, more
        than 65535 ranges of one kind, or no room left in the range table) are left out
        and counted in ``dropped_triggers``."""
        self.write(budget_bytes, order, Plan.layout(triggers))

    @staticmethod
    def layout(triggers: dict) -> tuple:
        """((the trigger slots used, their triggers), range table, triggers left out): what
        write() copies into the plan; pure, so pumpd's planner makes it off the event loop.
        Only the slots used: the whole trigger table is 384 KiB, which each lookahead process's
        layout held, in pumpd and in its planner (163 KiB a process measured in pumpd)."""
        taken = {}
        ranges = []
        dropped = 0
        for key, lists in triggers.items():
            wanted = sum(len(part) for part in lists)
            if not key or not wanted:
                continue
            if len(ranges) + wanted > PLAN_RANGES or max(len(part) for part in lists) > 0xFFFF:
                dropped += 1
                continue
            home = plan_slot(key)
            for probe in range(PLAN_PROBES):
                slot = (home + probe) % PLAN_SLOTS
                if slot not in taken:
                    taken[slot] = (key, len(ranges), *(len(part) for part in lists), 0, 0)
                    for part in lists:
                        ranges.extend(part)
                    break
            else:
                dropped += 1
        used = np.array(sorted(taken), dtype=np.intp)
        entries = np.array([taken[slot] for slot in used.tolist()], dtype=TRIGGER)
        return (used, entries), np.asarray(ranges, dtype="<u8").reshape(-1, 2), dropped

    def pages_made(self) -> bool:
        """Whether every page past the header's exists. The shim makes them when it maps the plan
        (shim/channel/channel_worker.c), so that they count against the job's memory cgroup: a
        memfd's page is charged to whoever touches it first, and pumpd's writes would else make
        1.4 MiB a lookahead process in pumpd's. A page swapped out reads as not made: that plan
        waits for the next. (A job that punches holes in its plan's memfd between this check and
        the write can still have pumpd make them, at most the plan's size: docs/daemon-limits.md.)"""
        start = int(ffi.cast("uintptr_t", self.plan)) + PAGE
        vec = _libc_ffi.new("unsigned char[]", -(-(PLAN_SIZE - PAGE) // PAGE))  # one a page, rounded up
        if _libc.mincore(_libc_ffi.cast("void *", start), PLAN_SIZE - PAGE, vec) != 0:
            return False
        return bool(np.all(np.frombuffer(_libc_ffi.buffer(vec), np.uint8) & 1))

    def write(self, budget_bytes: int, order: int, layout: tuple) -> bool:
        """Copy a layout() into the plan (a seqlock write: the shim ignores it meanwhile). False
        where its triggers were left out, the job not having made the plan's pages
        (pages_made): the budget and order are written all the same (the header's page is
        pumpd's own, made at create)."""
        (used, entries), table, dropped = layout
        made = (not len(used) and not len(table)) or self.pages_made()
        if not made:
            self.unmade_writes += 1
            dropped += len(used)
            used, entries, table = used[:0], entries[:0], table[:0]
        self.dropped_triggers += dropped
        p = self.plan
        p.generation = (p.generation | 1)  # odd: the shim ignores the plan meanwhile
        p.budget_bytes = budget_bytes
        p.order = order
        # Only the slots in use, and those that were (writing the whole table cost a copy of it).
        if self.occupied is None:
            self.slots[:] = 0
        else:
            self.slots[np.setdiff1d(self.occupied, used, assume_unique=True)] = 0
        self.slots[used] = entries
        self.occupied = used
        ffi.memmove(p.range, table.tobytes(), table.nbytes)
        p.trigger_count = len(used)
        p.range_count = len(table)
        p.generation = p.generation + 1
        return made

    hand_over = Ring.hand_over

    def close(self):
        self.plan = self.slots = None
        self.mm.close()
        if self.fd is not None:
            os.close(self.fd)


def _group_length(record) -> int:
    """The records of the group a LAUNCH or FUNCTION record begins, as its count says (a LAUNCH
    holds 3 bases and each LAUNCH_MORE 5; a FUNCTION 32 bytes of the name and each NAME 40:
    shim/channel/channel.c); None for another kind, whose group's length no record says."""
    kind, count = int(record["kind"]), int(record["count"])
    if kind == KIND["launch"]:
        return 1 + (max(0, count - 3) + 4) // 5
    if kind == KIND["function"]:
        return 1 + (max(0, count - 32) + 39) // 40
    return None


@dataclasses.dataclass
class Batch:
    """What one read of a ring says, decoded and checked."""
    records: int = 0
    invalid: int = 0                      # records that broke the format (dropped)
    launch_function: np.ndarray = None    # per launch, in order
    launch_time: np.ndarray = None        # per launch: the launch call's CLOCK_MONOTONIC ns, less its
                                          # thread's time in pump's own driver calls so far
    launch_record: np.ndarray = None      # per launch: its LAUNCH record's index in the records read
    launch_base_start: np.ndarray = None  # per launch: its first entry in `bases`
    bases: np.ndarray = None              # allocation bases, launch after launch
    allocs: list = dataclasses.field(default_factory=list)   # (base, size)
    frees: list = dataclasses.field(default_factory=list)    # (base, size): left freed by this read (a free
                                                              # the read allocates again is not one)
    functions: dict = dataclasses.field(default_factory=dict)  # function -> its latest name in this read
    named: list = dataclasses.field(default_factory=list)     # (launches before it, function, name) per FUNCTION
                                                              # record: a handle the driver reused after an unload
                                                              # is named again, maybe in the same read
    syncs: int = 0
    counters: tuple = None                # the last COUNTERS record's five values
    # From generated traces (and framework integration): per launch, the exact
    # (address, bytes, written) ranges it touches and its (flops, bytes, ns) cost.
    extents: dict = dataclasses.field(default_factory=dict)   # launch index -> [(addr, bytes, written)]
    costs: dict = dataclasses.field(default_factory=dict)     # launch index -> (flops, bytes, ns)
    block_allocs: list = dataclasses.field(default_factory=list)  # (launches before it, addr, bytes)
    block_frees: list = dataclasses.field(default_factory=list)   # (launches before it, addr, bytes)
    steps: list = dataclasses.field(default_factory=list)     # (launches before it, step)
    devices: list = dataclasses.field(default_factory=list)   # (CUDA ordinal, GPU UUID "GPU-...")
    budgets: list = dataclasses.field(default_factory=list)   # (CUDA ordinal, pump's own budget there, bytes)
    links: list = dataclasses.field(default_factory=list)     # (CUDA ordinal, bytes, ns): a prefetch the GPU timed
    kernels: list = dataclasses.field(default_factory=list)   # (CUDA ordinal, launch key, ns): a kernel the GPU timed
    problems: list = dataclasses.field(default_factory=list)  # what was wrong with the first invalid DEVICE records

    def launch_bases(self, i: int) -> np.ndarray:
        end = self.launch_base_start[i + 1] if i + 1 < len(self.launch_base_start) else len(self.bases)
        return self.bases[self.launch_base_start[i]:end]


# Records that extend the one before them: a read never ends just before one of them.
CONTINUATION_KINDS = np.array([KIND["launch_more"], KIND["extent"], KIND["cost"], KIND["name"]])


def _timed_problem(link: bool, device: int, count: int, what: int, ns: int) -> str:
    """What is wrong with a LINK (what: bytes) or KERNEL (what: launch key) record."""
    if link:
        return (f"LINK record for device {device} with count {count}, {what} bytes in {ns} ns; allowed: ordinals "
                f"0..{DEVICES_MAX - 1}, count 2, bytes and ns in 1..2^48-1")
    return (f"KERNEL record for device {device} with count {count}, key {what:#x}, {ns} ns; allowed: ordinals "
            f"0..{DEVICES_MAX - 1}, count 2, a key other than 0, ns in 1..2^48-1")


def decode(records: np.ndarray) -> Batch:
    """Decode a copy of ring records (Ring.read()) into a Batch, vectorised where
    records are many (launches) and record by record where they are rare."""
    kind = records["kind"]
    count = records["count"].astype(np.int64)
    arg = records["arg"]
    batch = Batch(records=len(records))

    is_launch = kind == KIND["launch"]
    is_more = kind == KIND["launch_more"]
    bad_launch = is_launch & (count > LAUNCH_BASES_MAX)
    owner = np.cumsum(is_launch & ~bad_launch) - 1          # the launch a MORE record extends
    prev_kind = np.concatenate(([0], kind[:-1]))
    follows_launch = (prev_kind == KIND["launch"]) | (prev_kind == KIND["launch_more"])
    orphan_more = is_more & ((owner < 0) | ~follows_launch | (count > 5))
    launches = np.flatnonzero(is_launch & ~bad_launch)
    batch.launch_function = arg[launches, 0].copy()
    batch.launch_time = records["time_ns"][launches].copy()
    batch.launch_record = launches

    # Bases: up to 3 in the LAUNCH record (arg2..4), up to 5 in each MORE record.
    inline = np.minimum(count[launches], 3)
    cols = np.arange(3)
    take = cols[None, :] < inline[:, None]
    launch_of = np.repeat(np.arange(len(launches)), inline)
    base_list = [arg[launches, 2:5][take]]
    owner_list = [launch_of]
    more = np.flatnonzero(is_more & ~orphan_more)
    if len(more):
        take_more = np.arange(5)[None, :] < count[more][:, None]
        base_list.append(arg[more, :][take_more])
        owner_list.append(np.repeat(owner[more], count[more]))
    owners = np.concatenate(owner_list)
    order = np.argsort(owners, kind="stable")
    batch.bases = np.concatenate(base_list)[order]
    batch.launch_base_start = np.searchsorted(owners[order], np.arange(len(launches)))

    known = (kind >= min(KIND.values())) & (kind <= max(KIND.values()))  # the kinds are 1..N
    batch.invalid = int(np.count_nonzero(~known | bad_launch | orphan_more))
    is_sync = kind == KIND["sync"]
    batch.syncs = int(np.count_nonzero(is_sync))

    rare = np.flatnonzero(known & ~(is_launch | is_more | is_sync))
    launches_before = np.cumsum(is_launch & ~bad_launch)  # at record i, launches up to and including it
    name_of, name_left = None, 0
    freed_at = []  # per FREE record: how many ALLOC records came before it
    for i in rare.tolist():
        k, n, a = int(kind[i]), int(count[i]), arg[i]
        if k in (KIND["extent"], KIND["cost"]):
            prev = int(kind[i - 1]) if i else 0
            if owner[i] < 0 or prev not in (KIND["launch"], KIND["launch_more"], KIND["extent"]) or \
                    (k == KIND["extent"] and not 1 <= n <= 2):
                batch.invalid += 1
                continue
            if k == KIND["cost"]:
                batch.costs[int(owner[i])] = (int(a[0]), int(a[1]), int(a[2]))
            else:
                batch.extents.setdefault(int(owner[i]), []).extend(
                    (int(a[2 * j]), int(a[2 * j + 1]), bool(int(a[4]) >> j & 1)) for j in range(n))
            continue
        if k in (KIND["block_alloc"], KIND["block_free"], KIND["step"]):
            at = int(launches_before[i])
            if k == KIND["step"]:
                batch.steps.append((at, int(a[0])))
            else:
                (batch.block_allocs if k == KIND["block_alloc"] else batch.block_frees).append(
                    (at, int(a[0]), int(a[1])))
            continue
        if k == KIND["name"]:
            if name_of is None or n > 40 or n > name_left:
                batch.invalid += 1
                continue
            batch.named[-1][2] += a.tobytes()[:n]
            name_left -= n
            continue
        name_of = None
        if k == KIND["alloc"]:
            batch.allocs.append((int(a[0]), int(a[1])))
        elif k == KIND["free"]:
            batch.frees.append((int(a[0]), int(a[1])))
            freed_at.append(len(batch.allocs))
            if int(a[0]) >= NAMES_BASE:  # a named tensor died: its contents too, as a BLOCK_FREE says
                batch.block_frees.append((int(launches_before[i]), int(a[0]), int(a[1])))
        elif k == KIND["counters"]:
            batch.counters = tuple(int(v) for v in a)
        elif k == KIND["device"]:
            device = int(records["device"][i])
            try:
                batch.devices.append((device, device_record(device, n, a)))
            except ValueError as exc:
                batch.invalid += 1
                if len(batch.problems) < PROBLEMS_MAX:
                    batch.problems.append(str(exc))
        elif k == KIND["budget"]:
            device = int(records["device"][i])
            if not 0 <= device < DEVICES_MAX or n != 1 or int(a[0]) == 0:
                batch.invalid += 1
                if len(batch.problems) < PROBLEMS_MAX:
                    batch.problems.append(f"BUDGET record for device {device} with count {n} and {int(a[0])} "
                                          f"bytes; allowed: ordinals 0..{DEVICES_MAX - 1}, count 1, bytes > 0")
                continue
            batch.budgets.append((device, int(a[0])))
        elif k in (KIND["link"], KIND["kernel"]):  # a sample the GPU timed: (what, ns)
            device, what, ns = int(records["device"][i]), int(a[0]), int(a[1])
            link = k == KIND["link"]
            if not 0 <= device < DEVICES_MAX or n != 2 or not (0 < what < 1 << 48 if link else what != 0) \
                    or not 0 < ns < 1 << 48:
                batch.invalid += 1
                if len(batch.problems) < PROBLEMS_MAX:
                    batch.problems.append(_timed_problem(link, device, n, what, ns))
                continue
            (batch.links if link else batch.kernels).append((device, what, ns))
        elif k == KIND["function"]:
            if n > C.PUMP_FUNCTION_NAME_MAX:
                batch.invalid += 1
                continue
            name_of, name_left = int(a[0]), max(0, n - 32)
            batch.named.append([int(launches_before[i]), name_of, a[1:].tobytes()[: min(n, 32)]])
    batch.named = [(at, f, name.decode("utf-8", "replace")) for at, f, name in batch.named]
    batch.functions = {f: name for _, f, name in batch.named}
    # Readers add a batch's allocations, then take its frees away: a free followed in the same
    # read by an allocation at its base (a caching allocator handing the memory out again)
    # would take the new one away too. It is left out; the allocation replaces the freed one.
    last_alloc = {base: i for i, (base, _size) in enumerate(batch.allocs)}
    batch.frees = [free for free, before in zip(batch.frees, freed_at) if last_alloc.get(free[0], -1) < before]
    return batch
