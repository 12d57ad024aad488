"""Administration apart from use (issue 29, finding 7): on the socket jobs use, uid 0 is
a user like any other (a container's root is uid 0 too): it sees and steers only its own
jobs, within the per-user caps.  Only root on the administrator's socket (0600, in a 0700
directory) sees, steers and ends every job."""

import os
import pathlib
import shutil
import stat
import tempfile

import pytest

from helpers import clean_env, start_pumpd, stop_pumpd
from pump import protocol
from test_daemon import NOBODY, run_as_nobody
from test_daemon_limits import idle_connections

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as a second user")


@pytest.fixture
def service():
    """A pumpd as the system service runs it: the 0666 socket, and the administrator's."""
    run_dir = pathlib.Path(tempfile.mkdtemp(prefix="pump-test-"))
    os.chmod(run_dir, 0o755)
    path, admin = str(run_dir / "pumpd.sock"), str(run_dir / "admin" / "pumpd.sock")
    proc = start_pumpd(path, "--admin-socket", admin, env=dict(clean_env(), RUNTIME_DIRECTORY=str(run_dir)))
    yield path, admin
    stop_pumpd(proc)
    shutil.rmtree(run_dir)


def ask(path, doc):
    with protocol.Client(path) as c:
        try:
            return c.request(doc)
        except protocol.ProtocolError as exc:
            return str(exc)


def register_own(path):
    return ask(path, {"op": "register", "name": "users"})["job"]


def test_the_administrators_socket_is_roots_alone(service):
    _, admin = service
    assert stat.S_IMODE(os.stat(admin).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(os.path.dirname(admin)).st_mode) == 0o700
    assert os.stat(admin).st_uid == os.geteuid()


@needs_root
def test_root_on_the_socket_jobs_use_administers_nothing(service):
    path, admin = service
    theirs = run_as_nobody(register_own, path)
    mine = register_own(path)
    # Before: a root client (a pod's root) saw the other user's job, set it to 1 byte, ended it.
    assert [j["job"] for j in ask(path, {"op": "status"})["jobs"]] == [mine]
    for op in ({"op": "set", "job": theirs, "budget": 1}, {"op": "end", "job": theirs}):
        assert ask(path, op) == f"no job {theirs} of this user"
    # ... and is held to the per-user caps like anyone
    from pumpd import limits
    told = idle_connections(path, limits.INCOMPLETE_PER_UID_MAX + 1)
    assert "uid 0 has 32 connections without a complete first message" in told, told
    # The administrator's socket: every job, steered and ended.
    assert {j["job"] for j in ask(admin, {"op": "status"})["jobs"]} == {mine, theirs}
    assert ask(admin, {"op": "set", "job": theirs, "budget": 1 << 20})["ok"]
    jobs = {j["job"]: j for j in ask(admin, {"op": "status"})["jobs"]}
    assert (jobs[theirs]["budget_bytes"], jobs[theirs]["budget_source"]) == (1 << 20, "set")
    assert ask(admin, {"op": "end", "job": theirs})["ok"]


def steer_through(admin, job):
    return ask(admin, {"op": "status"}), ask(admin, {"op": "set", "job": job, "budget": 1})


@needs_root
def test_only_uid_0_administers_on_the_administrators_socket(service):
    """Were the socket reachable (a mistake in a mount or its mode), another uid there is
    still a user."""
    path, admin = service
    mine = register_own(path)
    os.chmod(os.path.dirname(admin), 0o755)
    os.chmod(admin, 0o666)
    seen, steered = run_as_nobody(steer_through, admin, mine)
    assert seen["jobs"] == [] and steered == f"no job {mine} of this user"


# ---- pods that share a uid do not share jobs ----
POD = """
import json, os, sys
sys.path.insert(0, sys.argv[1])
with open(sys.argv[2] + "/cgroup.procs", "w") as f:
    f.write("0")  # this process: its own cgroup, as a container's
from pump import protocol
for line in sys.stdin:  # one request a line, one reply a line, until EOF
    with protocol.Client(sys.argv[3]) as c:
        try:
            print(json.dumps(c.request(json.loads(line))), flush=True)
        except protocol.ProtocolError as exc:
            print(json.dumps(str(exc)), flush=True)
"""


class Pod:
    """Root in a new pid namespace and a cgroup of its own, as in a pod."""

    def __init__(self, cgroup, path):
        import subprocess
        import sys
        cgroup.mkdir()
        self.cgroup = cgroup
        self.proc = subprocess.Popen(["unshare", "--pid", "--fork", sys.executable, "-c", POD,
                                      str(pathlib.Path(__file__).parents[1]), str(cgroup), path],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def ask(self, op):
        import json
        self.proc.stdin.write(json.dumps(op) + "\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(30)
        self.cgroup.rmdir()


@needs_root
def test_pods_that_share_a_uid_do_not_share_jobs(service):
    path, admin = service
    # a cgroup v1 cpu hierarchy, else the cgroup v2 tree
    base = next((b for b in map(pathlib.Path, ("/sys/fs/cgroup/cpu", "/sys/fs/cgroup"))
                 if (b / "cgroup.procs").exists()), None)
    if not shutil.which("unshare") or base is None:
        pytest.skip("needs unshare and a cgroup hierarchy to make pods")
    a = Pod(base / f"pump-test-pod-{os.getpid()}-a", path)
    b = Pod(base / f"pump-test-pod-{os.getpid()}-b", path)
    try:
        job = a.ask({"op": "register", "name": "in-a"})["job"]
        assert b.ask({"op": "status"})["jobs"] == []
        assert b.ask({"op": "set", "job": job, "budget": 1}) == f"no job {job} of this user"
        assert b.ask({"op": "end", "job": job}) == f"no job {job} of this user"
        assert [j["job"] for j in a.ask({"op": "status"})["jobs"]] == [job]
        assert ask(path, {"op": "status"})["jobs"] == []  # root on the host is another realm
        assert [j["job"] for j in ask(admin, {"op": "status"})["jobs"]] == [job]
    finally:
        a.close()
        b.close()


def test_pump_status_as_root_asks_the_administrators_socket(tmp_path, monkeypatch):
    from pump import admin, status as status_cli
    where = tmp_path / "pumpd.sock"
    where.touch()
    monkeypatch.setattr(admin, "ADMIN_SOCKET", str(where))
    monkeypatch.delenv(protocol.SOCKET_ENV, raising=False)
    first = status_cli.daemon_sockets()[0]
    assert first == (str(where) if os.geteuid() == 0 else protocol.SYSTEM_SOCKET)
    monkeypatch.setenv(protocol.SOCKET_ENV, str(tmp_path / "chosen.sock"))  # a socket asked for stands
    assert status_cli.daemon_sockets()[0] == str(tmp_path / "chosen.sock")
