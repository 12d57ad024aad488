"""pumpd run the way pumpd.socket and pumpd.service run it: systemd (here, the test,
as root) binds the socket and passes it; pumpd runs as another user, keeps its state
in $RUNTIME_DIRECTORY, says READY=1 and feeds the watchdog from its event loop; it
refuses to run as root under systemd.  Clients accept it because root listened."""

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

from fakeshim import FakeShim
from helpers import clean_env, stop_pumpd
from pump import protocol
from pumpd.systemd import watchdog_interval
from test_daemon import NOBODY, run_as_nobody, wait_for

WATCHDOG_USEC = 200_000   # pings every 0.1 s


def nobody_can_run_python() -> bool:
    r = subprocess.run(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
                        sys.executable, "-c", "import pumpd"], capture_output=True, cwd="/")
    return r.returncode == 0


class Service:
    """The socket bound by "systemd" (this test), pumpd started on it with the variables
    systemd sets, its notifications read from a datagram socket."""

    def __init__(self, as_nobody: bool):
        self.dir = pathlib.Path(tempfile.mkdtemp(prefix="pump-service-"))
        os.chmod(self.dir, 0o755)
        self.path = str(self.dir / "pumpd.sock")
        self.state = self.dir / "state"        # RuntimeDirectory=, the service user's
        self.state.mkdir(mode=0o700)
        self.notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.notify.bind(str(self.dir / "notify"))
        os.chmod(self.dir / "notify", 0o666)
        self.notify.settimeout(10)
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(self.path)
        os.chmod(self.path, 0o666)
        self.listener.listen()
        drop = []
        if as_nobody:
            os.chown(self.state, NOBODY, NOBODY)
            drop = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
        env = dict(clean_env(), RUNTIME_DIRECTORY=str(self.state), NOTIFY_SOCKET=str(self.dir / "notify"),
                   WATCHDOG_USEC=str(WATCHDOG_USEC), LISTEN_FDS="1", LISTEN_FDNAMES="pumpd.socket")
        if as_nobody:
            env["INVOCATION_ID"] = "0123456789abcdef0123456789abcdef"
        fd = self.listener.fileno()
        # As systemd does: the socket at fd 3, LISTEN_PID the pid that will be pumpd's.
        shell = f'exec 3<&{fd} {fd}<&-; export LISTEN_PID=$$; exec "$@"'
        self.proc = subprocess.Popen(["bash", "-c", shell, "bash", *drop, sys.executable, "-m", "pumpd",
                                      "--foreground"], pass_fds=[fd], env=env, cwd="/",
                                     stderr=subprocess.PIPE, text=True)
        self.listener.close()   # pumpd holds it now, as systemd would keep its own copy

    def notifications(self, until: str, timeout: float = 10) -> list:
        got, deadline = [], time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.notify.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                got.append(self.notify.recv(4096).decode())
            except socket.timeout:
                break
            if until in got[-1]:
                return got
        raise AssertionError(f"no {until!r} from pumpd within {timeout} s; got {got}; "
                             f"pumpd: {self.proc.poll()} {self.proc.stderr.read() if self.proc.poll() is not None else ''}")

    def close(self):
        stop_pumpd(self.proc)
        self.proc.stderr.close()
        self.notify.close()
        shutil.rmtree(self.dir)


@pytest.fixture
def service():
    if os.geteuid() != 0:
        pytest.skip("needs root to bind the socket as systemd does and run pumpd as another user")
    if not shutil.which("setpriv"):
        pytest.skip("no setpriv (util-linux) to run pumpd as another user")
    if not nobody_can_run_python():
        pytest.skip(f"uid {NOBODY} cannot run {sys.executable} (a private directory above it)")
    s = Service(as_nobody=True)
    yield s
    s.close()


def test_the_service_as_shipped(service):
    assert "READY=1" in service.notifications(until="READY=1")[-1]
    # Root listened: root and another user both accept the daemon and are served.
    assert protocol.ping(service.path, timeout=2) is not None
    assert run_as_nobody(lambda: protocol.ping(service.path, timeout=2) is not None)
    job = FakeShim(service.path, name="served")
    try:
        with protocol.Client(service.path) as c:
            jobs = c.request({"op": "status"})["jobs"]
        assert [j["name"] for j in jobs] == ["served"]
        assert (service.state / "jobs").is_dir()
        assert (service.state / "jobs").stat().st_uid == NOBODY
        assert pumpd_uid(service.proc.pid) == NOBODY
    finally:
        job.close()


def test_the_watchdog_is_fed_from_the_event_loop(service):
    service.notifications(until="READY=1")
    start = time.monotonic()
    pings = sum("WATCHDOG=1" in service.notifications(until="WATCHDOG=1") for _ in range(5))
    assert pings == 5 and time.monotonic() - start < 5
    # A stopped pumpd (as a frozen loop would) sends none: systemd would restart it.
    os.kill(service.proc.pid, signal.SIGSTOP)
    try:
        time.sleep(0.2)
        while True:   # drain what was sent before the stop
            service.notify.settimeout(0.05)
            try:
                service.notify.recv(4096)
            except socket.timeout:
                break
        with pytest.raises(AssertionError, match="no 'WATCHDOG=1'"):
            service.notifications(until="WATCHDOG=1", timeout=4 * WATCHDOG_USEC / 1e6)
    finally:
        os.kill(service.proc.pid, signal.SIGCONT)
    assert "WATCHDOG=1" in service.notifications(until="WATCHDOG=1")[-1]


def pumpd_uid(pid: int) -> int:
    import psutil
    return psutil.Process(pid).uids().effective


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root")
def test_refuses_to_run_as_root_under_systemd(tmp_path):
    env = dict(clean_env(), INVOCATION_ID="0123456789abcdef0123456789abcdef", RUNTIME_DIRECTORY=str(tmp_path))
    r = subprocess.run([sys.executable, "-m", "pumpd", "--foreground", "--socket", str(tmp_path / "s.sock")],
                       env=env, cwd="/", capture_output=True, text=True, timeout=30)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        "pumpd: refusing to run as root under systemd: set User= in the unit "
        "(scripts/pumpd.service runs as the user pump, on a socket systemd opens)"]
    assert not (tmp_path / "s.sock").exists() and not (tmp_path / "jobs").exists()


@pytest.mark.parametrize("usec, pid, want", [
    ("30000000", None, 15.0), ("30000000", "self", 15.0), ("200000", None, 0.1),
    ("30000000", "1", None), ("0", None, None), ("", None, None), ("12x", None, None),
    (None, None, None), ("30000000", "x", None),
])
def test_watchdog_interval(monkeypatch, usec, pid, want):
    for var, value in (("WATCHDOG_USEC", usec), ("WATCHDOG_PID", str(os.getpid()) if pid == "self" else pid)):
        if value is None:
            monkeypatch.delenv(var, raising=False)
        else:
            monkeypatch.setenv(var, value)
    assert watchdog_interval() == want
    assert "WATCHDOG_USEC" not in os.environ and "WATCHDOG_PID" not in os.environ
