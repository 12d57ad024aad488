"""Trace files against hostile descriptors and failing machines: pumpd takes only
regular files, writes them off its event loop, gives up one trace on an error
without stopping anything else, and what it read reaches the file even when it
is killed; pump-run opens the file without following links or truncating a
file that is not the caller's, and says when a trace is incomplete."""

import json
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import psutil
import pytest

from fakeshim import FakeShim
from helpers import PUMP_RUN, clean_env, start_pumpd, stop_pumpd
from pump import channel, protocol, trace


@pytest.fixture
def pumpd(tmp_path):
    path = tmp_path / "pumpd.sock"
    proc = start_pumpd(path)
    yield str(path)
    stop_pumpd(proc)


@pytest.fixture
def job_env(c_build):
    env = clean_env()
    env["LD_LIBRARY_PATH"] = str(c_build / "plain")
    return env


def register_with(path, fd):
    with protocol.Client(path) as c:
        return c.request({"op": "register", "name": "traced", "trace": True}, fds=(fd,))["job"]


def jobs(path):
    with protocol.Client(path) as c:
        return {j["job"]: j for j in c.request({"op": "status"})["jobs"]}


def wait_for(predicate, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def test_a_pipe_is_refused_as_a_trace(pumpd):
    # Before: pumpd took the pipe, and once its buffer filled a write on the
    # event loop blocked every request of every job.
    r, w = os.pipe()
    try:
        with pytest.raises(protocol.ProtocolError, match="not a regular file"):
            register_with(pumpd, w)
        os.close(r)  # a pipe whose reader closed: the same answer
        with pytest.raises(protocol.ProtocolError, match="not a regular file"):
            register_with(pumpd, w)
    finally:
        os.close(w)
    assert protocol.ping(pumpd)


def test_a_read_only_descriptor_is_refused(pumpd, tmp_path):
    (tmp_path / "t").write_bytes(b"")
    fd = os.open(tmp_path / "t", os.O_RDONLY)
    try:
        with pytest.raises(protocol.ProtocolError, match="not open for writing"):
            register_with(pumpd, fd)
    finally:
        os.close(fd)


@pytest.fixture
def small_fs(tmp_path):
    """A 64 KiB tmpfs (root only: skipped elsewhere)."""
    mount = tmp_path / "small"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {done.stderr.strip()}")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_full_file_system_ends_that_trace_only(pumpd, small_fs):
    # Before: ENOSPC raised inside ingest: the ingest task ended for good and
    # every job's counters froze.
    fd = os.open(small_fs / "t", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        traced = register_with(pumpd, fd)
    finally:
        os.close(fd)
    writer = FakeShim(pumpd, job=traced, name="traced")
    bystander = FakeShim(pumpd, name="bystander")
    for _ in range(40):  # 40 x 64 x 64-byte records: far past 64 KiB
        for i in range(64):
            writer.emit("alloc", (1 << 30) + (i << 21), 1 << 20, 1)
        time.sleep(0.01)
    assert wait_for(lambda: (jobs(pumpd)[traced]["trace"] or {}).get("problem") == "the file system is full")
    bystander.launch(0x10, 1 << 30)
    assert wait_for(lambda: jobs(pumpd)[bystander.job]["events"] == 1)  # ingest goes on
    assert protocol.ping(pumpd)
    writer.close()
    bystander.close()


def test_a_symlink_at_the_trace_path_is_not_followed(tmp_path):
    target = tmp_path / "someone-elses"
    target.write_text("keep me")
    (tmp_path / "t.trace").symlink_to(target)
    proc = subprocess.run([PUMP_RUN, "--daemon", "embedded", "--trace", str(tmp_path / "t.trace"), "true"],
                          env=clean_env(), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr == f"pump-run: --trace {tmp_path / 't.trace'}: a symbolic link, not followed\n"
    assert target.read_text() == "keep me"


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make another user's file")
def test_another_users_file_is_not_truncated(tmp_path):
    theirs = tmp_path / "theirs.trace"
    theirs.write_text("keep me")
    os.chown(theirs, 65534, 65534)
    proc = subprocess.run([PUMP_RUN, "--daemon", "embedded", "--trace", str(theirs), "true"],
                          env=clean_env(), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "belongs to uid 65534" in proc.stderr
    assert theirs.read_text() == "keep me"


def test_trace_written_line(c_build, job_env, tmp_path):
    path = tmp_path / "job.trace"
    proc = subprocess.run([PUMP_RUN, "--daemon", "embedded", "--trace", str(path), "--stats", str(tmp_path / "s.json"),
                           "--", str(c_build / "plain" / "touch_linked"), "3"],
                          env=job_env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    held = trace.count_records(path)
    assert held == json.loads((tmp_path / "s.json").read_text())["totals"]["events_written"] > 0
    assert proc.stderr.splitlines()[-1] == f"pump-run: trace written: {path} ({held} records)"


def test_killed_pumpd_leaves_what_it_read_and_pump_run_says_so(c_build, job_env, tmp_path):
    # Before: up to 1 MiB sat in pumpd's buffer: kill -9 left a 0-byte trace and
    # pump-run said nothing.
    path = tmp_path / "job.trace"
    job = subprocess.Popen([PUMP_RUN, "--daemon", "embedded", "--trace", str(path), "--",
                            str(c_build / "plain" / "events"), "200", "--wait", "--wait-end"],
                           env=job_env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True, bufsize=1)
    try:
        job.stdout.readline()
        time.sleep(1.5)  # the shim attaches in the background: launches before that go unrecorded
        job.stdin.write("go\n")
        for line in job.stdout:
            if line.startswith('{"launched"'):
                break
        daemons = [p for p in psutil.Process(job.pid).children() if "pumpd" in " ".join(p.cmdline())]
        assert len(daemons) == 1
        assert wait_for(lambda: trace.count_records(path) >= 200)  # read by pumpd: on disk, not in pumpd
        os.kill(daemons[0].pid, signal.SIGKILL)
        assert wait_for(lambda: daemons[0].status() == psutil.STATUS_ZOMBIE)  # pump-run's to reap
        out, err = job.communicate("go\n", timeout=60)
    finally:
        if job.poll() is None:
            job.kill()
    assert job.returncode == 0, err
    assert json.loads(out.splitlines()[-1])["kernels_run"] == 200
    held = trace.count_records(path)
    assert held >= 200
    assert f"pump-run: warning: trace incomplete: {path} holds {held} of the " in err
    assert err.rstrip().endswith("(pumpd ended before the job did)")
    header, blocks = trace.read(path)  # what is there reads cleanly
    assert sum(len(r) for _, r in blocks) == held
    assert channel.KIND["launch"] in {int(k) for _, r in blocks for k in r["kind"]}


def test_a_write_that_hangs_ends_that_trace_only(tmp_path, monkeypatch):
    """A regular file on FUSE or NFS can block a write forever: past WRITE_TIMEOUT the
    trace is given up, a new writer takes the hung one's place, and other traces are
    still written."""
    from pumpd import tracing
    monkeypatch.setattr(tracing, "WRITE_TIMEOUT", 0.2)
    release = threading.Event()
    real_write_all = tracing._write_all
    hung_fd = os.open(tmp_path / "hung", os.O_WRONLY | os.O_CREAT, 0o600)
    ok_fd = os.open(tmp_path / "ok", os.O_WRONLY | os.O_CREAT, 0o600)

    def write_all(fd, data):
        if fd == hung_fd:
            release.wait(30)   # as a write on a dead NFS server would
        real_write_all(fd, data)
    monkeypatch.setattr(tracing, "_write_all", write_all)
    pool = tracing.WriterPool()
    try:
        threads = len(pool.threads)
        hung = pool.open(hung_fd, "j1", "hung", 1000)
        ok = pool.open(ok_fd, "j2", "ok", 2000)
        record = np.zeros(1, channel.EVENT)
        for _ in range(3):
            hung.write(1, record)
        time.sleep(0.3)
        pool.check_timeouts()
        assert hung.status()["problem"] == "a write took over 0.2 s"
        assert len(pool.threads) == threads + 1
        for _ in range(5):
            ok.write(2, record)
        assert wait_for(lambda: ok.status()["records_written"] == 5, timeout=5)
        ok.close()
        assert wait_for(ok.done, timeout=5)
        assert ok.status()["problem"] is None
    finally:
        release.set()
        pool.stop()
    assert trace.count_records(str(tmp_path / "ok")) == 5


def test_one_users_hung_traces_cannot_fill_pumpd(tmp_path, monkeypatch):
    """Traces to files that hang queue at most QUEUE_BYTES_PER_UID_MAX of their user's
    records, however many jobs that user traces; another user's trace is still queued
    and written, and what was held is given back when the hung traces end."""
    from pumpd import tracing
    monkeypatch.setattr(tracing, "QUEUE_BYTES_PER_UID_MAX", 64 << 10)
    monkeypatch.setattr(tracing, "WRITE_TIMEOUT", 0.2)
    release = threading.Event()
    real_write_all = tracing._write_all
    hung_fds = [os.open(tmp_path / f"hung{i}", os.O_WRONLY | os.O_CREAT, 0o600) for i in range(4)]
    ok_fd = os.open(tmp_path / "ok", os.O_WRONLY | os.O_CREAT, 0o600)

    def write_all(fd, data):
        if fd in hung_fds:
            release.wait(30)
        real_write_all(fd, data)
    monkeypatch.setattr(tracing, "_write_all", write_all)
    pool = tracing.WriterPool()
    try:
        hung = [pool.open(fd, f"j{i}", "hung", 1000) for i, fd in enumerate(hung_fds)]
        block = np.zeros(64, channel.EVENT)              # 4 KiB of records a block
        for _ in range(100):
            for t in hung:
                t.write(1, block)
        assert pool.queued[1000] <= 64 << 10
        assert sum(t.status()["records_dropped"] for t in hung) >= 4 * 100 * 64 - (64 << 10) // 64
        # The user's hung files hold one writer: another user's trace is written at once.
        assert wait_for(lambda: pool.writing == {1000: 1}, timeout=5)
        ok = pool.open(ok_fd, "k", "ok", 2000)
        ok.write(2, block)
        assert wait_for(lambda: ok.status()["records_written"] == 64, timeout=5)
        time.sleep(0.3)
        pool.check_timeouts()
        problems = sorted(t.status()["problem"] for t in hung)
        assert problems == ["a write to another trace of this user took over 0.2 s"] * 3 + \
            ["a write took over 0.2 s"]
        assert ok.status()["problem"] is None
        assert 1000 not in pool.queued
        for t in hung:
            t.close()
        # the three that were not writing are closed now; the hung one once its write returns
        assert wait_for(lambda: sum(t.done() for t in hung) == 3, timeout=5)
    finally:
        release.set()
        pool.stop()


@pytest.mark.parametrize("cut", ["in a block header", "in a record", "after a whole block"])
def test_a_trace_cut_short_reads_up_to_its_last_whole_record(tmp_path, cut):
    """A full disk stops pumpd's writes anywhere (the issue's: 4,088 bytes, inside a block's
    header): what was written before reads, and `pump trace stats` says where it ends.
    Before: "truncated block header at byte 4088" and nothing readable."""
    path = tmp_path / "t.trace"
    w = trace.TraceWriter(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600), "j1", "cut")
    first = np.zeros(60, channel.EVENT)
    first["kind"] = channel.KIND["sync"]
    w.write(7, first)
    w.write(8, first)
    w.close()
    hsize, bsize = trace.ffi.sizeof(trace.HEADER), trace.ffi.sizeof(trace.BLOCK)
    block_end = hsize + bsize + 60 * channel.RECORD_SIZE
    size, whole = {"in a block header": (block_end + 8, 60), "in a record": (block_end + bsize + 130, 62),
                   "after a whole block": (block_end + bsize, 60)}[cut]
    path.write_bytes(path.read_bytes()[:size])
    header, blocks = trace.read(path)
    assert sum(len(r) for _, r in blocks) == trace.count_records(path) == whole
    ends = block_end + (bsize + 2 * channel.RECORD_SIZE if whole == 62 else 0)
    assert header["cut"] == {"at_byte": ends, "file_bytes": size}
    out = subprocess.run([sys.executable, "-m", "pump.cli", "trace", "stats", str(path)], capture_output=True,
                         text=True, timeout=30, cwd="/")
    assert out.returncode == 0, out.stderr
    assert f"records       {whole} (sync {whole})" in out.stdout
    assert f"ends          cut short: the last whole record ends at byte {ends:,} of {size:,}" in out.stdout
