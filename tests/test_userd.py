"""Jobs of one user share one pumpd (pump/userd.py) on a runtime directory no other user
could have made (pump/runtime_dir.py); clients talk only to a daemon of their own uid or
root's; a pump-run killed with SIGKILL takes its job's whole tree along (pump/reaper.py).
Two users: a forked child that drops to uid 65534, as test_daemon.py does."""

import json
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import pytest

from helpers import IDLE, PUMP_RUN, clean_env
from pump import protocol, runtime_dir, userd
from pumpd import __main__ as pumpd_main  # imported here: uid 65534 may not read the stdlib

PUMP = str(pathlib.Path(sys.executable).parent / "pump")
NOBODY = 65534
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as a second user")


def as_nobody(fn, *args):
    """fn(*args) in a forked child running as uid/gid 65534; its JSON result."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(r)
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            result = {"ok": fn(*args)}
        except BaseException as exc:  # noqa: B036 - reported to the parent
            result = {"error": f"{type(exc).__name__}: {exc}"}
        os.write(w, json.dumps(result).encode())
        os._exit(0)
    os.close(w)
    with os.fdopen(r) as f:
        data = f.read()
    os.waitpid(pid, 0)
    return json.loads(data)


@pytest.fixture
def shared_dir():
    """A short, world-writable directory (sun_path holds 108 bytes; uid 65534 writes here)."""
    path = tempfile.mkdtemp(prefix="pu-")
    os.chmod(path, 0o1777)
    yield pathlib.Path(path)
    shutil.rmtree(path, ignore_errors=True)


def gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"  # dead, not yet reaped
    except FileNotFoundError:
        return True


def wait_until(check, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.05)
    return check()


# ---- the runtime directory ----
def test_private_xdg_runtime_dir_holds_the_daemon(monkeypatch, shared_dir):
    xdg = shared_dir / "xdg"
    xdg.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(xdg))
    path = runtime_dir.user_runtime_dir()
    assert path == str(xdg / "pump" / runtime_dir.scope())
    boot = pathlib.Path("/proc/sys/kernel/random/boot_id").read_text()[:8]
    assert runtime_dir.scope() == f"{boot}-{os.stat('/proc/self/ns/pid').st_ino}"
    for d in (xdg / "pump", pathlib.Path(path)):
        assert os.stat(d).st_mode & 0o7777 == 0o700


def test_an_open_xdg_runtime_dir_falls_back_to_a_checked_tmp(monkeypatch, shared_dir):
    xdg = shared_dir / "xdg"
    xdg.mkdir(mode=0o755)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(xdg))
    monkeypatch.setattr(tempfile, "tempdir", str(shared_dir))
    assert runtime_dir.user_runtime_dir().startswith(f"{shared_dir}/pump-{os.geteuid()}/")
    assert not (xdg / "pump").exists()


def test_an_xdg_runtime_dir_too_deep_for_a_socket_falls_back_to_a_checked_tmp(monkeypatch, shared_dir):
    """The socket's path under it would pass sun_path's 108 bytes: pumpd could not bind it (a
    Slurm test's runtime directory under pytest -n 2's deeper temporary directories did)."""
    xdg = shared_dir / ("x" * (runtime_dir.SOCKET_PATH_MAX - len(str(shared_dir)) - 20))
    xdg.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(xdg))
    monkeypatch.setattr(tempfile, "tempdir", str(shared_dir))
    deep = os.path.join(xdg, "pump", runtime_dir.scope(), runtime_dir.SOCKET_NAME)
    assert len(deep) > runtime_dir.SOCKET_PATH_MAX
    assert runtime_dir.user_socket().startswith(f"{shared_dir}/pump-{os.geteuid()}/")
    assert not (xdg / "pump").exists()
    short = shared_dir / "xdg"
    short.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(short))
    assert runtime_dir.user_socket() == str(short / "pump" / runtime_dir.scope() / "pumpd.sock")


def _default_socket_of_pumpd(tmpdir):
    os.environ.pop("XDG_RUNTIME_DIR", None)
    os.environ.pop("PUMP_SOCKET", None)
    os.environ["TMPDIR"] = tmpdir
    tempfile.tempdir = None
    return pumpd_main.default_socket()


@needs_root
def test_tmp_dir_another_user_made_is_refused(shared_dir):
    """Before: pumpd of uid 65534 took /tmp/pump-65534 made 0777 by another user (here root)."""
    planted = shared_dir / f"pump-{NOBODY}"
    planted.mkdir()
    os.chmod(planted, 0o777)
    out = as_nobody(_default_socket_of_pumpd, str(shared_dir))
    assert out == {"error": f"RuntimeDirError: refusing {planted}: it belongs to uid 0, not {NOBODY}, "
                            f"its mode is 0777, not 0700 (remove it, or set XDG_RUNTIME_DIR to a "
                            f"directory of yours with mode 0700)"}
    assert list(planted.iterdir()) == []


def test_symlink_and_loose_mode_are_refused(monkeypatch, shared_dir):
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    monkeypatch.setattr(tempfile, "tempdir", str(shared_dir))
    target = shared_dir / "target"
    target.mkdir(mode=0o700)
    link = shared_dir / f"pump-{os.geteuid()}"
    link.symlink_to(target)
    with pytest.raises(runtime_dir.RuntimeDirError, match="it is a symbolic link"):
        runtime_dir.user_runtime_dir()
    link.unlink()
    link.mkdir(mode=0o700)
    os.chmod(link, 0o755)
    with pytest.raises(runtime_dir.RuntimeDirError, match="its mode is 0755, not 0700"):
        runtime_dir.user_runtime_dir()


def test_status_says_why_it_did_not_ask_the_shared_pumpd(monkeypatch, shared_dir, capsys):
    """Before: pump status passed over a directory it refused without a word (pump-run said why)."""
    from pump import status
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    monkeypatch.setattr(tempfile, "tempdir", str(shared_dir))
    status.daemon_sockets()
    assert capsys.readouterr().err == ""            # none made yet: nothing to say
    loose = shared_dir / f"pump-{os.geteuid()}"
    loose.mkdir(mode=0o700)
    os.chmod(loose, 0o755)
    paths = status.daemon_sockets()
    assert not any(p.startswith(str(loose)) for p in paths)
    assert capsys.readouterr().err == (f"pump: status: not asking your shared pumpd: refusing {loose}: its mode is "
                                       "0755, not 0700 (remove it, or set XDG_RUNTIME_DIR to a directory of yours "
                                       "with mode 0700)\n")


# ---- a daemon of another uid ----
class ForeignDaemon:
    """A listener run by uid 65534 that counts the bytes each connection sends it."""

    def __init__(self, directory):
        self.path = str(directory / "pumpd.sock")
        ready_r, ready_w = os.pipe()
        self.counts_r, counts_w = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:
            try:
                os.setgroups([])
                os.setgid(NOBODY)
                os.setuid(NOBODY)
                listener = socket.socket(socket.AF_UNIX)
                listener.bind(self.path)
                listener.listen(16)
                os.write(ready_w, b"1")
                while True:
                    conn, _ = listener.accept()
                    conn.settimeout(1.0)
                    got = 0
                    try:
                        while chunk := conn.recv(4096):
                            got += len(chunk)
                    except OSError:
                        pass
                    conn.close()
                    os.write(counts_w, f"{got}\n".encode())
            finally:
                os._exit(0)
        os.close(ready_w)
        os.close(counts_w)
        assert os.read(ready_r, 1) == b"1"
        os.close(ready_r)

    def close(self) -> list:
        """Stop it; the bytes each connection sent."""
        time.sleep(1.2)  # the last connection's count
        os.kill(self.pid, signal.SIGKILL)
        os.waitpid(self.pid, 0)
        with os.fdopen(self.counts_r) as f:
            return [int(n) for n in f.read().split()]


@needs_root
def test_clients_refuse_a_daemon_of_another_uid(shared_dir, run_program):
    """Before: pump status asked it (it then sent a request), pump-run registered the job
    there, and the shim sent its attach request."""
    fake = ForeignDaemon(shared_dir)
    try:
        env = dict(clean_env("XDG_RUNTIME_DIR"), PUMP_SOCKET=fake.path, TMPDIR=str(shared_dir))
        status = subprocess.run([PUMP, "status", "--json"], env=env, capture_output=True, text=True, timeout=60)
        refusal = f"refusing the daemon on {fake.path}: it runs as uid {NOBODY}"
        assert status.stderr.startswith(f"pump: {refusal}") and json.loads(status.stdout)["daemons"] == []
        system = subprocess.run([PUMP_RUN, "--daemon", "system", "true"], env=env, capture_output=True,
                                text=True, timeout=60)
        assert (system.returncode, system.stderr.startswith(f"pump-run: {refusal}")) == (2, True), system.stderr
        shim = run_program("touch_linked", env={"PUMP_SOCKET": fake.path, "PUMP_LOG": "1"})
        assert shim.result["checksum"] and shim.proc.returncode == 0
        lines = [line for line in shim.proc.stderr.splitlines() if f"runs as uid {NOBODY}" in line]
        assert len(lines) == 1 and "not attaching" in lines[0]
    finally:
        counts = fake.close()
    assert counts and set(counts) == {0}  # connected, checked, sent nothing


# ---- one shared daemon for the jobs of one user ----
JOB = """
import os, pathlib, sys, time
d = pathlib.Path(sys.argv[1])
# Written whole, then renamed: the test reads it as soon as it exists.
(d / (sys.argv[2] + ".part")).write_text(os.environ["PUMP_SOCKET"] + " " + os.environ["PUMP_JOB"])
os.replace(d / (sys.argv[2] + ".part"), d / (sys.argv[2] + ".env"))
while not (d / (sys.argv[2] + ".go")).exists():
    time.sleep(0.05)
if len(sys.argv) > 3:
    import subprocess
    subprocess.run(sys.argv[3:], check=True)
print("done", sys.argv[2])
"""


@pytest.fixture
def user_env(shared_dir):
    xdg = shared_dir / "xdg"
    xdg.mkdir(mode=0o700)
    return dict(clean_env(), XDG_RUNTIME_DIR=str(xdg), PUMP_SOCKET=str(shared_dir / "no-service.sock"),
                **{userd.GRACE_ENV: "1"})


_started = []  # the pump-runs a test started, killed if it fails before they end


@pytest.fixture(autouse=True)
def _kill_leftover_jobs():
    yield
    while _started:
        job = _started.pop()
        if job.poll() is None:
            job.kill()  # SIGKILL: the watchdog ends its tree (pump/reaper.py)
            job.wait()


def start_job(name, directory, env, *then):
    _started.append(subprocess.Popen([PUMP_RUN, "--", sys.executable, "-c", JOB, str(directory), name, *then],
                                     env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     start_new_session=True))
    return _started[-1]


def job_env(directory, name):
    path = directory / (name + ".env")
    assert wait_until(path.exists, 60), f"job {name} did not start"
    return path.read_text().split()


def test_two_jobs_share_one_daemon_that_outlives_the_first(shared_dir, user_env):
    """Before: each job had an embedded pumpd of its own (two sockets, two pump status
    daemons), and the first one's went with it."""
    first = start_job("a", shared_dir, user_env)  # at once: both start a pumpd, one wins
    second = start_job("b", shared_dir, user_env)
    sock_a, job_a = job_env(shared_dir, "a")
    sock_b, job_b = job_env(shared_dir, "b")
    assert sock_a == sock_b == os.path.join(user_env["XDG_RUNTIME_DIR"], "pump", runtime_dir.scope(),
                                            "pumpd.sock")
    daemon_pid = protocol.ping(sock_a)["pid"]
    status = json.loads(subprocess.run([PUMP, "status", "--json"], env=user_env, capture_output=True,
                                       text=True, timeout=60).stdout)
    # (other embedded pumpds of this user, from other tests, may answer too)
    assert sock_a in status["daemons"]
    assert {j["job"] for j in status["jobs"] if j["daemon"] == sock_a} == {job_a, job_b}
    # The terminal hangs up and Ctrl-C goes to the first job's process group.
    os.killpg(first.pid, signal.SIGHUP)
    os.killpg(first.pid, signal.SIGINT)
    assert first.wait(30) != 0
    assert protocol.ping(sock_a)["pid"] == daemon_pid
    assert wait_until(lambda: [j["job"] for j in protocol.Client(sock_a).request({"op": "status"})["jobs"]]
                      == [job_b])
    (shared_dir / "b.go").touch()
    out, err = second.communicate(timeout=60)
    assert (second.returncode, out, err) == (0, "done b\n", IDLE)
    assert wait_until(lambda: gone(daemon_pid), 10)  # the grace period (1 s) after the last job
    assert not os.path.exists(sock_a)


def test_a_job_runs_on_alone_when_the_shared_daemon_dies(shared_dir, user_env, c_build, run_program):
    """A batch system that ends the first job's cgroup takes the daemon along: the jobs
    left run their CUDA work correctly, the shim prefetching alone."""
    bare = run_program("touch_linked", pump=False).result
    env = dict(user_env, LD_LIBRARY_PATH=str(c_build / "plain"))
    job = start_job("b", shared_dir, env, str(c_build / "plain" / "touch_linked"))
    sock, job_b = job_env(shared_dir, "b")
    daemon_pid = protocol.ping(sock)["pid"]
    os.kill(daemon_pid, signal.SIGKILL)
    assert wait_until(lambda: gone(daemon_pid))
    # The next job starts a successor, which picks up the job left running.
    later = start_job("c", shared_dir, env)
    assert job_env(shared_dir, "c")[0] == sock and protocol.ping(sock)["pid"] != daemon_pid
    with protocol.Client(sock) as client:
        assert job_b in [j["job"] for j in client.request({"op": "status"})["jobs"]]
    (shared_dir / "c.go").touch()
    assert later.wait(60) == 0
    (shared_dir / "b.go").touch()
    out, err = job.communicate(timeout=120)
    assert job.returncode == 0, err
    result = [json.loads(line) for line in out.splitlines() if line.startswith("{")][-1]
    assert result["checksum"] == bare["checksum"]
    assert err.startswith("pump:") and len(err.splitlines()) == 1  # the summary line, nothing else


def test_race_of_two_starts_elects_one_daemon(shared_dir):
    directory = shared_dir / "run"
    directory.mkdir(mode=0o700)
    path = str(directory / "pumpd.sock")
    argv = [sys.executable, "-m", "pumpd", "--socket", path, "--shared", "--idle-exit", "1", "-v"]
    both = [subprocess.Popen(argv, env=clean_env(), cwd="/", stderr=subprocess.PIPE, text=True)
            for _ in range(2)]
    assert wait_until(lambda: protocol.ping(path) is not None, 30)
    winner = protocol.ping(path)["pid"]
    results = {p.pid: (p.wait(30), p.stderr.read()) for p in both}
    assert set(results) == {winner, *results} and all(rc == 0 for rc, _ in results.values())
    loser = [err for pid, (_, err) in results.items() if pid != winner][0]
    assert "another pumpd of this user serves" in loser and "listening" not in loser
    assert "no job for 1 s: stopping (shared pumpd)" in results[winner][1]


def test_stale_socket_and_lock_are_cleared(monkeypatch, shared_dir):
    xdg = shared_dir / "xdg"
    xdg.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(xdg))
    monkeypatch.setenv(userd.GRACE_ENV, "1")
    directory = pathlib.Path(runtime_dir.user_runtime_dir())
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(directory / "pumpd.sock"))  # a pumpd that died: its socket stays, nobody listens
    stale.close()
    (directory / userd.LOCK_NAME).write_text("")
    path = userd.shared_socket()
    assert path == str(directory / "pumpd.sock") and protocol.ping(path) is not None
    pid = protocol.ping(path)["pid"]
    assert wait_until(lambda: gone(pid), 10)


# ---- a pump-run killed with SIGKILL ----
TREE = """
import os, subprocess, sys, time
grandchild = subprocess.Popen(["sleep", "120"])
open(sys.argv[1], "w").write(f"{os.getpid()} {grandchild.pid}")
time.sleep(120)
"""


@pytest.mark.parametrize("mode", ["none", "auto"])
def test_sigkill_of_pump_run_ends_the_whole_tree(shared_dir, user_env, mode):
    """Before: the child and the grandchild ran on for 120 s, orphaned."""
    pids_file = shared_dir / "pids"
    run = subprocess.Popen([PUMP_RUN, "--daemon", mode, "--", sys.executable, "-c", TREE, str(pids_file)],
                           env=user_env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    assert wait_until(lambda: pids_file.exists() and len(pids_file.read_text().split()) == 2, 60)
    child, grandchild = map(int, pids_file.read_text().split())
    run.kill()
    run.wait()
    assert wait_until(lambda: gone(child) and gone(grandchild), 5), (gone(child), gone(grandchild))


def test_the_parent_death_signal_is_set_in_the_child(shared_dir):
    out = subprocess.run([PUMP_RUN, "--daemon", "none", "--", "grep", "-c", "", "/proc/self/status"],
                         env=clean_env(), capture_output=True, text=True, timeout=60)
    assert out.returncode == 0
    probe = ("import ctypes, signal; libc = ctypes.CDLL(None); v = ctypes.c_int(); "
             "libc.prctl(2, ctypes.byref(v), 0, 0, 0); print(v.value)")  # PR_GET_PDEATHSIG
    got = subprocess.run([PUMP_RUN, "--daemon", "none", "--", sys.executable, "-c", probe], env=clean_env(),
                         capture_output=True, text=True, timeout=60)
    assert got.stdout.strip() == str(int(signal.SIGKILL))


def test_a_daemon_of_another_protocol_version_is_refused_by_name(shared_dir):
    """Before: "unsupported protocol version 2; this pumpd speaks 1", as if the client were pumpd."""
    path = str(shared_dir / "pumpd.sock")
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(path)
    listener.listen(4)

    def answer():  # a future pumpd: its error reply in its own version's framing
        conn, _ = listener.accept()
        conn.recv(4096)
        payload = b'{"error":"unsupported protocol version"}'
        conn.sendall(protocol.HEADER.pack(protocol.MAGIC, protocol.VERSION + 1, protocol.ERROR,
                                          len(payload), 0) + payload)
        conn.close()

    import threading
    thread = threading.Thread(target=answer)
    thread.start()
    try:
        with pytest.raises(protocol.PeerError) as refused, protocol.Client(path) as client:
            client.request({"op": "ping"})
    finally:
        thread.join(10)
        listener.close()
    assert str(refused.value) == (f"the pumpd on {path} speaks protocol version {protocol.VERSION + 1}; this "
                                  f"pump speaks {protocol.VERSION} (stop that pumpd, or run the pump it came with)")
