"""pumpd with real jobs: fakecuda programs under pump-run with the real shim.

- kill -9 of the daemon in the middle of a job: the job finishes with the same
  result; a restarted daemon lists it again and its shim resumes.
- a killed job's session is gone within 2 s.
- eight concurrent jobs under one daemon: all correct, no events dropped.
- --policy lookahead: the daemon's plan reaches the shim and adds prefetches.
"""

import json
import signal
import subprocess
import time

import pytest

from helpers import PUMP_RUN, clean_env, start_pumpd, stop_pumpd
from pump import protocol
from test_daemon import status, wait_for


@pytest.fixture
def job_env(c_build):
    env = clean_env()
    env["LD_LIBRARY_PATH"] = str(c_build / "plain")
    return env


def bare_checksum(c_build, job_env, iterations):
    proc = subprocess.run([str(c_build / "plain" / "touch_linked"), str(iterations)], env=job_env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.splitlines()[-1])["checksum"]


def start_job(c_build, job_env, socket_path, *args, program="touch_linked", stats=None):
    argv = [PUMP_RUN, "--daemon", "system", "--socket", socket_path]
    if stats is not None:
        argv += ["--stats", str(stats)]
    return subprocess.Popen(argv + ["--", str(c_build / "plain" / program), *map(str, args)],
                            env=job_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_kill_9_of_the_daemon_mid_job(c_build, job_env, tmp_path):
    iterations = 40
    expected = bare_checksum(c_build, job_env, iterations)
    path = str(tmp_path / "pumpd.sock")
    daemon = start_pumpd(path)
    job = start_job(c_build, job_env, path, iterations, stats=tmp_path / "stats.json")
    try:
        first = wait_for(lambda: [j for j in status(path) if j["sessions"] == 1 and j["events"] > 0], timeout=20)
        assert first, status(path)
        job_id = first[0]["job"]
        daemon.send_signal(signal.SIGKILL)
        daemon.wait()
        time.sleep(0.5)
        daemon = start_pumpd(path)
        assert [j["job"] for j in status(path)] == [job_id]  # listed again at once, from its file
        resumed = wait_for(lambda: [j for j in status(path) if j["sessions"] == 1 and j["events"] > 0],
                           timeout=10)
        assert resumed and resumed[0]["job"] == job_id, status(path)  # the shim came back on its own
        out, err = job.communicate(timeout=300)
        assert job.returncode == 0, err
        assert json.loads(out.splitlines()[-1])["checksum"] == expected
        totals = json.loads((tmp_path / "stats.json").read_text())["totals"]
        assert totals["errors"] == 0
    finally:
        job.kill()
        stop_pumpd(daemon)


def test_killed_job_leaves_within_two_seconds(c_build, job_env, tmp_path):
    path = str(tmp_path / "pumpd.sock")
    daemon = start_pumpd(path)
    job = start_job(c_build, job_env, path, 2_000_000_000, 0, 4, program="launch_stream")
    try:
        assert wait_for(lambda: [j for j in status(path) if j["sessions"] == 1 and j["events"] > 0], timeout=20)
        job.send_signal(signal.SIGKILL)  # pump-run itself, then its child
        subprocess.run(["pkill", "-KILL", "-f", "launch_stream 2000000000"], check=False)
        killed = time.monotonic()
        assert wait_for(lambda: status(path) == [], timeout=5), status(path)
        assert time.monotonic() - killed < 2.0
    finally:
        job.kill()
        stop_pumpd(daemon)


def test_eight_concurrent_jobs_under_one_daemon(c_build, job_env, tmp_path):
    iterations = 6
    expected = bare_checksum(c_build, job_env, iterations)
    path = str(tmp_path / "pumpd.sock")
    daemon = start_pumpd(path)
    try:
        jobs = [start_job(c_build, job_env, path, iterations, stats=tmp_path / f"s{i}.json") for i in range(8)]
        seen = wait_for(lambda: len(status(path)) == 8 and all(j["events"] > 0 for j in status(path)), timeout=60)
        assert seen, status(path)
        for i, job in enumerate(jobs):
            out, err = job.communicate(timeout=300)
            assert job.returncode == 0, err
            assert json.loads(out.splitlines()[-1])["checksum"] == expected
            totals = json.loads((tmp_path / f"s{i}.json").read_text())["totals"]
            assert totals["events_written"] > 0 and totals["events_dropped"] == 0
        assert wait_for(lambda: status(path) == [], timeout=5)
    finally:
        stop_pumpd(daemon)


def test_lookahead_plan_evicts_and_prefetches(c_build, job_env, tmp_path):
    """launch_stream cycles over 8 allocations of 2 MiB, two per launch; with a budget
    of half of them, pumpd learns the cycle and its plan moves blocks ahead of use and
    out after their last use, within the budget."""
    path = str(tmp_path / "pumpd.sock")
    daemon = start_pumpd(path)
    try:
        proc = subprocess.run([PUMP_RUN, "--daemon", "system", "--socket", path, "--policy", "lookahead",
                               "--budget", "8MiB", "--stats", str(tmp_path / "s.json"), "--",
                               str(c_build / "plain" / "launch_stream"), "30000", "100000", "8"],
                              env=job_env, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        totals = json.loads((tmp_path / "s.json").read_text())["totals"]
        assert totals["plan_triggers"] > 0
        assert totals["plan_prefetch_ranges"] > 0 and totals["plan_evict_ranges"] > 0
        assert totals["resident_bytes_peak"] <= 8 << 20
    finally:
        stop_pumpd(daemon)


def test_trace_of_a_real_job(c_build, job_env, tmp_path):
    from pump import trace
    proc = subprocess.run([PUMP_RUN, "--daemon", "embedded", "--trace", str(tmp_path / "job.trace"),
                           "--stats", str(tmp_path / "s.json"), "--", str(c_build / "plain" / "touch_linked"), "3"],
                          env=job_env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    totals = json.loads((tmp_path / "s.json").read_text())["totals"]
    doc = trace.stats(tmp_path / "job.trace")
    assert doc["launches"] == totals["launches_managed"] > 0
    assert doc["records"] == totals["events_written"]          # every event the shim wrote reached the file
    assert doc["managed_bytes_peak"] == totals["managed_bytes_peak"]
    assert doc["kinds"]["sync"] > 0 and doc["functions"] > 0


def test_a_killed_planner_costs_only_the_plans_being_made(tmp_path):
    """Issue 45 item 2: the planner process killed (as the OOM killer would) leaves pumpd serving
    and every published plan in force; the next turn starts another planner, and plans are made
    again."""
    import psutil
    from fakeshim import FakeShim
    path = str(tmp_path / "pumpd.sock")
    daemon = start_pumpd(path)
    shims = []
    try:
        for k in range(2):
            shim = FakeShim(path, name=f"learner{k}", policy="lookahead")
            with protocol.Client(path) as c:
                c.request({"op": "set", "job": shim.job, "budget": 8 << 20})
            bases = [(k + 1 << 36) + i * (2 << 20) for i in range(8)]
            for base in bases:
                shim.emit("alloc", base, 2 << 20, 1)
            shims.append((shim, bases))

        def feed(rounds=20):
            for shim, bases in shims:
                for _ in range(rounds):
                    for i, base in enumerate(bases):
                        shim.launch(0x100 + 16 * i, base)

        def command_line(process):
            try:  # the killed planner turns zombie (or is reaped) at any moment
                return " ".join(process.cmdline())
            except (psutil.ZombieProcess, psutil.NoSuchProcess):
                return ""

        def planner():
            return [p for p in psutil.Process(daemon.pid).children() if "pumpd.planner" in command_line(p)]

        feed()
        assert wait_for(lambda: all(s.plan_triggers() for s, _ in shims), timeout=30)
        published = [s.plan_triggers() for s, _ in shims]
        first = planner()[0]
        first.kill()  # pumpd reaps it at the next turn, which meets its socket's end
        feed()  # a turn meets the dead planner: it fails, and the next starts another
        assert wait_for(lambda: planner() and planner()[0].pid != first.pid, timeout=30)
        assert daemon.poll() is None and protocol.ping(path)
        assert [s.plan_triggers() for s, _ in shims] == published  # the plans in force stayed
        generations = [int(s.plan.generation) for s, _ in shims]
        feed()  # the new planner learns the sessions anew and publishes their plans again
        assert wait_for(lambda: all(int(s.plan.generation) > g and s.plan_triggers()
                                    for (s, _), g in zip(shims, generations)), timeout=30)
    finally:
        for shim, _ in shims:
            shim.close()
        stop_pumpd(daemon)
