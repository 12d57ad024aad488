"""The shim's side of the channels to pumpd, against a tiny daemon written here:
a thread on a Unix socket that answers attach with a sealed ring and plan
(memfds it creates) and records every request. The records are parsed with
a cffi view of shim/base/pump_channel.h, kept local to this file."""

import fcntl
import json
import mmap
import os
import pathlib
import random
import shutil
import socket
import struct
import subprocess
import tempfile
import threading
import time

import cffi
import numpy as np
import pytest

from helpers import clean_env, make_plan_pages
from pump import channel, runtime_dir, stats

ROOT = pathlib.Path(__file__).resolve().parent.parent
MiB = 1 << 20


def _channel_ffi():
    text = (ROOT / "shim" / "base" / "pump_channel.h").read_text()
    ffi = cffi.FFI()
    ffi.cdef("\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#")))
    return ffi, ffi.dlopen(None)


FFI, C = _channel_ffi()
RING_HEADER = FFI.sizeof("struct pump_ring_header")
RECORD = FFI.sizeof("struct pump_event")
PLAN_SIZE = FFI.sizeof("struct pump_plan")
SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL
KINDS = {C.PUMP_EVENT_ALLOC: "ALLOC", C.PUMP_EVENT_FREE: "FREE", C.PUMP_EVENT_LAUNCH: "LAUNCH",
         C.PUMP_EVENT_LAUNCH_MORE: "LAUNCH_MORE", C.PUMP_EVENT_FUNCTION: "FUNCTION",
         C.PUMP_EVENT_NAME: "NAME", C.PUMP_EVENT_SYNC: "SYNC", C.PUMP_EVENT_COUNTERS: "COUNTERS",
         C.PUMP_EVENT_DEVICE: "DEVICE", C.PUMP_EVENT_BUDGET: "BUDGET", C.PUMP_EVENT_LINK: "LINK",
         C.PUMP_EVENT_KERNEL: "KERNEL"}


def sealed_memfd(name, size, init=None, seals=SEALS):
    fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, size)
    mm = mmap.mmap(fd, size)
    if init is not None:
        init(mm)
    if seals:
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals)
    return fd, mm


class Ring:
    """The event ring as pumpd makes it; reads records back, optionally consuming."""

    def __init__(self, capacity=65536, job="job-1", session=7, seals=SEALS, **header):
        def init(mm):
            h = FFI.from_buffer("struct pump_ring_header *", mm)
            h.magic, h.version, h.record_size = C.PUMP_RING_MAGIC, C.PUMP_PROTOCOL_VERSION, RECORD
            h.capacity, h.session, h.job = capacity, session, job.encode()
            for key, value in header.items():
                setattr(h, key, value)

        self.capacity = capacity
        self.fd, self.mm = sealed_memfd("pump-ring", RING_HEADER + capacity * RECORD, init, seals)
        self.header = FFI.from_buffer("struct pump_ring_header *", self.mm)
        self.records = FFI.cast("struct pump_event *", FFI.from_buffer("char[]", self.mm) + RING_HEADER)
        self.seen = []           # records consumed by read()
        self.errors = []

    def read(self, wait=1.0):
        """Every complete record from tail to head (waiting up to `wait` s for
        reserved ones), checking seq; advances tail."""
        tail, head = self.header.tail, self.header.head
        deadline = time.monotonic() + wait
        while tail < head:
            r = self.records[tail % self.capacity]
            if r.seq != tail + 1:
                if time.monotonic() > deadline:
                    self.errors.append(f"record {tail}: seq {r.seq}")
                    break
                time.sleep(0.0005)
                continue
            self.seen.append({"seq": r.seq, "kind": KINDS.get(r.kind, r.kind), "count": r.count,
                              "device": r.device, "time_ns": r.time_ns, "arg": list(r.arg)})
            tail += 1
            self.header.tail = tail
        return self.seen


class Plan:
    def __init__(self, budget=0, garbage=False, seals=SEALS):
        def init(mm):
            if garbage:
                mm[:] = random.Random(5).randbytes(PLAN_SIZE)
            p = FFI.from_buffer("struct pump_plan *", mm)
            p.magic, p.version, p.budget_bytes = C.PUMP_PLAN_MAGIC, C.PUMP_PLAN_VERSION, budget
            if garbage:
                p.generation = 2

        self.fd, self.mm = sealed_memfd("pump-plan", PLAN_SIZE, init, seals)
        self.plan = FFI.from_buffer("struct pump_plan *", self.mm)

    def publish(self, budget, triggers, order=C.PUMP_ORDER_MIGRATED):
        """Rewrites the plan as pumpd does (pump.channel.Plan.publish): triggers
        {launch key: (need, prefetch, evict ranges)}, ranges (address, bytes)."""
        channel.Plan(self.fd, self.mm).publish(budget, triggers, order)


def recv_exact(conn, n, fds):
    data = b""
    while len(data) < n:
        chunk, got, _flags, _addr = socket.recv_fds(conn, n - len(data), 4)
        fds.extend(got)
        if not chunk:
            return None
        data += chunk
    return data


def recv_message(conn):
    fds = []
    head = recv_exact(conn, 16, fds)
    if head is None:
        return None
    magic, version, kind, length, reserved = struct.unpack("<IHHII", head)
    payload = recv_exact(conn, length, fds) if length else b""
    return {"magic": magic, "version": version, "type": kind, "reserved": reserved,
            "request": json.loads(payload), "fds": fds}


def send_message(conn, kind, obj, fds=()):
    payload = obj if isinstance(obj, bytes) else json.dumps(obj).encode()
    data = struct.pack("<IHHII", C.PUMP_MSG_MAGIC, C.PUMP_PROTOCOL_VERSION, kind, len(payload), 0) + payload
    if fds:
        socket.send_fds(conn, [data], list(fds))
    else:
        conn.sendall(data)


class Daemon:
    """A listener on `path`; attach gets (ring, plan), resume gets a reply;
    reply="error" answers everything with an error."""

    def __init__(self, path, ring=None, plan=None, reply="ok", consume=False):
        self.path = str(path)
        self.ring, self.plan, self.reply = ring, plan, reply
        self.messages = []
        self.conns = []
        self.cond = threading.Condition()
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(self.path)
        self.listener.listen(16)
        self.stopping = False
        threading.Thread(target=self._serve, daemon=True).start()
        if consume:
            threading.Thread(target=self._consume, daemon=True).start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.conns.append(conn)
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _handle(self, conn):
        try:
            while (msg := recv_message(conn)) is not None:
                with self.cond:
                    self.messages.append(msg)
                    self.cond.notify_all()
                if self.reply == "error":
                    # raw: a control character the shim must not print
                    send_message(conn, C.PUMP_MSG_ERROR, b'{"error": "no room\n for you' + b"x" * 500 + b'"}')
                elif msg["request"]["op"] == "attach":
                    send_message(conn, C.PUMP_MSG_REPLY, {"ok": True, "session": 7, "job": "job-1"},
                                 (self.ring.fd, self.plan.fd))
                else:
                    send_message(conn, C.PUMP_MSG_REPLY, {"ok": True})
        except OSError:
            pass

    def _consume(self):
        while not self.stopping:
            if self.ring.header.magic == C.PUMP_RING_MAGIC:
                self.ring.read()
            time.sleep(0.001)

    def requests(self):
        with self.cond:
            return [m["request"] for m in self.messages]

    def wait_for(self, count, timeout=10):
        with self.cond:
            assert self.cond.wait_for(lambda: len(self.messages) >= count, timeout), self.messages
            return self.messages[count - 1]

    def close(self):
        """Goes away: the listener and every connection, as a crashed pumpd."""
        if self.stopping:
            return
        self.stopping = True
        self.listener.close()
        for conn in self.conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            conn.close()
        if os.path.exists(self.path):
            os.unlink(self.path)


@pytest.fixture
def sockdir():
    """A short directory for sockets (sun_path holds 108 bytes)."""
    path = tempfile.mkdtemp(prefix="pump-ch-")
    yield pathlib.Path(path)
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def daemon(sockdir):
    """daemon(**kwargs): a Daemon on sockdir/pumpd.sock with a fresh ring and plan."""
    made = []

    def make(capacity=65536, budget=0, ring=None, plan=None, **kwargs):
        for old in made:  # one listener on the path at a time
            old.close()
        d = Daemon(sockdir / "pumpd.sock", ring or Ring(capacity), plan or Plan(budget), **kwargs)
        made.append(d)
        return d

    yield make
    for d in made:
        d.close()


class Job:
    """A test program started under the shim, talking over stdin/stdout."""

    def __init__(self, c_build, libpump, stats_dir, name, *args, variant="plain", env=None):
        full_env = dict(clean_env(), LD_LIBRARY_PATH=str(c_build / variant), PUMP_STATS_DIR=str(stats_dir))
        if variant == "plain":
            full_env["LD_PRELOAD"] = str(libpump)
        full_env.update({"ASAN_OPTIONS": "detect_leaks=1", "TSAN_OPTIONS": "halt_on_error=1"})
        full_env.update(env or {})
        self.stats_dir = stats_dir
        self.proc = subprocess.Popen([str(c_build / variant / name), *map(str, args)], env=full_env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True)

    def line(self):
        text = self.proc.stdout.readline()
        assert text, self.proc.stderr.read()
        return json.loads(text)

    def say(self, text="go"):
        self.proc.stdin.write(text + "\n")
        self.proc.stdin.flush()

    def finish(self, timeout=300):
        out, err = self.proc.communicate(timeout=timeout)
        assert self.proc.returncode == 0, err[-4000:]
        self.stderr = err
        self.result = json.loads(out.splitlines()[-1])
        return self.result

    def record(self):
        (record,) = stats.read_dir(self.stats_dir)
        return record


@pytest.fixture
def job(c_build, libpump, tmp_path):
    counter = [0]

    def start(name, *args, **kwargs):
        counter[0] += 1
        stats_dir = tmp_path / f"job{counter[0]}"
        stats_dir.mkdir()
        return Job(c_build, libpump, stats_dir, name, *args, **kwargs)

    return start


def wait_until(predicate, timeout=10, what="condition"):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)


def attached(ring, records=1):
    """The shim has mapped the ring: its first records are there."""
    wait_until(lambda: ring.header.written >= records, what="the shim to attach and write")


def decode(records):
    """Merge multi-record events: ALLOC/FREE/SYNC/LAUNCH(+MORE)/FUNCTION(+NAME).
    COUNTERS (the worker's periodic accounting), DEVICE (see devices()), BUDGET
    (pump's own budget), LINK (a timed prefetch: tests/test_link_rate.py) and KERNEL (a timed
    kernel: tests/test_kernel_time.py) are left out."""
    events = []
    i = 0
    while i < len(records):
        r = records[i]
        kind, arg = r["kind"], r["arg"]
        if kind == "ALLOC":
            events.append(("ALLOC", arg[0], arg[1], arg[2]))
        elif kind == "FREE":
            events.append(("FREE", arg[0], arg[1]))
        elif kind == "SYNC":
            events.append(("SYNC", arg[0]))
        elif kind == "LAUNCH":
            bases = arg[2:5]
            while len(bases) < r["count"]:
                i += 1
                more = records[i]
                assert more["kind"] == "LAUNCH_MORE" and more["seq"] == records[i - 1]["seq"] + 1
                bases += more["arg"][: more["count"]]
            events.append(("LAUNCH", arg[0], arg[1], r["device"], bases[: r["count"]]))
        elif kind == "FUNCTION":
            name = b"".join(a.to_bytes(8, "little") for a in arg[1:5])
            while len(name) < r["count"]:
                i += 1
                more = records[i]
                assert more["kind"] == "NAME"
                name += b"".join(a.to_bytes(8, "little") for a in more["arg"])[: more["count"]]
            events.append(("FUNCTION", arg[0], name[: r["count"]].decode()))
        elif kind == "COUNTERS":
            assert r["count"] == 5
        elif kind == "DEVICE":
            assert r["count"] == 16 and r["device"] >= 0
        elif kind == "BUDGET":
            assert r["count"] == 1 and r["device"] >= 0 and arg[0] > 0
        elif kind == "LINK":
            assert r["count"] == 2 and r["device"] >= 0 and arg[0] >= 2 << 20 and arg[1] > 0
        elif kind == "KERNEL":
            assert r["count"] == 2 and r["device"] >= 0 and arg[0] != 0 and arg[1] > 0
        else:
            raise AssertionError(f"unexpected record {r}")
        i += 1
    return events


def devices(records):
    """(CUDA ordinal, UUID bytes) of each DEVICE record, in order."""
    return [(r["device"], b"".join(a.to_bytes(8, "little") for a in r["arg"][:2]))
            for r in records if r["kind"] == "DEVICE"]


def fakecuda_uuid(device):
    """fakecuda's UUID of a device (fakecuda/device.c)."""
    return b"fakecuda\x40\x80" + bytes(5) + bytes([device])


def check_seq(ring):
    records = ring.read()
    assert not ring.errors
    assert [r["seq"] for r in records] == list(range(1, len(records) + 1))
    assert ring.header.head == ring.header.written == len(records)
    return records


# ---- what the shim writes ----

def test_touch_events_in_order(run_program, daemon):
    d = daemon()
    run = run_program("touch_linked", env={"PUMP_SOCKET": d.path})
    assert run.result["gpu_faults"] == 0
    records = check_seq(d.ring)
    assert run.totals["events_written"] == len(records) and run.totals["events_dropped"] == 0
    events = decode(records)
    kinds = [e[0] for e in events]
    # four allocations, then per launch its function (first time) and the launch, a sync, four frees
    assert kinds[:4] == ["ALLOC"] * 4 and kinds[-5:] == ["SYNC"] + ["FREE"] * 4, kinds
    frees = [e[1] for e in events[-4:]]           # a, b, c, d: freed in that order
    a, b, c, dd = frees
    assert sorted(e[1] for e in events[:4]) == sorted(frees)
    assert all(e[2] == 64 * MiB and e[3] == 1 for e in events[:4])  # CU_MEM_ATTACH_GLOBAL
    names, launches = {}, []
    for e in events[4:-5]:
        if e[0] == "FUNCTION":
            assert e[1] not in names  # once per function
            names[e[1]] = e[2]
        else:
            assert e[0] == "LAUNCH" and e[1] in names  # its FUNCTION came first
            launches.append((names[e[1]], e[4], e[3]))
    assert launches == [("scale", [a], 0), ("axpy", [a, b], 0), ("sum", [b], 0), ("add", [a, b, c], 0),
                        ("scale", [dd], 0), ("negate", [dd], 0)]
    assert events[-5] == ("SYNC", 2)  # the first epoch is 1
    # The program's own records are in time order. A record of another thread (the attach
    # thread's FUNCTION and DEVICE announcements) carries its thread's clock, less its own
    # driver time, and may fall between them (seen once in a loaded CI run, at record 20).
    times = [r["time_ns"] for r in records if r["kind"] in ("ALLOC", "LAUNCH", "SYNC", "FREE")]
    assert times == sorted(times) and times[0] > 0
    (attach,) = d.requests()
    assert attach == {"op": "attach", "pid": run.records[0]["pid"], "job": "", "name": "", "policy": "launch"}


def test_long_function_names_are_cut(job, daemon):
    d = daemon()
    j = job("events", 2, "--wait", "--long-name", env={"PUMP_SOCKET": d.path})
    first = j.line()
    attached(d.ring, 2)
    j.say()
    j.finish()
    functions = [e for e in decode(check_seq(d.ring)) if e[0] == "FUNCTION"]
    long_name = "".join(chr(ord("a") + i % 26) for i in range(1500))
    assert functions == [("FUNCTION", first["long_function"], long_name[: C.PUMP_FUNCTION_NAME_MAX]),
                         ("FUNCTION", first["function"], "bump")]


def test_full_ring_drops_and_counts(job, daemon, run_program):
    """Nobody reads a 1024-record ring: the shim drops and counts, never waits."""
    launches = 3000
    d = daemon(capacity=C.PUMP_RING_RECORDS_MIN)
    start = time.monotonic()
    j = job("events", launches, "--sync-every=100", "--wait", env={"PUMP_SOCKET": d.path})
    j.line()
    attached(d.ring, 2)  # the two allocations
    j.say()
    result = j.finish()
    elapsed = time.monotonic() - start
    record = j.record()
    attempted = 2 + 1 + 1 + launches + result["syncs"] + 2  # ALLOC, FUNCTION, DEVICE, LAUNCH, SYNC, FREE
    h = d.ring.header
    assert h.written == C.PUMP_RING_RECORDS_MIN and h.dropped > 0
    # beyond those, only the worker's COUNTERS records (twice a second, once at exit), LINK
    # records (A prefetched again after each synchronisation: the first four timed back to back,
    # then one at most every interval) and KERNEL records (the one launch key's first few, then
    # one at most every interval)
    extra = h.written + h.dropped - attempted
    kernels = C.PUMP_KERNEL_FIRST_SAMPLES + 1 + elapsed / (C.PUMP_KERNEL_KEY_INTERVAL_NS / 1e9)
    assert 0 <= extra <= 2 * elapsed + 2 + 4 + elapsed / (C.PUMP_LINK_INTERVAL_NS / 1e9) + kernels, extra
    assert extra >= sum(r["kind"] in ("COUNTERS", "LINK", "KERNEL") for r in d.ring.read())
    assert (record["events_written"], record["events_dropped"]) == (h.written, h.dropped)
    bare = run_program("events", launches, "--sync-every=100", pump=False)
    assert result["checksum"] == bare.result["checksum"]
    assert check_seq(d.ring)[-1]["kind"] == "LAUNCH"


# ---- the plan and the budget ----

def run_with_plan(job, d, *setup, launches=3, planned_prefetches=0, args=()):
    """events with a plan written once the shim attached; stops at --wait-end
    to read the live counters, then finishes. planned_prefetches: the ranges the plan
    makes pump's worker prefetch, which the run waits for before the program frees its
    memory. args: events' own options."""
    j = job("events", launches, "--wait", "--wait-end", *args, env={"PUMP_SOCKET": d.path})
    first = j.line()
    attached(d.ring, 2)
    for step in setup:
        step(d.plan, first)
    j.say()
    j.line()  # {"launched": N}
    # A trigger's planned prefetches are made by pump's worker after the kernel that named them;
    # the program's last synchronisation waits for pump's streams, not for a worker that has yet
    # to make its calls, which a loaded machine runs late (3.25 of the 4 MiB seen moved, or
    # none), and a range freed while its move waits in the worker's queue is refused by the
    # driver (a clean-clone CI run: 12 of 14 MiB moved, the third trigger's prefetch made after
    # the program's free). So the run waits until the worker made them (counted once called).
    if planned_prefetches:
        wait_until(lambda: j.record()["plan_prefetch_ranges"] >= planned_prefetches,
                   what="pump's worker's planned prefetches")
    live = j.record()
    j.say()
    return first, live, j.finish(), j.record()


def key_of(first, *bases):
    """The launch key of events' kernel given these allocations (pump_channel.h)."""
    return channel.launch_key(first["function"], [first[b] for b in bases])


def test_plan_trigger_prefetches_a_named_range(job, daemon):
    _, _, without, _ = run_with_plan(job, daemon())
    assert without["bytes_prefetched_h2d"] == 2 * MiB  # A only: the kernel names nothing else

    d = daemon()
    first, live, result, record = run_with_plan(
        job, d, lambda plan, f: plan.publish(0, {
            key_of(f, "a"): ([], [(f["b"] + 4096, 64 << 10), (0x42, 4096)], []),  # B's first block; a stray range
            key_of(f, "b"): ([], [(f["b"], 4 * MiB)], []),                        # never launched: never used
        }), planned_prefetches=1)
    # after the first launch, B's first 2 MiB block comes in for later launches
    # No use event is recorded before the worker's, after its planned prefetch: it makes the
    # context's use events, in the context (before, cuEventCreate failed there with
    # CUDA_ERROR_INVALID_CONTEXT, no context being current on the worker's thread: errors 1, the
    # context's use events broken for good, and on a loaded machine the prefetch lost).
    assert record["errors"] == 0
    assert result["bytes_prefetched_h2d"] == 4 * MiB and result["bytes_prefetched_unused"] == 2 * MiB
    assert result["gpu_faults"] == without["gpu_faults"] == 0
    assert result["checksum"] == without["checksum"]
    assert record["plan_triggers"] == 3 and record["plan_prefetch_ranges"] == 1  # once: then believed resident
    assert record["plan_ranges_skipped"] == 3  # the stray range, at each launch
    # beliefs about the budget do not expire at a sync; frees end them
    assert live["resident_bytes"] == 4 * MiB and record["resident_bytes"] == 0
    assert record["resident_bytes_peak"] == 4 * MiB
    assert record["budget_bytes"] == 0 and record["budget_skips"] == 0 and record["bytes_evicted"] == 0
    # LAUNCH events carry the launch's own allocation, not the plan's
    launches = [e for e in decode(check_seq(d.ring)) if e[0] == "LAUNCH"]
    assert launches == [("LAUNCH", first["function"], launches[0][2], 0, [first["a"]])] * 3


def test_plan_trigger_prefetches_a_freed_tensors_memory(job, daemon):
    """A plan names the memory a step uses, and the tensor using it is often allocated only after
    the trigger: pump's allocator places it where it went the step before, and the caching
    allocator hands a freed block out again. Here B is a tensor freed before the launches, kept
    in place (shim/lookup/ranges.h): the trigger's prefetch brings its memory in for the launches
    to come. Before, a range in a freed tensor counted as skipped, and the launch that used the
    tensor next moved it itself (GPT-2 small under lookahead on the real-client tier: 1,054 of a
    step's plan ranges skipped, 42% of its launches planned; since, 69%)."""
    d = daemon()
    _, _, result, record = run_with_plan(
        job, d, lambda plan, f: plan.publish(0, {key_of(f, "a"): ([], [(f["b"], 4 * MiB)], [])}),
        planned_prefetches=1, args=("--dead-b",))
    assert record["errors"] == 0 and record["torch_tensor_frees"] == 1
    assert record["plan_triggers"] == 3 and record["plan_prefetch_ranges"] == 1  # once: then believed resident
    assert record["plan_ranges_skipped"] == 0
    assert result["bytes_prefetched_h2d"] == 6 * MiB and result["gpu_faults"] == 0  # A, and B for what comes


def test_plan_for_other_allocations_is_not_used(job, daemon):
    """The key names the allocations: the same kernel given B has another."""
    d = daemon()
    _, _, result, record = run_with_plan(
        job, d, lambda plan, f: plan.publish(0, {key_of(f, "b"): ([], [(f["b"], 4 * MiB)], [])}))
    assert result["bytes_prefetched_h2d"] == 2 * MiB
    assert record["plan_triggers"] == 0 and record["plan_prefetch_ranges"] == 0


def test_plan_need_replaces_the_launch_rule_in_the_allocations_it_names(job, daemon):
    """A trigger's need ranges are what its launch takes before the kernel, in place of the
    allocations they lie in; an allocation of the launch's own that no need range names (the
    plan learned the step from other memory) is taken whole, as the launch rule takes it: naming
    only B's first block still brings A, the kernel's, and nothing faults (before, A was left to
    its faults, which on a full device evict the blocks a plan placed)."""
    d = daemon()
    _, _, result, record = run_with_plan(
        job, d, lambda plan, f: plan.publish(0, {key_of(f, "a"): ([(f["b"], 2 * MiB)], [], [])}))
    assert result["bytes_prefetched_h2d"] == 4 * MiB and result["bytes_prefetched_unused"] == 2 * MiB
    assert result["gpu_faults"] == 0
    assert record["plan_triggers"] == 3 and record["launches_prefetched"] == 1


def test_a_need_cut_short_leaves_no_block_of_the_launch_to_faults(job, daemon):
    """The shim carries at most half a trigger's ranges as its need (channel.c); where the plan
    named more, the launch's own allocations are taken whole, as the launch rule takes them:
    here A (8 MiB) is named by the first need range, its other three blocks by ranges past the
    128th. Before, the kernel faulted those three blocks in (96 faults of 64 KiB; a GPT-2
    replay's logits, 393 blocks named one by one, faulted 265 of them a step)."""
    half = 128  # of shim/channel/channel.h's PUMP_TRIGGER_RANGES_MAX, the most a need carries
    d = daemon()

    def need(f):
        a, b = f["a"], f["b"]
        return [(a, 4096)] + [(b + 4096 * i, 4096) for i in range(half - 1)] + \
            [(a + (i << 21), 4096) for i in range(1, 4)]

    _, _, result, record = run_with_plan(
        job, d, lambda plan, f: plan.publish(0, {key_of(f, "a"): (need(f), [], [])}), args=("--a-mib=8",))
    assert result["gpu_faults"] == 0
    assert result["bytes_prefetched_h2d"] == 10 * MiB  # A whole, and B's first block its ranges named
    assert record["plan_triggers"] == 3 and record["plan_ranges_skipped"] == 3 * 3


def test_plan_budget_caps_prefetch(job, daemon):
    d = daemon(budget=3 * MiB)
    _, live, result, record = run_with_plan(
        job, d, lambda plan, f: plan.publish(3 * MiB, {key_of(f, "a"): ([], [(f["b"], 4 * MiB)], [])}))
    # A (2 MiB) fits the 3 MiB budget; no block of B fits beside it, and A is this launch's. B's
    # blocks were for launches to come, which take them: not faults, and the end line says none
    assert result["bytes_prefetched_h2d"] == 2 * MiB and result["gpu_faults"] == 0
    assert record["budget_bytes"] == 3 * MiB and record["plan_prefetch_skips"] == 3 * 2  # B's two blocks, 3 launches
    assert record["budget_skips"] == 0 and "left to faults" not in stats.summary_line(stats.aggregate([record]))
    assert record["plan_prefetch_ranges"] == 0
    assert live["resident_bytes"] == 2 * MiB
    assert record["bytes_evicted"] == 0 and record["evictions"] == 0


@pytest.mark.parametrize("budget, expect", [("100MiB", 100 * MiB), ("10%", 1 << 30)])
def test_env_budget(run_program, budget, expect):
    """PUMP_BUDGET without a daemon: 64 MiB buffers, a budget for one (10% of
    a 10 GiB device is 1 GiB: all four fit)."""
    env = {"PUMP_BUDGET": budget, "FAKECUDA_DEVICE_MEMORY": str(10 << 30)}
    run = run_program("touch_linked", env=env)
    bare = run_program("touch_linked", pump=False)
    assert run.result["checksum"] == bare.result["checksum"]
    assert run.totals["budget_bytes"] == expect
    assert run.totals["resident_bytes_peak"] <= expect
    if expect < 256 * MiB:
        # a launch given two buffers (128 MiB) cannot have both: the rest faults, others leave
        assert run.totals["budget_skips"] > 0 and run.result["gpu_faults"] > 0
        assert run.totals["bytes_evicted"] > 0
    else:
        assert run.totals["budget_skips"] == 0 and run.result["gpu_faults"] == 0
        assert run.totals["bytes_evicted"] == 0


@pytest.mark.parametrize("variant", ["plain", "asan"])
def test_garbage_plan_and_scribbled_ring_harm_nothing(job, daemon, run_program, variant):
    """Anyone with the fds may write anything into the plan and the ring's
    header: random bytes everywhere (magic and generation included), triggers
    for the program's functions out of bounds every way, or naming random
    addresses."""
    rng = random.Random(11)
    d = daemon(plan=Plan(garbage=True))
    j = job("events", 50, "--sync-every=7", "--wait", "--long-name", variant=variant,
            env={"PUMP_SOCKET": d.path})
    first = j.line()
    attached(d.ring, 2)
    os.pwrite(d.plan.fd, rng.randbytes(PLAN_SIZE), 0)
    p = d.plan.plan
    for key, spans in [(key_of(first, "a"), [(0xFFFFFFF0, 0xFFFF, 0xFFFF), (C.PUMP_PLAN_RANGES - 1, 5, 0)]),
                       (channel.launch_key(first["long_function"], [first["a"]]),
                        [(100, 0xFFFF, 0xFFFF), (100, 64, 1)])]:
        slot = channel.plan_slot(key)
        for probe, (lo, prefetch, evict) in enumerate(spans):
            t = p.trigger[(slot + probe) % C.PUMP_PLAN_SLOTS]
            t.key, t.first, t.prefetch, t.evict = key, lo, prefetch, evict
    p.range[100].address, p.range[100].bytes = first["b"], 2 * MiB  # one real range among random ones
    p.generation = 4
    os.pwrite(d.ring.fd, rng.randbytes(RING_HEADER), 0)
    j.say()
    result = j.finish()
    bare = run_program("events", 50, "--sync-every=7", "--long-name", pump=False)
    assert result["checksum"] == bare.result["checksum"]
    assert "Sanitizer" not in j.stderr and "runtime error" not in j.stderr
    record = j.record()
    assert record["events_written"] + record["events_dropped"] > 50
    assert record["plan_prefetch_ranges"] <= 1  # B's block, once, via the in-bounds trigger at most


# ---- devices: which GPU the process works on ----

def test_the_launch_device_is_named_once_with_its_uuid(run_program, daemon):
    """Launches on device 1 while device 0's context is current: device 1 is the one pump
    works on (its prefetch stream), named once; device 0 is not named."""
    d = daemon()
    run = run_program("devices", 1, 0, env={"PUMP_SOCKET": d.path, "FAKECUDA_DEVICES": "2"})
    assert run.result["gpu_faults"] == 0
    wait_until(lambda: d.ring.header.written >= run.totals["events_written"] > 0, what="every record")
    records = check_seq(d.ring)
    assert devices(records) == [(1, fakecuda_uuid(1))]
    (device,) = [r for r in records if r["kind"] == "DEVICE"]
    assert device["count"] == 16 and device["arg"][2:] == [0, 0, 0]


def test_pumps_own_budget_is_told_at_its_first_reading_and_each_change(run_program, daemon):
    """Above the device (capacity host) pump holds a budget of its own, read at the first launch
    and again at synchronisations (shim/policy/budget.c; tests/test_budget.py's program and figures: 254
    MiB at the margin it starts with, 124 while a neighbour holds 124 MiB, raised when it goes);
    each value goes to pumpd once, as a BUDGET record of the device, for its plans to keep to."""
    d = daemon()
    env = {"FAKECUDA_DEVICE_MEMORY": str(256 * MiB), "PUMP_CAPACITY": "host", "PUMP_SOCKET": d.path}
    run = run_program("budget", 4, 32, 5, "--neighbour=1:3:124", env=env)
    wait_until(lambda: d.ring.header.written >= run.totals["events_written"] > 0, what="every record")
    told = [(r["device"], r["arg"][0]) for r in check_seq(d.ring) if r["kind"] == "BUDGET"]
    assert told == [(0, 254 * MiB), (0, 124 * MiB), (0, run.totals["default_budget_bytes"])]
    assert run.totals["default_budget_bytes"] > 124 * MiB


def test_a_device_used_before_the_daemon_came_is_named_when_it_attaches(job, daemon, sockdir):
    path = sockdir / "pumpd.sock"
    j = job("events", 5, "--wait", "--wait-end", env={"PUMP_SOCKET": str(path)})
    j.line()
    j.say()
    j.line()  # launched on device 0 while no daemon listened
    d = daemon()
    d.wait_for(1, timeout=30)
    wait_until(lambda: devices(d.ring.read(wait=0)), what="the DEVICE record")
    j.say()
    j.finish()
    records = check_seq(d.ring)
    assert devices(records) == [(0, fakecuda_uuid(0))]
    assert sum(e[0] == "LAUNCH" for e in decode(records)) == 0  # launches before attach are not replayed


# ---- connection life ----

def test_resume_after_the_daemon_goes_away(job, daemon, sockdir):
    first_daemon = daemon()
    ring, plan = first_daemon.ring, first_daemon.plan
    j = job("events", 20, "--wait", "--wait-end", env={"PUMP_SOCKET": first_daemon.path, "PUMP_LOG": "1"})
    j.line()
    attached(ring, 2)
    first_daemon.close()
    j.say()  # launches while no daemon listens: they still go into the ring
    j.line()
    assert sum(r["kind"] == "LAUNCH" for r in ring.read()) == 20
    second = daemon(ring=ring, plan=plan)  # a restarted pumpd, same socket path
    msg = second.wait_for(1, timeout=15)
    assert msg["request"] == {"op": "resume", "pid": j.proc.pid}
    assert (msg["type"], msg["magic"], msg["version"], msg["reserved"]) == (C.PUMP_MSG_REQUEST, C.PUMP_MSG_MAGIC,
                                                                             C.PUMP_PROTOCOL_VERSION, 0)
    assert len(msg["fds"]) == 2
    same = [os.fstat(a).st_ino == os.fstat(b).st_ino for a, b in zip(msg["fds"], (ring.fd, plan.fd))]
    assert same == [True, True]
    # The device, named once to the first daemon and again to the second (it lost what
    # its predecessor read), before the program goes on.
    wait_until(lambda: len(devices(ring.read(wait=0))) == 2, what="the device named to the new daemon")
    j.say()
    j.finish()
    assert j.stderr.count("daemon connection lost; reconnecting") == 1
    records = check_seq(ring)
    kinds = [e[0] for e in decode(records)]
    assert kinds[-3:] == ["SYNC", "FREE", "FREE"]
    assert devices(records) == [(0, fakecuda_uuid(0))] * 2
    assert j.record()["events_dropped"] == 0


def test_empty_socket_means_no_daemon_and_unset_finds_the_users(run_program, sockdir):
    """PUMP_SOCKET unset: /run/pump/pumpd.sock, then the user's shared pumpd's,
    $XDG_RUNTIME_DIR/pump/<boot and pid namespace>/pumpd.sock (pump/runtime_dir.py)."""
    if os.path.exists("/run/pump/pumpd.sock"):
        pytest.skip("a system pumpd is running here")
    (sockdir / "pump" / runtime_dir.scope()).mkdir(parents=True)
    d = Daemon(sockdir / "pump" / runtime_dir.scope() / "pumpd.sock", Ring(), Plan())
    try:
        off = run_program("touch_linked", env={"PUMP_SOCKET": "", "XDG_RUNTIME_DIR": str(sockdir)})
        assert off.result["gpu_faults"] == 0 and off.proc.stderr == ""
        time.sleep(0.5)
        assert d.requests() == [] and d.conns == []
        found = run_program("touch_linked", env={"XDG_RUNTIME_DIR": str(sockdir)})
        assert found.result["checksum"] == off.result["checksum"]
        assert d.wait_for(1)["request"]["op"] == "attach"
        assert found.totals["events_written"] > 0
    finally:
        d.close()


def test_no_daemon_listening(run_program, sockdir):
    start = time.monotonic()
    bare = run_program("touch_linked", pump=False)
    bare_time = time.monotonic() - start
    start = time.monotonic()
    run = run_program("touch_linked", env={"PUMP_SOCKET": str(sockdir / "nobody.sock")})
    assert time.monotonic() - start < bare_time + 2
    assert run.result["checksum"] == bare.result["checksum"] and run.result["gpu_faults"] == 0
    assert run.proc.stderr == ""  # silent
    assert run.totals["events_written"] == run.totals["events_dropped"] == 0
    loud = run_program("touch_linked", env={"PUMP_SOCKET": str(sockdir / "nobody.sock"), "PUMP_LOG": "1"})
    assert sum("no pump daemon" in line for line in loud.proc.stderr.splitlines()) == 1


def test_attach_request_carries_job_name_policy(run_program, daemon):
    d = daemon()
    name = 'resnet "big" \\ run \u00e9'
    run = run_program("touch_linked", env={"PUMP_SOCKET": d.path, "PUMP_JOB": "j-42_x", "PUMP_NAME": name,
                                           "PUMP_POLICY": "off"})
    assert run.result["checksum"]
    msg = d.wait_for(1)
    assert msg["request"] == {"op": "attach", "pid": run.records[0]["pid"], "job": "j-42_x", "name": name,
                              "policy": "off"}
    assert (msg["type"], msg["fds"]) == (C.PUMP_MSG_REQUEST, [])
    # policy off still reports launches (device unknown: nothing prefetched)
    launches = [e for e in decode(check_seq(d.ring)) if e[0] == "LAUNCH"]
    assert len(launches) == 6 and {e[3] for e in launches} == {-1}


def test_bad_job_and_name_warn(run_program, daemon):
    d = daemon()
    run = run_program("touch_linked", env={"PUMP_SOCKET": d.path, "PUMP_JOB": "no spaces!",
                                           "PUMP_NAME": "n" * 65, "PUMP_BUDGET": "host"})
    lines = run.proc.stderr.splitlines()
    assert len(lines) == 3 and all("allowed" in line for line in lines), lines
    assert d.wait_for(1)["request"]["job"] == "" and d.requests()[0]["name"] == ""
    assert run.totals["budget_bytes"] == 0


def test_error_reply_is_logged_once_and_the_program_runs(run_program, daemon):
    d = daemon(reply="error")
    run = run_program("touch_linked", env={"PUMP_SOCKET": d.path, "PUMP_LOG": "1"})
    assert run.result["gpu_faults"] == 0
    (line,) = [l for l in run.proc.stderr.splitlines() if "refused attach" in l]
    assert "no room? for you" in line and len(line) < 300
    assert d.ring.header.written == 0 and run.totals["events_written"] == 0


@pytest.mark.parametrize("problem", ["unsealed", "capacity", "record_size", "magic"])
def test_invalid_ring_is_refused(run_program, daemon, problem):
    ring = {"unsealed": lambda: Ring(seals=0), "capacity": lambda: Ring(capacity=1000 * 2),
            "record_size": lambda: Ring(record_size=32), "magic": lambda: Ring(magic=1)}[problem]()
    if problem == "capacity":
        ring.header.capacity = 1000  # not a power of two, and not the memfd's size
    d = daemon(ring=ring)
    run = run_program("touch_linked", env={"PUMP_SOCKET": d.path, "PUMP_LOG": "1"})
    assert run.result["gpu_faults"] == 0
    assert d.wait_for(1)["request"]["op"] == "attach"
    assert run.totals["events_written"] == 0 and ring.header.head == 0
    assert "working without the daemon" in run.proc.stderr


@pytest.mark.parametrize("mode", ["before", "after"])
def test_fork(run_program, daemon, mode):
    """Forked before CUDA: the child attaches on its own. After: the child
    passes through, never attaches, writes nothing; the parent carries on."""
    d = daemon()
    run = run_program("fork", mode, env={"PUMP_SOCKET": d.path})
    assert run.proc.returncode == 0, run.proc.stderr
    users = {l["who"]: l["pid"] for l in run.lines}
    d.wait_for(1)
    time.sleep(0.3)
    expected = users["child"] if mode == "before" else users["parent"]
    assert [r["pid"] for r in d.requests()] == [expected]
    assert [r["op"] for r in d.requests()] == ["attach"]


# ---- sanitizers ----

@pytest.mark.parametrize("variant", ["asan", "tsan"])
@pytest.mark.parametrize("program, args", [("events", [300, "--sync-every=50"]), ("threads", [4, 300]),
                                           ("touch_linked", [1])])
def test_channel_under_sanitizers(run_program, daemon, variant, program, args):
    """A daemon that reads as the shim writes (a small ring goes round)."""
    d = daemon(capacity=C.PUMP_RING_RECORDS_MIN, consume=True)
    env = {"PUMP_SOCKET": d.path, "ASAN_OPTIONS": "detect_leaks=1:abort_on_error=0",
           "TSAN_OPTIONS": "halt_on_error=1:second_deadlock_stack=1", "UBSAN_OPTIONS": "print_stacktrace=1"}
    run = run_program(program, *args, variant=variant, env=env, timeout=600)
    assert run.proc.returncode == 0, run.proc.stderr[-4000:]
    assert "Sanitizer" not in run.proc.stderr and "runtime error" not in run.proc.stderr, run.proc.stderr[-4000:]
    d.wait_for(1)
    wait_until(lambda: d.ring.header.tail == d.ring.header.head, what="the reader to catch up")
    assert not d.ring.errors
    assert run.totals["events_written"] == d.ring.header.written == len(d.ring.seen)


def shim_side(ring: channel.Ring):
    """The ring's records as the shim maps them (pumpd's Ring maps only the header)."""
    mm = mmap.mmap(ring.fd, channel.HEADER_SIZE + ring.capacity * channel.RECORD_SIZE)
    return mm, np.frombuffer(mm, channel.EVENT, ring.capacity, channel.HEADER_SIZE)


def test_a_read_cut_by_its_limit_leaves_a_launch_with_its_more_records():
    """pumpd reads rings in chunks (daemon/pumpd/scheduler.py): a chunk never ends between
    a LAUNCH and the LAUNCH_MORE that extends it, which decode would count as invalid."""
    ring = channel.Ring.create(1, "jx", 1024)
    mm, records = shim_side(ring)
    kinds = ["launch", "launch", "launch_more", "launch_more", "launch"]
    for i, kind in enumerate(kinds):  # the second launch's 13 bases: 3 in it, 5 in each MORE
        rec = records[i]
        rec["kind"], rec["count"], rec["seq"] = channel.KIND[kind], 13 if kind == "launch" else 5, i + 1
    del rec, records  # views of the shim's mapping
    mm.close()
    ring.header.head = len(kinds)
    first = ring.read(3)  # would end after the first MORE
    assert [int(k) for k in first["kind"]] == [channel.KIND["launch"]]
    rest = ring.read(10)
    assert len(rest) == 4 and channel.decode(rest).invalid == 0
    ring.close()


def test_a_launch_its_writer_is_still_writing_waits_for_the_next_read(monkeypatch):
    """The shim reserves a launch's records at once and writes them one by one (shim/channel/
    channel.c): a read between two of them must not hand over the LAUNCH without the MORE records
    still to come, whose bases decode would then count invalid in the next read. Seen in CI: a
    writer preempted mid-launch left a foreach launch's last allocations out of the trace
    (tests/test_real_client_allocators.py's layout check, 3 of 15 runs). A group begun and never
    finished is handed over in part once it has held the ring up for STUCK_SECONDS."""
    clock = [0.0]
    monkeypatch.setattr(channel.time, "monotonic", lambda: clock[0])
    ring = channel.Ring.create(1, "jx", 1024)
    mm, records = shim_side(ring)
    rows = [("alloc", 1, [0x1000, 64, 0, 0, 0]), ("launch", 8, [7, 0, 0x1000, 0x2000, 0x3000]),
            ("launch_more", 5, [0x4000, 0x5000, 0x6000, 0x7000, 0x8000]), ("alloc", 1, [0x9000, 64, 0, 0, 0]),
            ("launch", 4, [7, 0, 0x1000, 0x2000, 0x3000]), ("launch_more", 1, [0x9000, 0, 0, 0, 0])]

    def write(i):
        kind, count, arg = rows[i]
        records[i]["kind"], records[i]["count"], records[i]["arg"], records[i]["seq"] = \
            channel.KIND[kind], count, arg, i + 1

    ring.header.head = 3  # the first ALLOC and the launch, reserved
    write(0)
    write(1)  # its MORE record not yet written
    assert [int(k) for k in ring.read()["kind"]] == [channel.KIND["alloc"]]
    assert len(ring.read()) == 0  # the launch waits for its MORE record
    write(2)
    whole = channel.decode(ring.read())
    assert whole.invalid == 0 and whole.launch_bases(0).tolist() == [0x1000 * k for k in range(1, 9)]
    ring.header.head = 6
    write(3)
    write(4)  # the second launch begun, its MORE never written
    assert [int(k) for k in ring.read()["kind"]] == [channel.KIND["alloc"]]
    assert len(ring.read()) == 0
    clock[0] += channel.STUCK_SECONDS + 0.1
    part = ring.read()  # held up too long: its part
    assert [int(k) for k in part["kind"]] == [channel.KIND["launch"]] and ring.lost == 0
    write(5)
    assert channel.decode(ring.read()).invalid == 1  # the MORE record, come too late
    del records
    mm.close()
    ring.close()


def test_a_whole_launch_before_a_record_still_being_written_is_read():
    """A launch whose records are all written goes in the read even where the record after it,
    another writer's, is reserved and not yet written: its count says it is whole
    (channel._group_length). Held back, it waited for the other's record; a writer killed at
    exit between reserving and writing held it until STUCK_SECONDS."""
    ring = channel.Ring.create(1, "jx", 1024)
    mm, records = shim_side(ring)
    rows = [("launch", 8), ("launch_more", 5), ("function", 50), ("name", 18)]
    for i, (kind, count) in enumerate(rows):
        records[i]["kind"], records[i]["count"], records[i]["seq"] = channel.KIND[kind], count, i + 1
    ring.header.head = len(rows) + 1  # one more reserved, not written
    assert [int(k) for k in ring.read()["kind"]] == [channel.KIND[k] for k, _ in rows]
    del records
    mm.close()
    ring.close()


def test_a_handle_named_again_within_one_read_keeps_both_names():
    """After an unload the driver may hand a function's handle to another kernel, and the shim
    names it again (shim/lookup/layouts.c); both names can fall in one read. decode's `named` keeps
    each with the launches before it; `functions` has the latest. Seen: a Triton autotuning
    candidate's handle reused for PyTorch's ForeachReduceOp within one read of a CI run."""
    ring = channel.Ring.create(1, "jx", 1024)
    mm, records = shim_side(ring)
    long_name = "x" * 50  # a FUNCTION record and one NAME record
    rows = [("function", 7, "first", b"first"), ("launch", 7, "", b""),
            ("function", 7, long_name, long_name[:32].encode()), ("name", 0, "", long_name[32:].encode()),
            ("launch", 7, "", b"")]
    for i, (kind, f, full, part) in enumerate(rows):
        rec = records[i]
        rec["kind"], rec["seq"], rec["count"] = channel.KIND[kind], i + 1, len(full) or len(part)
        words = [int.from_bytes(part.ljust(40, b"\0")[k:k + 8], "little") for k in range(0, 40, 8)]
        rec["arg"] = [f, *words[:4]] if kind in ("function", "launch") else words
    del rec, records  # views of the shim's mapping
    mm.close()
    ring.header.head = len(rows)
    batch = channel.decode(ring.read(10))
    ring.close()
    assert batch.invalid == 0
    assert batch.named == [(0, 7, "first"), (1, 7, long_name)]
    assert batch.functions == {7: long_name}


def test_a_head_past_what_the_shim_wrote_makes_no_ring_page_in_pumpd(monkeypatch):
    """A job writing its own ring can set its head past what it wrote. A memfd's page is made,
    and charged to the memory cgroup of the process that first touches it, even by a read
    through a mapping: read that way, pumpd made all 4 MiB of each such ring (256 sessions a
    user, 1 GiB of pumpd's MemoryMax=2G, held as long as the jobs keep their memfds; issue 45
    item 6). pumpd reads records with pread, which reads a page never written as zeros."""
    ring = channel.Ring.create(1, "jx")            # the default 65,536 records: 4 MiB
    clock = [0.0]
    monkeypatch.setattr(channel.time, "monotonic", lambda: clock[0])
    try:
        made_by_create = os.fstat(ring.fd).st_blocks * 512
        assert made_by_create <= 4096                  # the header's page
        ring.header.head = ring.capacity               # nothing written
        for _ in range(3):                             # waits, then skips the records as stuck
            assert len(ring.read()) == 0
            clock[0] += channel.STUCK_SECONDS + 0.1
        assert ring.lost == ring.capacity
        assert os.fstat(ring.fd).st_blocks * 512 == made_by_create
    finally:
        ring.close()


def test_pumpd_writes_triggers_only_into_plan_pages_the_job_made():
    """A memfd's page is charged to the memory cgroup of whoever touches it first: pumpd's
    writes of a plan made up to 1.4 MiB a lookahead process in pumpd's (issue 45 item 6; 0.78 MB
    a session measured, at 4,096 sessions over MemoryMax). The shim makes the pages when it maps
    the plan; pumpd writes triggers only where they exist, and else the budget alone."""
    plan = channel.Plan.create()
    try:
        made_by_create = os.fstat(plan.fd).st_blocks * 512
        assert made_by_create == 4096                           # the header's page
        triggers = {(k << 52) | 1: ([(0x7f0000000000 + (k << 21), 2 << 20)], [], []) for k in (1, 2, 3)}
        assert not plan.write(5 << 20, channel.C.PUMP_ORDER_MIGRATED, channel.Plan.layout(triggers))
        assert os.fstat(plan.fd).st_blocks * 512 == made_by_create
        assert plan.plan.budget_bytes == 5 << 20 and plan.plan.trigger_count == 0
        assert plan.unmade_writes == 1 and plan.dropped_triggers == 3
        make_plan_pages(plan.fd)                                # the shim's part, in its memory
        plan.publish(0, triggers)
        assert plan.unmade_writes == 1
        assert sorted(int(k) for k in plan.slots["key"][plan.slots["key"] != 0]) == sorted(triggers)
        again = {(9 << 52) | 1: ([(0x7f0000000000, 2 << 20)], [], [])}
        plan.publish(0, again)                                  # the slots no longer used are cleared
        assert [int(k) for k in plan.slots["key"][plan.slots["key"] != 0]] == list(again)
        assert plan.plan.trigger_count == 1
    finally:
        plan.close()


def test_the_shim_makes_its_plans_pages(run_program, daemon):
    """libpump reads each page of the plan once when it maps it: the pages exist, made by the
    job, before pumpd writes a trigger."""
    d = daemon()
    run = run_program("events", 1, env={"PUMP_SOCKET": d.path})
    # the shim maps the plan before it writes its first record
    wait_until(lambda: d.ring.header.written >= run.totals["events_written"] > 0, what="every record")
    assert os.fstat(d.plan.fd).st_blocks * 512 >= channel.PLAN_SIZE
