"""The SPANK plugin's pump-run holds the job user's ids and groups alone, whatever its
caller left: called as slurmstepd calls it (the job's groups and effective ids, root's
real and saved uid) and with root's groups still in place (tests/spank_harness.c plays
Slurm's side). Its pump-run (here a Python probe in its place) gets the job's groups,
cannot regain root, has no_new_privs, no inherited descriptor, only the variables
pump-run reads, and an isolated Python; a pump_run that anyone but root could change is
not run. tests/test_slurm.py runs the plugin in a real Slurm."""

import json
import os
import pathlib
import shutil
import subprocess
import tempfile

import pytest

from slurm_cluster import build_spank_plugin

HERE = pathlib.Path(__file__).resolve().parent
PYTHON = shutil.which("python3", path="/usr/bin:/usr/local/bin")  # root's, reachable by every user
JOB = ("65534", "65534", "65534,100")  # uid, gid, supplementary groups

PROBE = """#!{python}
# Stands in for pump-run --serve-env: says what it runs with as PROBE, then the variables
# pump-run would give (LD_PRELOAD and PYTHONPATH, which the plugin merges with the task's).
import json, os, sys
try:
    open("/etc/shadow").close()
    shadow = "read"
except OSError as exc:
    shadow = exc.strerror
status = dict(line.split(":\\t", 1) for line in open("/proc/self/status").read().splitlines() if ":\\t" in line)
doc = {{"uids": os.getresuid(), "gids": os.getresgid(), "groups": sorted(os.getgroups()),
       "no_new_privs": status["NoNewPrivs"].strip(), "fds": sorted(int(f) for f in os.listdir("/proc/self/fd")),
       "env": sorted(os.environ), "isolated": sys.flags.isolated, "shadow": shadow, "argv": sys.argv[1:]}}
sys.stdout.write("PROBE=" + json.dumps(doc) + "\\0LD_PRELOAD=/shim.so\\0PYTHONPATH=/boot\\0\\0")
sys.stdout.flush()
sys.stdin.read()
"""

pytestmark = [pytest.mark.skipif(os.geteuid() != 0, reason="calls the hook as root, as slurmstepd does"),
              pytest.mark.skipif(PYTHON is None, reason="no root-owned python3 in /usr/bin or /usr/local/bin")]


@pytest.fixture(scope="module")
def harness(tmp_path_factory):
    """(the harness, the plugin), built (skipped without Slurm's headers)."""
    directory = tmp_path_factory.mktemp("spank")
    plugin = directory / "spank_pump.so"
    no_plugin = build_spank_plugin(plugin)
    if no_plugin:
        pytest.skip(no_plugin)
    program = directory / "spank_harness"
    subprocess.run([os.environ.get("CC", "cc"), "-std=c11", "-Wall", "-Wextra", "-Werror", "-rdynamic", "-o",
                    str(program), str(HERE / "spank_harness.c"), "-ldl"], check=True, timeout=120)
    # The job's user must reach both (pytest's directories are root's alone).
    for path in (directory.parent, directory):
        path.chmod(0o755)
    return program, plugin


@pytest.fixture
def probe():
    """The probe, in a directory of root's that every user can enter."""
    directory = pathlib.Path(tempfile.mkdtemp(prefix="pump-spank-"))
    directory.chmod(0o755)
    path = directory / "pump-run"
    path.write_text(PROBE.format(python=PYTHON))
    path.chmod(0o755)
    yield path
    shutil.rmtree(directory)


def call_hook(harness, pump_run, mode):
    """(the variables set in the task, the lines the plugin logged)."""
    program, plugin = harness
    run = subprocess.run([str(program), str(plugin), str(pump_run), mode, *JOB], capture_output=True, text=True,
                         timeout=60, cwd="/")
    assert run.returncode == 0, run.stderr
    task = dict(line[5:].split("=", 1) for line in run.stdout.splitlines() if line.startswith("task "))
    logged = [line for line in run.stdout.splitlines() if not line.startswith("task ")]
    return task, logged


@pytest.mark.parametrize("mode", ["slurmstepd", "root"])
def test_pump_run_holds_the_job_users_ids_and_groups_alone(harness, probe, mode):
    """Before: with root's groups left (mode root), the probe ran with groups 0, 4 and 42 and
    read /etc/shadow; it held descriptor 57, saw JOB_SECRET and the job's PYTHONPATH."""
    task, logged = call_hook(harness, probe, mode)
    assert "PROBE" in task, logged
    got = json.loads(task["PROBE"])
    assert (got["uids"], got["gids"]) == ([65534] * 3, [65534] * 3)
    assert got["groups"] == [100, 65534]
    assert got["shadow"] == "Permission denied"
    assert got["no_new_privs"] == "1"
    assert got["fds"] == [0, 1, 2, 3], got["fds"]  # 3: the probe's own listing of them
    assert set(got["env"]) <= {"PATH", "HOME", "PUMP_POLICY", "SLURM_JOB_ID", "SLURM_STEP_ID", "LC_CTYPE"}, got["env"]
    assert got["isolated"] == 1 and got["argv"] == ["--serve-env", "--policy=launch"]
    # pump-run's LD_PRELOAD first, then the task's own, which pump-run never saw
    assert (task["LD_PRELOAD"], task["PYTHONPATH"]) == ("/shim.so:/task.so", "/boot")
    assert not [line for line in logged if line.startswith("error")], logged


def test_a_caller_without_root_to_drop_gets_no_pump_run(harness, probe):
    """A caller that is uid 1 throughout cannot give the probe the job's groups: the
    plugin's setgroups is checked, the probe never runs, and the tasks run without pump."""
    task, logged = call_hook(harness, probe, "daemon")
    assert task == {}, task
    assert "info: pump: spank_pump: cannot run pump-run as the job's user alone: setgroups(the job's groups) " \
           "failed" in logged, logged
    assert f"error: pump: {probe} --serve-env gave no environment; the tasks run without pump" in logged
    assert any("ended with status 126 (it could not be run as the job's user)" in line for line in logged), logged


@pytest.mark.parametrize("whose", ["a directory others can write", "a file of another user's"])
def test_a_pump_run_others_could_change_is_not_run(harness, probe, whose):
    if whose == "a directory others can write":
        probe.parent.chmod(0o777)
        expected = f"{probe.parent} is a directory above pump_run (uid 0, mode 0777)"
    else:
        os.chown(probe, 65534, 65534)
        expected = f"{probe} is pump_run's (uid 65534, mode 0755)"
    task, logged = call_hook(harness, probe, "slurmstepd")
    assert task == {}
    assert f"error: pump: {expected}; it must be root's and writable by root alone; the tasks run without pump" \
        in logged, logged
