"""The pump-runs of one run are one pump job (pump/launchers.py): `srun pump-run` and
`torchrun ... pump-run` start a pump-run per rank; they name the same group (from
SLURM_JOB_ID/SLURM_STEP_ID, TORCHELASTIC_RUN_ID and the agent, or --group), pumpd joins
them, and `pump status` names the members by the ranks their shims send."""

import os
import signal
import subprocess
import sys
import time

import pytest

from helpers import PUMP_RUN, clean_env, start_pumpd, stop_pumpd
from pump import launchers, protocol


@pytest.mark.parametrize("env,group", [
    ({}, None),
    ({"SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "0"}, "slurm-4242.0"),
    ({"SLURM_JOB_ID": "4242"}, "slurm-4242.batch"),                      # a batch script
    ({"SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "../x"}, "slurm-4242.batch"),
    ({"SLURM_JOB_ID": "not-a-number"}, None),
    ({"TORCHELASTIC_RUN_ID": "none"}, "torchrun-none-777"),
    ({"TORCHELASTIC_RUN_ID": "my run/1"}, "torchrun-my_run_1-777"),
])
def test_run_group_from_the_launchers_environment(env, group):
    assert launchers.run_group(env, parent_pid=777) == group
    assert group is None or protocol.GROUP_RE.fullmatch(group)


def jobs(socket):
    with protocol.Client(str(socket)) as client:
        return client.request({"op": "status"})["jobs"]


def wait_for(predicate, timeout=30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError("timed out")


@pytest.fixture
def daemon(tmp_path):
    socket = tmp_path / "pumpd.sock"
    proc = start_pumpd(socket)
    yield socket
    stop_pumpd(proc)


def rank(c_build, socket, device, extra_env, *flags):
    """One rank: fakecuda's `devices` program on its device, holding until stdin closes."""
    env = dict(clean_env(), LD_LIBRARY_PATH=str(c_build / "plain"), FAKECUDA_DEVICES="2", **extra_env)
    return subprocess.Popen([PUMP_RUN, "--daemon", "system", "--socket", str(socket), *flags, "--",
                             str(c_build / "plain" / "devices"), str(device), str(device), "hold"],
                            env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def finish(procs, status=0):
    """Closes each rank's stdin (it ends) and returns its (stdout, stderr)."""
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=60)
        assert p.returncode == status, err
        outs.append((out, err))
    return outs


def test_the_tasks_of_a_slurm_step_are_one_job_with_their_ranks(c_build, daemon):
    slurm = {"SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "0"}
    procs = [rank(c_build, daemon, r, dict(slurm, SLURM_PROCID=str(r))) for r in (0, 1)]
    try:
        [job] = wait_for(lambda: [j for j in jobs(daemon) if j["sessions"] == 2] or None)
        assert (job["name"], job["group"], job["pump_runs"], job["ranks"]) == ("slurm-4242.0", "slurm-4242.0", 2, [0, 1])
        assert len(jobs(daemon)) == 1
        table = subprocess.run([sys.executable, "-m", "pump.cli", "status", "--socket", str(daemon)],
                               capture_output=True, text=True, env=clean_env(), timeout=30).stdout
        assert table.splitlines()[1].split()[1] == "slurm-4242.0" and " 0-1 " in table, table
        # Another step of the same Slurm job is another job.
        other = rank(c_build, daemon, 0, dict(slurm, SLURM_STEP_ID="1", SLURM_PROCID="0"))
        try:
            wait_for(lambda: len(jobs(daemon)) == 2)
        finally:
            finish([other])
    finally:
        outs = finish(procs)
    # Each task's summary is its own process's; the job is gone once both pump-runs ended.
    assert all("pump: " in err for _, err in outs)
    wait_for(lambda: jobs(daemon) == [])


def test_a_group_member_asking_for_another_policy_is_refused(c_build, daemon):
    first = rank(c_build, daemon, 0, {"RANK": "0"}, "--group", "run-1")
    try:
        wait_for(lambda: [j for j in jobs(daemon) if j["sessions"] == 1])
        second = rank(c_build, daemon, 1, {"RANK": "1"}, "--group", "run-1", "--policy", "off")
        [(out, err)] = finish([second], status=2)  # --daemon system: refused before the command runs
        assert out == "" and err == ("pump-run: pumpd: register: job " + jobs(daemon)[0]["job"] + " of group "
                                     "run-1 runs policy launch; a pump-run joining it asked for off (the "
                                     "same run takes one policy)\n"), err
        assert len(jobs(daemon)) == 1 and jobs(daemon)[0]["pump_runs"] == 1
        alone = rank(c_build, daemon, 1, {"RANK": "1", "SLURM_JOB_ID": "5"}, "--no-group")
        try:
            wait_for(lambda: len(jobs(daemon)) == 2)
            assert {j["group"] for j in jobs(daemon)} == {"run-1", None}
        finally:
            finish([alone])
    finally:
        finish([first])


def test_group_flag_is_checked():
    r = subprocess.run([PUMP_RUN, "--group", "../etc", "true"], capture_output=True, text=True,
                       env=clean_env(), timeout=30)
    assert r.returncode == 2 and "bad value '../etc'" in r.stderr


def serve_env(socket, *flags):
    """`pump-run --serve-env` on pumpd at socket: its process and the variables it says."""
    proc = subprocess.Popen([PUMP_RUN, "--daemon", "system", "--socket", str(socket), *flags, "--serve-env"],
                            env=clean_env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    said = b""
    while not (said.endswith(b"\0\0") or said == b"\0"):
        chunk = proc.stdout.read1(4096)
        assert chunk, proc.stderr.read().decode()
        said += chunk
    return proc, dict(entry.split("=", 1) for entry in said[:-2].decode().split("\0"))


def test_serve_env_ends_on_a_signal_another_thread_receives(daemon):
    """The kernel may give a process's SIGTERM to any of its threads (pump-run has numpy's BLAS
    threads): the main thread, blocked reading stdin, then read on until stdin ended (a CI run
    waited 30 s). It waits for the signal's wakeup byte beside stdin now."""
    import ctypes
    proc, _given = serve_env(daemon)
    try:
        others = [int(t) for t in os.listdir(f"/proc/{proc.pid}/task") if int(t) != proc.pid]
        if not others:
            pytest.skip("pump-run has no thread besides its main one here")
        tgkill = {"x86_64": 234, "aarch64": 131}.get(os.uname().machine)  # SYS_tgkill
        if tgkill is None:
            pytest.skip(f"tgkill's number on {os.uname().machine} is not known here")
        libc = ctypes.CDLL(None, use_errno=True)
        assert libc.syscall(tgkill, proc.pid, others[0], signal.SIGTERM) == 0, ctypes.get_errno()
        assert proc.wait(10) == 0 and jobs(daemon) == []
    finally:
        proc.kill()
        proc.communicate()


def test_serve_env_holds_a_job_for_processes_another_launcher_starts(c_build, daemon, tmp_path):
    """What the SPANK plugin uses: the variables pump-run gives a command (only those), the
    job held until stdin closes, its summary counting the processes that used them."""
    proc, given = serve_env(daemon, "--group", "run-7")
    try:
        [job] = jobs(daemon)
        assert (given["PUMP_SOCKET"], given["PUMP_JOB"], job["group"]) == (str(daemon), job["job"], "run-7")
        assert given["LD_PRELOAD"].endswith("/libpump.so")
        assert os.path.isdir(given["PUMP_STATS_DIR"]) and "PATH" not in given and "HOME" not in given
        env = dict(clean_env(), LD_LIBRARY_PATH=str(c_build / "plain"), FAKECUDA_DEVICES="2", **given)
        for device in ("0", "1"):  # two processes started elsewhere, with the variables
            run = subprocess.run([str(c_build / "plain" / "devices"), device, device], env=env, capture_output=True,
                                 text=True, timeout=60)
            assert run.returncode == 0 and '"gpu_faults": 0,' in run.stdout, run.stderr
        assert jobs(daemon)[0]["job"] == job["job"]  # held while its processes come and go
    finally:
        _, err = proc.communicate(timeout=60)  # stdin closes
    assert proc.returncode == 0, err
    assert "pump: 4 launches (4 on managed memory)" in err.decode() and "2 processes" in err.decode(), err
    assert jobs(daemon) == [] and not os.path.exists(given["PUMP_STATS_DIR"])


def test_serve_env_ends_its_job_on_sigterm_and_takes_no_command(daemon):
    proc, given = serve_env(daemon)
    proc.send_signal(signal.SIGTERM)  # stdin still open
    assert proc.wait(30) == 0 and jobs(daemon) == [] and not os.path.exists(given["PUMP_STATS_DIR"])
    proc.communicate()
    r = subprocess.run([PUMP_RUN, "--serve-env", "true"], capture_output=True, text=True, env=clean_env(), timeout=30)
    assert (r.returncode, r.stderr) == (2, "pump-run: --serve-env takes no command (the processes given its "
                                           "variables are started by another launcher)\n")
