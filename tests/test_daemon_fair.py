"""Fair service (issue 29, finding 4): one user's processes keep their lookahead rings
full of valid records, and another user's status and attach are still answered promptly.

pumpd runs with asyncio's debug mode (PYTHONASYNCIODEBUG=1), which logs every callback
that held the loop over pumpd's SLOW_CALLBACK_SECONDS; the test bounds the worst of them
too.  The bounds are for a shared 2-core CI machine: before fair slices, one attacking
process held the loop 19 s at a time; with the lookahead planner on a thread of pumpd's
process, its GIL held the loop past them in about one run in three (attach p99 264 ms,
a 5.5 s watchdog gap)."""

import json
import os
import re
import shutil
import socket
import pathlib
import subprocess
import sys
import tempfile
import threading
import time
import traceback

import numpy as np
import pytest

from fakeshim import FakeShim
from helpers import clean_env, start_pumpd, stop_pumpd
from pump import channel, protocol
from test_daemon import NOBODY

ROOT = pathlib.Path(__file__).resolve().parent.parent
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as a second user")

ATTACKERS = 4           # processes of one hostile user
SECONDS = 12.0          # how long they attack, and the other user measures
CYCLE = 30_000          # distinct launches per "iteration": a long one to learn and plan
P99_BOUND = 0.25        # seconds, another user's status and attach
WORST_BOUND = 1.0       # seconds, any one of them, and any callback asyncio reports
WATCHDOG_SECONDS = 2.0  # the watchdog's timeout here (the unit's is 30 s): pinged every 1 s


BASES = [(1 << 36) + i * (64 << 20) for i in range(64)]   # 64 allocations of 64 MiB


def hostile_records() -> np.ndarray:
    """CYCLE launches of distinct kernels on the allocations (made before a child drops
    root: uid 65534 cannot read this interpreter's modules to import more)."""
    rng = np.random.default_rng(29)
    records = np.zeros(CYCLE, channel.EVENT)
    records["kind"], records["count"] = channel.KIND["launch"], 3
    records["arg"][:, 0] = rng.integers(1, 1 << 40, CYCLE, dtype=np.uint64) * 16
    records["arg"][:, 2:5] = np.asarray(BASES, dtype=np.uint64)[rng.integers(0, len(BASES), (CYCLE, 3))]
    return records


def watchdog_pings(notify: socket.socket, pings: list):
    """Note when each WATCHDOG=1 arrives, until the socket is closed."""
    while True:
        try:
            message = notify.recv(4096)
        except OSError:
            return
        if b"WATCHDOG=1" in message:
            pings.append(time.monotonic())


def nobodys_lookahead_shim(path: str, name: str) -> tuple:
    """In a child: drop to uid 65534, register a lookahead job and attach to it: (its client,
    the shim)."""
    os.setgroups([])
    os.setgid(NOBODY)
    os.setuid(NOBODY)
    client = protocol.Client(path)
    job = client.request({"op": "register", "name": name, "policy": "lookahead"})["job"]
    return client, FakeShim(path, job=job, policy="lookahead")


def attack(path: str, seconds: float, report: int, records: np.ndarray):
    """In a child as uid 65534: keep a lookahead ring full of valid launches."""
    client, shim = nobodys_lookahead_shim(path, "hostile")
    for base in BASES:
        shim.emit("alloc", base, 64 << 20, 1)
    at, written, deadline = 0, 0, time.monotonic() + seconds
    while time.monotonic() < deadline:
        part = records[at:at + 4096]
        n = shim.emit_many(part)
        written += n
        at = (at + n) % CYCLE
        if n < len(part):
            time.sleep(0.001)  # full: pumpd has not read it yet
    seen = [j for j in client.request({"op": "status"})["jobs"] if j["job"] == shim.job]
    os.write(report, json.dumps({"written": written, "events": seen[0]["events"] if seen else 0}).encode())
    os._exit(0)


def latencies(path: str, seconds: float) -> dict:
    """Another user (root here): one status and one attach after another, timed."""
    with protocol.Client(path, timeout=60) as c:
        job = c.request({"op": "register", "name": "victim"})["job"]
    out = {"status": [], "attach": []}
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        began = time.monotonic()
        try:
            with protocol.Client(path) as c:
                c.request({"op": "status"})
        except OSError:  # not answered within the client's 5 s: counted as that long
            pass
        out["status"].append(time.monotonic() - began)
        began = time.monotonic()
        try:
            FakeShim(path, job=job, name="victim").close()
        except OSError:
            pass
        out["attach"].append(time.monotonic() - began)
        time.sleep(0.02)
    return out


@needs_root
def test_one_users_full_rings_leave_another_user_served_promptly():
    run_dir = tempfile.mkdtemp(prefix="pump-test-")
    os.chmod(run_dir, 0o755)
    path = os.path.join(run_dir, "pumpd.sock")
    # systemd's watchdog, as the unit sets it but every WATCHDOG_SECONDS: pumpd pings it
    # from its event loop every half of that.
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(os.path.join(run_dir, "notify"))
    pings = []
    listener = threading.Thread(target=watchdog_pings, args=(notify, pings), daemon=True)
    listener.start()
    proc = start_pumpd(path, env=dict(clean_env(), RUNTIME_DIRECTORY=run_dir, PYTHONASYNCIODEBUG="1",
                                      NOTIFY_SOCKET=notify.getsockname(),
                                      WATCHDOG_USEC=str(int(WATCHDOG_SECONDS * 1e6))),
                       stderr=subprocess.PIPE, text=True)
    children = []
    try:
        records = hostile_records()
        for _ in range(ATTACKERS):
            r, w = os.pipe()
            pid = os.fork()
            if pid == 0:
                try:
                    os.close(r)
                    attack(path, SECONDS, w, records)
                except BaseException:  # noqa: B036 - said on stderr; the parent sees no report
                    traceback.print_exc()
                finally:
                    os._exit(1)
            os.close(w)
            children.append((pid, r))
        time.sleep(1.0)  # the attack is under way
        measured = latencies(path, SECONDS - 2.0)
        reports = []
        for pid, r in children:
            with os.fdopen(r) as f:
                reports.append(json.loads(f.read() or "{}"))
            os.waitpid(pid, 0)
        children = []
    finally:
        for pid, r in children:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
        stop_pumpd(proc)
        notify.close()
        shutil.rmtree(run_dir)
    log = proc.stderr.read()
    gaps = np.diff(pings)
    # Callbacks asyncio found slow, but for pumpd's stop (its main task: the last read of
    # every ring into traces, bounded by server.FLUSH_SECONDS), when nothing is served.
    slow = [float(t) for t in re.findall(r"(?m)^Executing (?!<Task finished name='Task-1' coro=<main).*"
                                          r"took (\d+\.\d+) seconds", log)]
    figures = {what: (f"p50 {np.percentile(v, 50) * 1e3:.0f} ms, p99 {np.percentile(v, 99) * 1e3:.0f} ms, "
                      f"max {max(v) * 1e3:.0f} ms over {len(v)}") for what, v in measured.items()}
    print(f"\n{ATTACKERS} hostile processes, {sum(r.get('events', 0) for r in reports)} of their "
          f"{sum(r.get('written', 0) for r in reports)} records read; another user's {figures}; "
          f"{len(slow)} slow callbacks, the worst {max(slow, default=0) * 1e3:.0f} ms; "
          f"{len(pings)} watchdog pings, the longest gap {max(gaps, default=0) * 1e3:.0f} ms")
    assert all(r.get("events", 0) > 0 for r in reports), reports  # the attack ran and was read
    assert "Traceback" not in log, log[log.index("Traceback") - 200:][:2000]  # nor did the planner fail
    for what, v in measured.items():
        assert np.percentile(v, 99) < P99_BOUND and max(v) < WORST_BOUND, (what, figures[what])
    # systemd would have killed a pumpd whose pings stopped for WATCHDOG_SECONDS
    assert len(pings) > SECONDS / WATCHDOG_SECONDS and max(gaps) < WATCHDOG_SECONDS, gaps
    assert max(slow, default=0) < WORST_BOUND, [line for line in log.splitlines() if "took" in line][:5]


# ---- issue 45, attack 1: one user's planning must not stop another's lookahead ----
HUGE = 1 << 38                 # one allocation of 131,072 2 MiB blocks (inside the planned-blocks cap)
HUGE_BASE = 1 << 40
REPLAN_SECONDS = 14.0          # how long the attacker forces plans made anew
VICTIM_RATE = 5000             # records a second the other user writes (250 every 50 ms)
VICTIM_CYCLE = 8               # her iteration: 8 launches
VICTIM_BASES = [(1 << 36) + i * (8 << 20) for i in range(VICTIM_CYCLE)]


def replan_attack(path: str, seconds: float, report: int):
    """In a child as uid 65534 (issue 45, finding 1): a 16-launch iteration on one 256 GiB
    allocation, learned; then batch after batch of LINK records whose rate swings 100x, each
    with one launch: every batch would make the whole plan anew."""
    _, shim = nobodys_lookahead_shim(path, "replanner")
    shim.emit("alloc", HUGE_BASE, HUGE, 1)
    for i in range(64):
        shim.launch(0x1000 + 16 * (i % 16), HUGE_BASE)
    time.sleep(0.5)
    deadline, batches, i = time.monotonic() + seconds, 0, 64
    while time.monotonic() < deadline:
        for j in range(15):
            shim.emit("link", 1 << 30, 10**7 if (batches + j) % 2 else 10**9, count=2)
        shim.launch(0x1000 + 16 * (i % 16), HUGE_BASE)
        i, batches = i + 1, batches + 1
        time.sleep(0.05)  # a batch of its own
    os.write(report, json.dumps({"batches": batches}).encode())
    os._exit(0)


def victim(path: str, seconds: float) -> dict:
    """Another user (root here): a lookahead job writing VICTIM_RATE records a second in
    8-launch iterations; when its plan first had triggers, and what its ring dropped."""
    with protocol.Client(path, timeout=60) as c:
        job = c.request({"op": "register", "name": "victim", "policy": "lookahead"})["job"]
    shim = FakeShim(path, job=job, name="victim", policy="lookahead")
    for base in VICTIM_BASES:
        shim.emit("alloc", base, 8 << 20, 1)
    began = time.monotonic()
    planned_after, written, i = None, 0, 0
    per_tick = VICTIM_RATE // 20
    while time.monotonic() - began < seconds:
        for _ in range(per_tick):
            shim.launch(0x2000 + 16 * (i % VICTIM_CYCLE), VICTIM_BASES[i % VICTIM_CYCLE])
            i += 1
        written += per_tick
        if planned_after is None and shim.plan_triggers():
            planned_after = time.monotonic() - began
        time.sleep(0.05)
    dropped = int(shim.header.dropped)
    with protocol.Client(path, timeout=60) as c:
        deadline = time.monotonic() + 10
        while True:  # what pumpd has read of hers, once it caught up
            mine = [j for j in c.request({"op": "status"})["jobs"] if j["job"] == job][0]
            if mine["events"] >= written + len(VICTIM_BASES) or time.monotonic() > deadline:
                break
            time.sleep(0.1)
    shim.close()
    return {"planned_after": planned_after, "dropped": dropped, "written": written + len(VICTIM_BASES),
            "read": mine["events"], "fallbacks": mine.get("lookahead_fallbacks")}


@needs_root
def test_one_users_plans_made_anew_leave_another_users_ring_read_and_plan_published():
    """Issue 45, attack 1: before, while any batch was planned no lookahead ring was read, and
    one user's forced re-plans (about 10 s of planner CPU each) left another's batches unread
    for up to 20.9 s and lost 59% of her 5,000 records a second to a full ring. Now rings are
    read whatever the planner does, turns are shared by user, a swinging link rate makes one
    plan anew per 5 s, and a turn past its deadline is given up (tests/test_scheduler.py).
    On the parent commit (fa6753b), here: 512 of her 56,258 records read, her plan published
    after 10.97 s; now: all 57,508, after 4.29 s."""
    from pumpd.limits import PLAN_DEADLINE_SECONDS
    run_dir = tempfile.mkdtemp(prefix="pump-test-")
    os.chmod(run_dir, 0o755)
    path = os.path.join(run_dir, "pumpd.sock")
    proc = start_pumpd(path, env=dict(clean_env(), RUNTIME_DIRECTORY=run_dir), stderr=subprocess.PIPE, text=True)
    pid = None
    try:
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                os.close(r)
                replan_attack(path, REPLAN_SECONDS, w)
            except BaseException:  # noqa: B036 - said on stderr; the parent sees no report
                traceback.print_exc()
            finally:
                os._exit(1)
        os.close(w)
        time.sleep(2.0)  # the attacker's iteration learned and its re-plans under way
        seen = victim(path, REPLAN_SECONDS - 2.0)
        with os.fdopen(r) as f:
            report = json.loads(f.read() or "{}")
        os.waitpid(pid, 0)
        pid = None
    finally:
        if pid is not None:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
        stop_pumpd(proc)
        shutil.rmtree(run_dir)
    log = proc.stderr.read()
    fell_back = [line for line in log.splitlines() if "falls back to the launch rule" in line]
    print(f"\nattacker: {report.get('batches')} batches, {fell_back or 'no fallback'}; the other user: {seen}")
    assert report.get("batches", 0) > 50, report
    assert "Traceback" not in log, log[log.index("Traceback") - 200:][:2000]
    assert seen["dropped"] == 0 and seen["read"] == seen["written"], seen  # counts: nothing of hers lost
    # Her plan: after at most one of the attacker's turns (its deadline, its backstop at twice
    # that) and her own, on a loaded 2-core machine.
    assert seen["planned_after"] is not None and seen["planned_after"] < 2 * PLAN_DEADLINE_SECONDS + 3, seen
    assert not seen["fallbacks"], seen


# ---- issue 45, attack 2: planner memory ----
MEMORY_SECONDS = 15.0
PLANNER_RSS_BOUND = 1 << 30  # one user's share of the planner (limits.memory_at_most counts them all)


def test_a_ring_naming_a_huge_allocation_in_every_launch_does_not_grow_the_planner_without_bound():
    """Issue 45, attack 2: one ALLOC of 32,768 x 2 MiB, then batch after batch of 256 launches,
    each of a new kernel with an EXTENT over the whole allocation (and the ALLOC again). The
    planner grew 34 MB -> 4.5 GB in 40 s (here: 2.7 GB after 10 s); its launch histories now
    hold at most the user's share of block references (pump/foresight.py's refs_max)."""
    import psutil
    run_dir = tempfile.mkdtemp(prefix="pump-test-")
    path = os.path.join(run_dir, "pumpd.sock")
    proc = start_pumpd(path, env=dict(clean_env(), RUNTIME_DIRECTORY=run_dir), stderr=subprocess.PIPE, text=True)
    base, size, peak = 1 << 40, 32768 * (2 << 20), 0
    try:
        with protocol.Client(path) as c:
            job = c.request({"op": "register", "name": "grower", "policy": "lookahead"})["job"]
        shim = FakeShim(path, job=job, policy="lookahead")
        function, began = 0x10, time.monotonic()
        while time.monotonic() - began < MEMORY_SECONDS:
            shim.emit("alloc", base, size, 1)
            for _ in range(256):
                function += 16
                shim.launch(function, base)
                shim.emit("extent", base, size, 0, 0, 0, count=1)
            time.sleep(0.01)
            for child in psutil.Process(proc.pid).children():
                try:
                    peak = max(peak, child.memory_info().rss)
                except psutil.NoSuchProcess:
                    pass
        waited = time.monotonic() + 30  # the planner's turns catch up (a loaded CI machine's lag)
        while True:
            with protocol.Client(path) as c:
                mine = [j for j in c.request({"op": "status"})["jobs"] if j["job"] == job][0]
            if mine["planner_trimmed"] or time.monotonic() > waited:
                break
            time.sleep(0.2)
        shim.close()
    finally:
        stop_pumpd(proc)
        shutil.rmtree(run_dir)
    log = proc.stderr.read()
    print(f"\nthe planner's peak RSS {peak >> 20} MiB; {mine['events']} records read, "
          f"{mine['planner_skipped']} skipped by the planner, {mine['planner_trimmed']} launches trimmed; "
          f"{mine['lookahead_fallbacks']}")
    assert mine["events"] > 100_000, mine  # the attack ran and was read
    assert mine["planner_trimmed"] > 0, mine  # the cap did the holding, and pump status says so
    assert "Traceback" not in log, log[log.index("Traceback") - 200:][:2000]
    assert 0 < peak < PLANNER_RSS_BOUND, peak


# ---- issue 45, finding 5: many jobs ----
@needs_root
def test_many_jobs_cost_each_register_in_proportion_and_their_deaths_clear_at_once():
    """scripts/bench-daemon-scale at 2,048 jobs of 8 users: a register's CPU grows in proportion
    to the jobs (each rebalances every budget), another user's status stays fast, and 1,792 jobs
    whose leaders die at once are gone within a liveness pass or two: pumpd rebalanced once per
    job gone (5.5 s for them, here) before it rebalanced once per pass (0.44 s)."""
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench-daemon-scale"), "--jobs", "2048", "--json"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads(proc.stdout)
    rows = {r["jobs"]: r for r in doc["rows"]}
    print(f"\n{doc}")
    assert set(rows) == {256, 512, 1024, 2048}
    assert rows[2048]["cpu_ms_per_register"] < 3 * rows[1024]["cpu_ms_per_register"], rows  # linear, not worse
    assert rows[2048]["status_ms_median"] < 50, rows
    assert doc["jobs_killed"] == 1792 and doc["dead_jobs_gone_s"] < 5.0, doc
