"""pump-run's daemon modes, job config and --trace, and `pump status`, run as a user
would run them (the installed console scripts)."""

import json
import os
import pathlib
import re
import subprocess
import sys
import textwrap

import pytest

from helpers import IDLE, PUMP_RUN, clean_env, start_pumpd, stop_pumpd

PUMP = str(pathlib.Path(sys.executable).parent / "pump")

# The child reports what pump-run gave it, and what the daemon says meanwhile.
REPORT = textwrap.dedent("""
    import json, os
    from pump import protocol
    out = {k: os.environ.get(k) for k in ("PUMP_SOCKET", "PUMP_JOB", "PUMP_NAME", "PUMP_POLICY", "PUMP_BUDGET")}
    if out["PUMP_SOCKET"]:
        with protocol.Client(out["PUMP_SOCKET"]) as c:
            out["jobs"] = c.request({"op": "status"})["jobs"]
    print(json.dumps(out))
""")


def run(*args, env=None, timeout=120):
    return subprocess.run([PUMP_RUN, *args], env=env or clean_env(), capture_output=True, text=True,
                          timeout=timeout)


def report(*args, env=None):
    proc = run(*args, "--", sys.executable, "-c", REPORT, env=env)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc


def test_daemon_none_tells_the_shim_there_is_none():
    out, _ = report("--daemon", "none")
    assert out["PUMP_SOCKET"] == "" and out["PUMP_JOB"] is None


def test_daemon_system_without_a_service_is_an_error(tmp_path):
    proc = run("--daemon", "system", "--socket", str(tmp_path / "none.sock"), "true")
    assert proc.returncode == 2
    assert proc.stderr == (f"pump-run: no pumpd answers on {tmp_path / 'none.sock'} (start the service: "
                           "scripts/install-service; or use --daemon auto)\n")


def test_daemon_system_registers_the_job(tmp_path):
    path = str(tmp_path / "pumpd.sock")
    daemon = start_pumpd(path)
    try:
        out, _ = report("--daemon", "system", "--socket", path, "--name", "sys-job", "--budget", "1GiB",
                        "--policy", "lookahead")
        assert out["PUMP_SOCKET"] == path and out["PUMP_JOB"].startswith("j")
        assert out["PUMP_NAME"] == "sys-job" and out["PUMP_POLICY"] == "lookahead" and out["PUMP_BUDGET"] == "1GiB"
        job = [j for j in out["jobs"] if j["job"] == out["PUMP_JOB"]][0]
        assert (job["name"], job["policy"], job["budget_bytes"]) == ("sys-job", "lookahead", 1 << 30)
        with_auto, _ = report("--socket", path)  # auto finds the service too
        assert with_auto["PUMP_SOCKET"] == path
    finally:
        stop_pumpd(daemon)


def test_embedded_starts_a_daemon_that_goes_with_the_job(tmp_path):
    env = clean_env()
    env["PUMP_SOCKET"] = str(tmp_path / "no-service.sock")
    out, proc = report("--daemon", "embedded", env=env)
    socket_path = out["PUMP_SOCKET"]
    assert socket_path != env["PUMP_SOCKET"] and socket_path.endswith("/pumpd.sock")
    assert [j["job"] for j in out["jobs"]] == [out["PUMP_JOB"]]
    assert not os.path.exists(os.path.dirname(socket_path))  # its directory is gone
    assert proc.stderr == IDLE                                 # and it said only that pump was idle


def test_bad_config_file_stops_before_anything_runs(tmp_path):
    cfg = tmp_path / "job.toml"
    cfg.write_text('[prefetch]\npolicy = "fast"\n[memroy]\n')
    marker = tmp_path / "ran"
    proc = run("--config", str(cfg), "touch", str(marker))
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [
        f'pump-run: {cfg}: [prefetch] policy: bad value "fast"; allowed: "off", "launch", "lookahead"',
        f"pump-run: {cfg}: unknown section [memroy] (did you mean [memory]?); allowed: [job], [prefetch], [memory], "
        "[trace], [daemon]",
    ]
    assert not marker.exists()


def test_config_file_and_flags(tmp_path):
    cfg = tmp_path / "job.toml"
    cfg.write_text('[job]\nname = "from-file"\n[prefetch]\npolicy = "off"\n[memory]\nbudget = "2GiB"\n'
                   '[daemon]\nmode = "none"\n')
    out, _ = report("--config", str(cfg), "--policy", "launch")
    assert (out["PUMP_NAME"], out["PUMP_POLICY"], out["PUMP_BUDGET"], out["PUMP_SOCKET"]) == \
        ("from-file", "launch", "2GiB", "")


def test_trace_needs_a_daemon(tmp_path):
    proc = run("--daemon", "none", "--trace", str(tmp_path / "t"), "true")
    assert proc.returncode == 2
    assert proc.stderr == "pump-run: --trace needs a daemon (--daemon auto, system or embedded)\n"


def test_trace_file_that_cannot_be_opened(tmp_path):
    proc = run("--daemon", "embedded", "--trace", str(tmp_path / "no" / "dir" / "t"), "true")
    assert proc.returncode == 2
    assert proc.stderr.endswith(": No such file or directory\n") and "--trace" in proc.stderr


def test_pump_status(tmp_path):
    env = clean_env()
    env["PUMP_SOCKET"] = str(tmp_path / "pumpd.sock")
    # pump status also asks every embedded pumpd of the caller's (their sockets are under the
    # temp dir): a private one keeps other jobs of this user out of the answer.
    env["TMPDIR"] = str(tmp_path)
    none = subprocess.run([PUMP, "status"], env=env, capture_output=True, text=True, timeout=30)
    assert none.returncode == 0 and none.stdout.startswith("no jobs (no pumpd is running: looked at "), none
    asked = subprocess.run([PUMP, "status", "--socket", env["PUMP_SOCKET"]], env=env, capture_output=True,
                           text=True, timeout=30)
    assert asked.returncode == 1 and asked.stderr == f"pump: no pumpd answers on {env['PUMP_SOCKET']}\n"
    empty = json.loads(subprocess.run([PUMP, "status", "--json"], env=env, capture_output=True, text=True,
                                      timeout=30).stdout)
    assert empty == {"daemons": [], "jobs": [], "pools": []}
    daemon = start_pumpd(env["PUMP_SOCKET"])
    try:
        from pump import protocol
        with protocol.Client(env["PUMP_SOCKET"]) as c:
            job = c.request({"op": "register", "name": "shown", "budget": 3 << 30})["job"]
        table = subprocess.run([PUMP, "status"], env=env, capture_output=True, text=True, timeout=30)
        assert table.returncode == 0, table.stderr
        header, row = table.stdout.splitlines()[:2]
        assert header.split() == ["JOB", "NAME", "PID", "USER", "POLICY", "BUDGET", "FROM", "RESIDENT",
                                  "LAUNCHES", "PREFETCHED", "DROPPED", "RANKS", "AGE", "LEARNED"]
        assert row.split()[:3] == [job, "shown", str(os.getpid())] and "3.0 GiB  config" in row
        assert row.split()[-3] == "-" and re.fullmatch(r"\d+s", row.split()[-2]) and row.split()[-1] == "-", row
        one = subprocess.run([PUMP, "status", "--socket", env["PUMP_SOCKET"]], env=env, capture_output=True,
                             text=True, timeout=30)
        assert one.returncode == 0 and one.stdout.splitlines()[1].split()[0] == job, one
        doc = json.loads(subprocess.run([PUMP, "status", "--json"], env=env, capture_output=True, text=True,
                                        timeout=30).stdout)
        assert [j["job"] for j in doc["jobs"]] == [job] and doc["daemons"][0] == env["PUMP_SOCKET"]
    finally:
        stop_pumpd(daemon)


@pytest.mark.parametrize("job,age,learned", [
    ({"policy": "launch", "started": 0}, None, "-"),
    ({"policy": "lookahead", "iteration_launches": []}, "-", "-"),
    ({"policy": "lookahead", "iteration_launches": [0]}, "-", "not yet"),
    ({"policy": "lookahead", "iteration_launches": [512, 0]}, "-", "512 launches,not yet"),
])
def test_status_age_and_learned_cells(job, age, learned):
    from pump import status
    assert status._learned(job) == learned
    if age is not None:
        assert status._age(job) == age


@pytest.mark.parametrize("ago,shown", [(0, "0s"), (59, "59s"), (60, "1m00s"), (725, "12m05s"), (3600 * 3 + 120, "3h02m"),
                                        (86400 * 2 + 3600 * 4 + 5, "2d04h")])
def test_status_age_is_human(ago, shown):
    import time
    from pump import status
    assert status._age({"started": time.time() - ago}) == shown


@pytest.mark.parametrize("iterations,line", [
    ([412], "lookahead learned an iteration of 412 launches"),
    ([412, 0, 412, 398], "lookahead learned an iteration of 398 and 412 launches"),
    ([], "lookahead learned no iteration: the job's launches did not repeat while it ran (a PyTorch job's repeat "
         "under pump's allocator once its optimizer marks steps, under PyTorch's caching allocator only with "
         "PUMP_TORCH_NAMES=1: docs/limits.md), so the launch rule applied throughout"),
    (None, "lookahead: pumpd did not say whether it learned an iteration"),
])
def test_lookahead_line(iterations, line):
    from pump import run
    assert run.lookahead_line(iterations) == line


def test_lookahead_line_says_the_link_rate_measured():
    from pump import run
    assert run.lookahead_line([412], [24_612_345_678, 0, "x"]) == \
        "lookahead learned an iteration of 412 launches, planned at the link rate its prefetches met: 24.6 GB/s"
    assert run.lookahead_line([412], []) == "lookahead learned an iteration of 412 launches"


@pytest.mark.parametrize("ranks,shown", [([], "-"), (None, "-"), ([0], "0"), ([1, 0, 3, 2], "0-3"),
                                         ([0, 1, 2, 5, 7, 8], "0-2,5,7-8")])
def test_status_ranks_are_shown_as_runs(ranks, shown):
    from pump import status
    assert status._ranks({"ranks": ranks}) == shown

