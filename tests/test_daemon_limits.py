"""pumpd under a hostile local user (issue 18): job ids never become paths, a state
directory pumpd does not own is refused, running out of descriptors does not stop it
accepting, every user's resources are capped (root keeps a reserve), status pages,
terms are held to what jobs.d allows, a pid is tied to its process, names are
escaped, and bad requests and config files get one clear line."""

import asyncio
import os
import pathlib
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import pytest

from fakeshim import raw_connect
from helpers import PUMP_RUN, clean_env, start_pumpd, stop_pumpd
from pump import channel, protocol
from test_daemon import NOBODY, frame, run_as_nobody, send_raw, status, wait_for

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as a second user")


@pytest.fixture
def pumpd(tmp_path):
    path = tmp_path / "pumpd.sock"
    proc = start_pumpd(path, stderr=subprocess.PIPE, text=True)
    yield str(path), proc
    stop_pumpd(proc)


@pytest.fixture
def service():
    """A pumpd as the system service runs it (socket 0666) in a directory nobody can reach."""
    run_dir = pathlib.Path(tempfile.mkdtemp(prefix="pump-test-"))
    os.chmod(run_dir, 0o755)
    path = str(run_dir / "pumpd.sock")
    proc = start_pumpd(path, env=dict(clean_env(), RUNTIME_DIRECTORY=str(run_dir)))
    yield path
    stop_pumpd(proc)
    shutil.rmtree(run_dir)


def request(path, doc):
    """The reply to one request, or the daemon's error text."""
    with protocol.Client(path) as c:
        try:
            return c.request(doc)
        except protocol.ProtocolError as exc:
            return str(exc)


# ---- job ids never become paths ----
def attach_as(path, job):
    return request(path, {"op": "attach", "job": job, "name": "x", "policy": "launch"})


@needs_root
def test_a_job_id_from_another_user_never_touches_a_file(service):
    where = pathlib.Path(tempfile.mkdtemp(dir="/tmp", prefix="p"))  # short: a job id was <= 31
    try:
        precious = where / "precious.json"
        precious.write_text("root's")
        os.chmod(precious, 0o600)
        for job in (str(where / "precious"), "../../" + str(where / "precious")[1:], "jnotyours"):
            reply = run_as_nobody(attach_as, service, job)
            assert "job id" in reply or reply == f"no job {job} of this user", reply
        time.sleep(1.5)  # the liveness sweep, which removed the file of a job gone
        assert precious.read_text() == "root's"
        assert protocol.ping(service)
    finally:
        shutil.rmtree(where)


def test_attach_to_a_job_pumpd_does_not_know_is_refused(pumpd):
    path, _ = pumpd
    assert attach_as(path, "jmadeup") == "no job jmadeup of this user"
    assert "must be a job id" in attach_as(path, "a/b")
    assert status(path) == []


@pytest.mark.parametrize("make,expected", [
    (lambda d: (d / "jobs").mkdir(mode=0o777) or os.chmod(d / "jobs", 0o777), "group or others can write it"),
    (lambda d: (d / "elsewhere").mkdir() or (d / "jobs").symlink_to(d / "elsewhere"), "not following symlinks"),
    (lambda d: (d / "jobs").mkdir() or os.chown(d / "jobs", NOBODY, NOBODY), "belongs to uid 65534"),
])
def test_a_state_directory_pumpd_cannot_trust_is_refused(tmp_path, make, expected):
    if "belongs" in expected and os.geteuid() != 0:
        pytest.skip("needs root to give a directory away")
    make(tmp_path)
    run = subprocess.run([sys.executable, "-m", "pumpd", "--socket", str(tmp_path / "pumpd.sock")],
                         env=clean_env(), cwd="/", capture_output=True, text=True, timeout=30)
    assert run.returncode == 1 and expected in run.stderr, run.stderr
    assert "Traceback" not in run.stderr


# ---- descriptors ----
def connect_many(path, n):
    """Up to n connections, each retried while the listen backlog is full."""
    held = []
    for _ in range(n):
        for _ in range(100):
            try:
                held.append(raw_connect(path))
                break
            except BlockingIOError:
                time.sleep(0.01)
    return held


def test_out_of_descriptors_pumpd_accepts_again(tmp_path):
    path, admin = str(tmp_path / "pumpd.sock"), str(tmp_path / "admin" / "pumpd.sock")

    def low_limit():
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))

    proc = start_pumpd(path, "--admin-socket", admin, preexec_fn=low_limit)
    try:
        # Far past what pumpd can hold, on the administrator's socket (held to no per-user
        # cap); on the main one a user meets its cap of incomplete connections first.
        held = connect_many(admin if os.geteuid() == 0 else path, 150)
        time.sleep(0.5)
        told = b""
        for s in held:
            s.setblocking(False)
            try:
                told += s.recv(4096)
            except OSError:
                pass
        assert b"pumpd is out of file descriptors; try again later" in told  # refused, not hung
        for s in held:
            s.close()
        assert wait_for(lambda: protocol.ping(path, timeout=0.5), timeout=5)  # accepting again
        for _ in range(3):  # and again after each exhaustion
            for s in connect_many(path, 100):
                s.close()
            assert wait_for(lambda: protocol.ping(path, timeout=0.5), timeout=5)
        assert proc.poll() is None
    finally:
        stop_pumpd(proc)


# ---- per-uid caps ----
def idle_connections(path, n):
    """Open n connections that send nothing; what the last one is told."""
    socks = [raw_connect(path) for _ in range(n)]
    socks[-1].settimeout(2)
    try:
        data = socks[-1].recv(4096)
    except socket.timeout:
        data = b""
    for s in socks:
        s.close()
    return data[protocol.HEADER.size:].decode(errors="replace")


@needs_root
def test_incomplete_connections_are_capped_per_user(service):
    from pumpd import limits
    told = run_as_nobody(idle_connections, service, limits.INCOMPLETE_PER_UID_MAX + 1)
    assert "too many connections: uid 65534 has 32 connections without a complete first message" in told, told
    assert protocol.ping(service)


def register_many(path, n):
    replies = []
    with protocol.Client(path) as c:
        for i in range(n):
            try:
                replies.append(c.request({"op": "register", "name": f"j{i}"})["job"])
            except protocol.ProtocolError as exc:
                replies.append(str(exc))
    return replies


@needs_root
def test_jobs_are_capped_per_user_and_root_still_registers(service):
    from pumpd import limits
    replies = run_as_nobody(register_many, service, limits.JOBS_PER_UID_MAX + 1)
    assert all(r.startswith("j") for r in replies[:-1])
    assert replies[-1] == f"too many jobs: uid {NOBODY} has {limits.JOBS_PER_UID_MAX}, the most allowed per user"
    assert register_many(service, 1)[0].startswith("j")  # root is not held by a user's cap


def test_over_cap_keeps_a_reserve_for_the_administrator_only():
    from pumpd import limits
    full = limits.CONNECTIONS_MAX - limits.ROOT_RESERVE
    assert limits.over_cap(1000, 0, 10, full, limits.CONNECTIONS_MAX).endswith("(the rest is the administrator's)")
    assert limits.over_cap(0, 500, 10, full, limits.CONNECTIONS_MAX, admin=True) == ""
    assert limits.over_cap(0, 0, 10, limits.CONNECTIONS_MAX, limits.CONNECTIONS_MAX, admin=True)
    # uid 0 on the socket jobs use (a container's root) is a user like any other
    assert limits.over_cap(0, 10, 10, 0, limits.CONNECTIONS_MAX) == "uid 0 has 10, the most allowed per user"
    assert limits.over_cap(0, 0, 10, full, limits.CONNECTIONS_MAX)


def test_function_and_allocation_tables_are_capped_per_user():
    from pumpd import limits
    from pumpd.jobs import Session
    tallies = {"functions": limits.Tally("functions", 10), "allocations": limits.Tally("allocations", 10)}
    ring, plan = channel.Ring.create(1, "jx", 1024), channel.Plan.create()
    sessions = [Session(i, os.getpid(), 0.0, ring, plan, limits.Quota(7, tallies)) for i in range(2)]
    for s in sessions:
        s.ingest(channel.Batch(functions={f: "k" for f in range(8)}, allocs=[(b, 4096) for b in range(8)]))
    assert [len(s.functions) for s in sessions] == [8, 2]
    assert [len(s.allocations) for s in sessions] == [8, 2]
    assert sessions[1].quota.dropped == {"functions": 6, "allocations": 6}
    sessions[0].ingest(channel.Batch(frees=[(0, 4096)]))  # a free gives its slot back
    sessions[1].ingest(channel.Batch(allocs=[(100, 1)]))
    assert len(sessions[1].allocations) == 3
    sessions[0].quota.release()  # as a closing session does
    assert tallies["functions"].held[7] == 2


def test_the_tables_are_capped_for_all_users_together():
    """Each table ring records grow is capped for all users too (limits.TABLES_MAX): with caps
    per user alone, pumpd's memory grew with the number of users (tests/test_daemon_memory.py)."""
    from pumpd import limits
    tally = limits.Tally("functions", per_uid_max=10, global_max=25)
    assert [tally.take(uid, 10) for uid in (1, 2, 3)] == [10, 10, 5]
    assert tally.dropped == {3: 5} and tally.total == 25
    tally.give_back(1, 4)
    assert tally.take(3, 10) == 4 and tally.total == 25
    tallies = limits.table_tallies()
    assert all(tallies[t].global_max == limits.TABLES_MAX[t] > tallies[t].per_uid_max for t in tallies)


def test_a_huge_allocation_record_does_not_stall_the_planner():
    import threading
    from pumpd import limits, lookahead
    from pumpd.jobs import Session
    ring, plan = channel.Ring.create(1, "jx", 1024), channel.Plan.create()
    session = Session(1, os.getpid(), 0.0, ring, plan, limits.Quota(7, limits.table_tallies()))
    session.lookahead = lookahead.Lookahead(1 << 30, 1e10)
    worker = threading.Thread(target=session.ingest, args=(channel.Batch(allocs=[(1 << 21, 1 << 62)]),),
                              daemon=True)  # one ALLOC record naming 2**62 bytes: 2**41 blocks
    worker.start()
    worker.join(10)
    assert not worker.is_alive(), "the planner took over 10 s over one record"
    assert session.quota.dropped["planned_blocks"] == 1


# ---- status pages ----
def test_status_with_many_jobs_reaches_root_in_pages(pumpd, capsys):
    path, _ = pumpd
    made = register_many(path, 250)  # ~90 jobs fill a frame; 256 is one user's cap
    assert all(r.startswith("j") for r in made)
    first = request(path, {"op": "status"})
    assert first["total"] == 250 and first["next"] == len(first["jobs"]) < 250
    from pump import status as status_cli
    os.environ[protocol.SOCKET_ENV] = path
    try:
        jobs, _, daemons = status_cli.collect(status_cli.daemon_sockets())
    finally:
        del os.environ[protocol.SOCKET_ENV]
    assert sorted(j["job"] for j in jobs if j["daemon"] == path) == sorted(made)


# ---- terms, pids, names ----
def test_register_terms_are_held_to_what_jobs_d_allows():
    from pumpd.arbiter import Terms
    asked = Terms(fixed_bytes=80 << 30, share=1000, priority=1000, min_bytes=40 << 30)
    held = asked.within(Terms(share=2, priority=5), pooled=True)
    assert (held.share, held.priority, held.min_bytes) == (2, 5, 0)
    assert held.fixed_bytes is None and held.max_bytes == 80 << 30  # a cap on itself only
    assert asked.within(Terms(share=2), pooled=False).fixed_bytes == 80 << 30  # no pool: harms none
    modest = Terms(share=0.5, priority=-1)
    assert modest.within(Terms(), pooled=True) == modest


def test_the_caps_a_user_is_held_to_are_set_in_pumpd_toml(tmp_path):
    """pumpd.toml's [limits] sets what one user may make pumpd hold (issue 45 item 8): with
    jobs_per_user = 2 the third register is refused; a value past the cap for all users is
    refused at start, naming the file, the key and the most it may be."""
    from pumpd import limits
    conf = tmp_path / "pumpd.toml"
    conf.write_text("[limits]\njobs_per_user = 2\nplan_deadline_s = 1.5\n")
    path = str(tmp_path / "pumpd.sock")
    proc = start_pumpd(path, "--config", str(conf))
    try:
        with protocol.Client(path) as c:
            assert all(c.request({"op": "register", "name": f"j{i}"})["ok"] for i in range(2))
            with pytest.raises(protocol.ProtocolError, match="too many jobs: uid .* has 2, the most allowed per user"):
                c.request({"op": "register", "name": "third"})
    finally:
        stop_pumpd(proc)
    conf.write_text("[limits]\nsessions_per_user = 100000\n")
    refused = subprocess.run([sys.executable, "-m", "pumpd", "--socket", path, "--config", str(conf)],
                             capture_output=True, text=True, timeout=30, cwd="/", env=clean_env())
    most = limits.SESSIONS_MAX - limits.ROOT_RESERVE
    assert refused.returncode == 2
    assert refused.stderr.strip() == f"{conf}: [limits] sessions_per_user = 100000: at most {most:,} (the cap for all users)"


def register_greedy(path):
    """As another user: claim far more than jobs.d allows; what pumpd kept of it."""
    with protocol.Client(path) as c:
        for name, share in (("greedy", 1000), ("plain", 50)):
            c.request({"op": "register", "name": name, "share": share, "priority": 1000,
                       "min_budget": 24 << 20, "budget": 24 << 20})
        return {j["name"]: j for j in c.request({"op": "status"})["jobs"]}


@needs_root
def test_another_users_register_terms_are_held_in_pumpd(tmp_path):
    run_dir = pathlib.Path(tempfile.mkdtemp(prefix="pump-test-"))
    os.chmod(run_dir, 0o755)
    (tmp_path / "jobs.d").mkdir()
    (tmp_path / "jobs.d" / "greedy.toml").write_text("[memory]\nshare = 2\n")
    (tmp_path / "pumpd.toml").write_text(f'[daemon]\njobs_dir = "{tmp_path / "jobs.d"}"\n'
                                         '[budgets]\ngpu_pool = "24MiB"\n')
    path = str(run_dir / "pumpd.sock")
    proc = start_pumpd(path, "--config", str(tmp_path / "pumpd.toml"),
                       env=dict(clean_env(), RUNTIME_DIRECTORY=str(run_dir)))
    try:
        jobs = run_as_nobody(register_greedy, path)
        held = {name: (j["share"], j["priority"], j["min_budget_bytes"], j["max_budget_bytes"],
                       j["budget_source"]) for name, j in jobs.items()}
        assert held == {"greedy": (2, 0, 0, 24 << 20, "arbiter"), "plain": (1, 0, 0, 24 << 20, "arbiter")}
    finally:
        stop_pumpd(proc)
        shutil.rmtree(run_dir)


def set_greedy(path, victim):
    """As another user: register, set a budget of the whole pool, try the victim's job."""
    with protocol.Client(path) as c:
        job = c.request({"op": "register", "name": "greedy"})["job"]
        replies = [c.request({"op": "set", "job": job, "budget": 40 << 30})]
        try:
            c.request({"op": "set", "job": victim, "budget": 1})
        except protocol.ProtocolError as exc:
            replies.append(str(exc))
        return job, replies


@needs_root
def test_a_users_set_is_held_to_the_terms_and_caps_only_its_own_job(tmp_path):
    """Issue 29, 5: a user's set took 40 GiB of a 40 GiB pool as a fixed budget, and the
    other user's job went to 1 byte. Now it caps the setter's own share of the division."""
    run_dir = pathlib.Path(tempfile.mkdtemp(prefix="pump-test-"))
    os.chmod(run_dir, 0o755)
    (tmp_path / "jobs.d").mkdir()
    (tmp_path / "pumpd.toml").write_text(f'[daemon]\njobs_dir = "{tmp_path / "jobs.d"}"\n'
                                         '[budgets]\ngpu_pool = "40GiB"\n')
    path, admin = str(run_dir / "pumpd.sock"), str(run_dir / "admin" / "pumpd.sock")
    proc = start_pumpd(path, "--config", str(tmp_path / "pumpd.toml"), "--admin-socket", admin,
                       env=dict(clean_env(), RUNTIME_DIRECTORY=str(run_dir)))
    try:
        with protocol.Client(path) as c:
            victim = c.request({"op": "register", "name": "victim"})["job"]
        greedy, replies = run_as_nobody(set_greedy, path, victim)
        assert replies[1] == f"no job {victim} of this user"
        jobs = {j["job"]: j for j in status(admin)}
        assert (jobs[greedy]["budget_bytes"], jobs[greedy]["budget_source"], jobs[greedy]["max_budget_bytes"]) == \
            (20 << 30, "arbiter", 40 << 30)
        assert jobs[victim]["budget_bytes"] == 20 << 30
    finally:
        stop_pumpd(proc)
        shutil.rmtree(run_dir)


def connect_and_go(path) -> tuple:
    """A socket a child connected to pumpd (SO_PEERCRED names the child) and the child's pid;
    the child is gone."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    pid = os.fork()
    if pid == 0:
        try:
            sock.connect(path)
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    return sock, pid


def refused_as_gone(sock, path):
    """A register on sock is refused, the process that connected being gone, and no job made."""
    client = protocol.Client.__new__(protocol.Client)
    client.sock = sock
    sock.settimeout(5)
    with pytest.raises(protocol.ProtocolError, match="the process that connected is gone"):
        client.request({"op": "register", "name": "reused"})
    client.close()
    assert status(path) == []


def test_a_job_is_not_tied_to_a_pid_whose_process_is_gone(pumpd):
    path, _ = pumpd
    sock, _pid = connect_and_go(path)
    refused_as_gone(sock, path)


@needs_root
def test_a_pid_reused_before_pumpd_accepts_is_not_taken_for_the_client(pumpd):
    """Issue 45, the pid-reuse attack: a process connects while pumpd is held (its connection
    waits, unaccepted), hands the socket on and exits; its pid is given to another user's
    long-lived process before pumpd accepts. SO_PEERCRED then names the reused pid, and its
    start time, read at accept, is the new process's: a job tied to it would live as long as
    that process. pumpd asks the kernel whether the process that connected still exists
    (SO_PEERPIDFD, identity.py) and refuses. (Root forces the reuse with ns_last_pid.)"""
    path, proc = pumpd
    proc.send_signal(signal.SIGSTOP)
    try:
        sock, connector = connect_and_go(path)
        try:
            with open("/proc/sys/kernel/ns_last_pid", "w") as f:
                f.write(str(connector - 1))
        except OSError as exc:  # a container's read-only /proc/sys
            pytest.skip(f"cannot choose the next pid: {exc}")
        victim = subprocess.Popen(["sleep", "60"], user=65534)
    finally:
        proc.send_signal(signal.SIGCONT)
    try:
        if victim.pid != connector:
            pytest.skip(f"the pid was not reused ({victim.pid} for {connector}): another process took it")
        refused_as_gone(sock, path)
    finally:
        victim.kill()
        victim.wait()


def test_names_with_control_characters_are_escaped_in_log_and_table(pumpd):
    path, proc = pumpd
    job = request(path, {"op": "register", "name": "evil\x1b[2J\x07\n"})["job"]
    from pump import status as status_cli
    table = status_cli.table(status(path))
    assert "\x1b" not in table and "evil\\x1b[2J\\x07\\n" in table
    stop_pumpd(proc)
    log = proc.stderr.read()
    assert job in log and "\x1b" not in log and "evil\\x1b[2J" in log


# ---- malformed requests and config files: one line each ----
@pytest.mark.parametrize("data,expected", [
    (frame(b'{"op": [1]}'), "unknown op [1]"),
    (frame(b'{"op": {"a": 1}}'), "unknown op {'a': 1}"),
    (frame(b'{"op": "' + b"x" * 60000 + b'"}'), "unknown op 'xxxx"),
    (frame(b'{"op": "ping", "x": ' + b"[" * 30000 + b"]" * 30000 + b"}"), "payload is not"),
    (frame(b'{"op": "set", "job": "j1", "budget": ' + b"9" * 5000 + b"}"), "payload is not"),
    (frame(b'{"op": "status", "offset": -1}'), "field 'offset' must be an integer"),
])
def test_every_malformed_request_gets_an_error_reply(pumpd, data, expected):
    path, _ = pumpd
    reply = send_raw(path, data)
    assert reply is not None and reply[0] == protocol.ERROR and expected in reply[1]["error"], reply
    assert len(reply[1]["error"]) < 300
    assert protocol.ping(path)


TOML_BOMBS = {
    "deep_array": "[memory]\nshare = " + "[" * 3000 + "]" * 3000 + "\n",
    "deep_table": "[memory]\nshare = " + "{a=" * 3000 + "1" + "}" * 3000 + "\n",
    "huge_int": "[memory]\npriority = " + "9" * 5000 + "\n",
}


@pytest.mark.parametrize("bomb", sorted(TOML_BOMBS))
@pytest.mark.parametrize("command", ["config check", "pump-run", "pumpd"])
def test_toml_bombs_get_one_clear_line(tmp_path, bomb, command):
    cfg = tmp_path / "bomb.toml"
    cfg.write_text(TOML_BOMBS[bomb] if command != "pumpd" else TOML_BOMBS[bomb].replace("[memory]", "[telemetry]"))
    argv = {"config check": [str(pathlib.Path(PUMP_RUN).parent / "pump"), "config", "check", str(cfg)],
            "pump-run": [PUMP_RUN, "--config", str(cfg), "true"],
            "pumpd": [sys.executable, "-m", "pumpd", "--config", str(cfg), "--socket", str(tmp_path / "s")]}[command]
    run = subprocess.run(argv, env=clean_env(), cwd="/", capture_output=True, text=True, timeout=60)
    lines = run.stderr.strip().splitlines()
    assert run.returncode != 0 and len(lines) == 1 and str(cfg) in lines[0], run.stderr[-2000:]
    assert "nested too deeply" in lines[0] or "4300 digits" in lines[0]


def test_a_task_that_raises_runs_again():
    from pumpd.tasks import RateLimitedLog, supervised
    calls = []

    async def body():
        calls.append(1)
        if len(calls) < 3:
            raise OSError(28, "No space left on device")
        return "done"

    assert asyncio.run(supervised("test", body, RateLimitedLog())) == "done"
    assert len(calls) == 3


def test_a_task_that_loses_a_cancellation_still_stops(monkeypatch):
    """Before Python 3.12 asyncio.wait_for can return its result instead of raising when its
    task is cancelled as the inner future completes (python/cpython#86296): a loop around it
    goes on. pumpd's shutdown gathered its tasks once and waited for ever, a shared pumpd then
    holding its lock and socket without accepting (seen in a clean-clone CI run: every later
    pump-run waited 15 s for a daemon). It cancels each task still running again; one that never
    ends is left after STOP_ROUNDS, said so."""
    from pumpd import tasks
    monkeypatch.setattr(tasks, "STOP_ROUND_SECONDS", 0.05)

    async def loses_the_first():
        lost = 0
        while True:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                lost += 1
                if lost > 1:
                    raise

    released = []

    async def never_ends():  # until the test lets it go
        while not released:
            try:
                await asyncio.sleep(0.01)
            except asyncio.CancelledError:
                pass

    async def main():
        first = asyncio.create_task(loses_the_first(), name="loses the first")
        stubborn = asyncio.create_task(never_ends(), name="stubborn")
        await asyncio.sleep(0)
        assert await tasks.stop_tasks([first]) == [] and first.cancelled()
        left = await tasks.stop_tasks([stubborn])
        assert left == [stubborn] and not stubborn.done()
        released.append(True)
        await stubborn

    asyncio.run(main())
