"""pump under a real Slurm (tests/slurm_cluster.py: one node, two GPUs as GRES): `srun -n 2
pump-run` makes one pump job named after the job step, its tasks named by rank, each on
the GPU Slurm binds it to, all in one pumpd of the node (the system's when it runs, else
the user's shared one) that arbitrates them with the node's other jobs; pump-run in an
sbatch script; the SPANK plugin's `srun --pump` and `#SBATCH --pump` (the variables
pump-run gives, its pump-run run as the job's user alone, its failure harmless). The
programs are fakecuda's `devices`, on two devices; results are compared with runs without
pump; nothing is left running."""

import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

import psutil
import pytest

from helpers import PUMP_RUN, clean_env, start_pumpd, stop_pumpd
from pump import protocol
from slurm_cluster import SlurmCluster, build_spank_plugin, missing_reason
from test_launchers import wait_for

pytestmark = pytest.mark.skipif(bool(missing_reason()), reason=missing_reason() or "-")

MiB = 1 << 20


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """The cluster, with deploy/slurm's SPANK plugin in its plugstack.conf where it builds
    (cluster.no_plugin says why not)."""
    directory = tmp_path_factory.mktemp("slurm")
    plugin = directory / "spank_pump.so"
    no_plugin = build_spank_plugin(plugin)
    c = SlurmCluster(directory, "" if no_plugin else f"required {plugin} pump_run={PUMP_RUN}\n")
    c.no_plugin = no_plugin
    with c.running():
        yield c


@pytest.fixture
def plugin(cluster):
    if cluster.no_plugin:
        pytest.skip(cluster.no_plugin)


@pytest.fixture
def job_env(c_build):
    """What a user's srun carries to its tasks (srun exports the caller's environment):
    fakecuda with two devices, and a runtime directory of the test's own, where the
    user's shared pumpd lives (so the test finds it, and no other test's is shared); short,
    so that the socket's path fits sun_path's 108 bytes (under pytest -n 2 one in tmp_path
    did not, and pump took /tmp/pump-<uid> instead: pump/runtime_dir.py)."""
    runtime = tempfile.mkdtemp(prefix="xdg-")  # mode 0700
    yield dict(clean_env(), LD_LIBRARY_PATH=str(c_build / "plain"), FAKECUDA_DEVICES="2",
               XDG_RUNTIME_DIR=runtime, PUMP_DAEMON_GRACE="1")
    shutil.rmtree(runtime, ignore_errors=True)


def jobs(socket):
    with protocol.Client(str(socket)) as client:
        return client.request({"op": "status"})


def results(stdout):
    return [json.loads(line) for line in stdout.splitlines() if line.startswith('{"checksum"')]


def bare(c_build, env, device):
    """The `devices` program on its own, without pump or Slurm."""
    run = subprocess.run([str(c_build / "plain" / "devices"), str(device), str(device)], env=env,
                         capture_output=True, text=True, timeout=60)
    return results(run.stdout)[0]


def fakecuda_uuid(device: int) -> str:
    """fakecuda's UUID of a device, as pumpd writes it ("fakecuda" and 0x40 0x80 ... device)."""
    raw = b"fakecuda\x40\x80" + bytes(5) + bytes([device])
    h = raw.hex()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def shared_pumpd_socket(job_env) -> pathlib.Path:
    """The socket of the user's shared pumpd, once a task has started it."""
    return wait_for(lambda: list(pathlib.Path(job_env["XDG_RUNTIME_DIR"]).glob("pump/*/pumpd.sock")))[0]


def processes_with(text: str, runtime: str = None) -> list:
    """This machine's processes whose command line names text (a path of this test's); with
    runtime, only those whose environment has it as XDG_RUNTIME_DIR (a task of this test's job,
    not a program of the build another test runs under pytest -n 2)."""
    found = []
    for p in psutil.process_iter(["cmdline", "status"]):
        if text in " ".join(p.info["cmdline"] or []) and p.info["status"] != psutil.STATUS_ZOMBIE:
            try:
                if runtime is None or p.environ().get("XDG_RUNTIME_DIR") == runtime:
                    found.append(p)
            except psutil.Error:  # gone meanwhile, or not ours to read
                pass
    return found


def two_tasks_as_one_job(cluster, c_build, job_env, *srun_options, pump_run=(PUMP_RUN, "--")):
    """`srun -n 2 --gpus-per-task=1 [pump-run --] devices 0 0 hold`: while both tasks hold
    their session (srun gives every task its stdin, open until the test closes it), the
    user's shared pumpd shows one job; returns (that job, pumpd's status, the tasks' results)."""
    srun = subprocess.Popen(["srun", "-n", "2", "--gpus-per-task=1", *srun_options, *pump_run,
                             str(c_build / "plain" / "devices"), "0", "0", "hold"],
                            env=cluster.env(job_env), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        socket = shared_pumpd_socket(job_env)
        # (each task's GPU is known once pumpd has read its shim's first records)
        [job] = wait_for(lambda: [j for j in jobs(socket)["jobs"] if j["sessions"] == len(j["gpu_uuids"]) == 2])
        status = jobs(socket)
        status["table"] = subprocess.run([sys.executable, "-m", "pump.cli", "status", "--socket", str(socket)],
                                         capture_output=True, text=True, env=clean_env(), timeout=30).stdout
    finally:
        out, err = srun.communicate(timeout=60)
    assert srun.returncode == 0, err + cluster.logs()
    return job, status, results(out)


def check_one_job_on_two_gpus(job, status, got, expected, step="0"):
    slurm_job = job["group"].split("-")[1].split(".")[0]
    assert (job["name"], job["group"]) == (f"slurm-{slurm_job}.{step}",) * 2
    assert (job["ranks"], len(status["jobs"])) == ([0, 1], 1)
    row = status["table"].splitlines()[1].split()  # `pump status`: the job's name and ranks
    assert row[1] == job["name"] and "0-1" in row, status["table"]
    # Each task on the GPU Slurm bound it to: its device 0 is GPU 0 for one, GPU 1 for the other.
    assert job["gpu_uuids"] == [fakecuda_uuid(0), fakecuda_uuid(1)], job
    assert [r["checksum"] for r in got] == [e["checksum"] for e in expected], got
    assert [r["gpu_faults"] for r in got] == [0, 0] and all(e["gpu_faults"] == e["expected_faults"] for e in expected)


def nothing_left(c_build, job_env):
    """The shared pumpd ends its grace period (1 s) and exits; no task, nor the plugin's
    pump-run, remains."""
    wait_for(lambda: not processes_with(job_env["XDG_RUNTIME_DIR"])
             and not processes_with(str(c_build), job_env["XDG_RUNTIME_DIR"])
             and not processes_with(f"{PUMP_RUN} --serve-env"), 15)


def test_srun_tasks_are_one_job_on_their_own_gpus_in_the_users_shared_pumpd(cluster, c_build, job_env):
    expected = [bare(c_build, job_env, d) for d in (0, 1)]
    job, status, got = two_tasks_as_one_job(cluster, c_build, job_env)
    check_one_job_on_two_gpus(job, status, got, expected)
    assert job["pump_runs"] == 2  # a pump-run per task, joined
    nothing_left(c_build, job_env)


def test_the_spank_option_gives_the_tasks_pump_as_pump_run_does(cluster, plugin, c_build, job_env):
    expected = [bare(c_build, job_env, d) for d in (0, 1)]
    job, status, got = two_tasks_as_one_job(cluster, c_build, job_env, "--pump=launch", pump_run=())
    check_one_job_on_two_gpus(job, status, got, expected)
    assert (job["pump_runs"], job["policy"]) == (1, "launch")  # the plugin's one pump-run on the node
    nothing_left(c_build, job_env)
    # Its summary (every task's counters) is in slurmd's log.
    assert "pump: pump: 4 launches (4 on managed memory)" in (cluster.dir / "log" / "slurmd.log").read_text()


def test_the_spank_option_refuses_a_bad_policy(cluster, plugin, job_env):
    run = cluster.run(["srun", "--pump=fast", "true"], check=False, env=cluster.env(job_env))
    assert run.returncode != 0 and "--pump=fast: bad policy; allowed: off, launch, lookahead" in run.stderr
    usage = cluster.run(["sbatch", "--help"], env=cluster.env(job_env)).stdout
    assert "--pump=[POLICY]         run each task under pump" in usage, usage


def test_srun_tasks_join_the_system_pumpd_which_arbitrates_them_with_other_jobs(cluster, c_build, job_env, tmp_path):
    """The node's service (here a pumpd on PUMP_SOCKET with a 128 MiB GPU pool) takes the
    step's tasks as one job, and divides its pool between that job and another."""
    config = tmp_path / "pumpd.toml"
    config.write_text('[budgets]\ngpu_pool = "128MiB"\n')
    socket = tmp_path / "pumpd.sock"
    daemon = start_pumpd(socket, "--config", str(config))
    env = dict(job_env, PUMP_SOCKET=str(socket))
    try:
        other = subprocess.Popen([PUMP_RUN, "--name", "other", "--", str(c_build / "plain" / "devices"), "0", "0",
                                  "hold"], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        srun = subprocess.Popen(["srun", "-n", "2", "--gpus-per-task=1", PUMP_RUN, "--",
                                 str(c_build / "plain" / "devices"), "0", "0", "hold"],
                                env=cluster.env(env), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        try:
            wait_for(lambda: sorted(j["sessions"] for j in jobs(socket)["jobs"]) == [1, 2])
            status = jobs(socket)
        finally:
            out, err = srun.communicate(timeout=60)
            other.communicate(timeout=60)
        assert srun.returncode == other.returncode == 0, err + cluster.logs()
        by_name = {j["name"]: j for j in status["jobs"]}
        step = next(name for name in by_name if name.startswith("slurm-"))
        assert (by_name[step]["ranks"], by_name[step]["pump_runs"]) == ([0, 1], 2)
        assert [(j["budget_bytes"], j["budget_source"]) for j in by_name.values()] == [(64 * MiB, "arbiter")] * 2
        assert status["pools"] == [{"gpu": 0, "pool_bytes": 128 * MiB, "assigned_bytes": 128 * MiB, "jobs": 2,
                                    "unmet": 0}]
        assert [r["gpu_faults"] for r in results(out)] == [0, 0]
        wait_for(lambda: jobs(socket)["jobs"] == [])
        # No pumpd of the user's was started: the system's answered.
        assert not list(pathlib.Path(job_env["XDG_RUNTIME_DIR"]).glob("pump/*/pumpd.sock"))
    finally:
        stop_pumpd(daemon)


@pytest.mark.parametrize("how", ["pump-run", "#SBATCH --pump"])
def test_a_batch_script_is_one_job_named_after_its_batch_step(cluster, c_build, job_env, tmp_path, how, request):
    """pump-run in an sbatch script, or the plugin's `#SBATCH --pump`; the script's program
    holds until the test closes the FIFO it reads."""
    if how != "pump-run":
        request.getfixturevalue("plugin")
    hold, out = tmp_path / "hold", tmp_path / "out"
    os.mkfifo(hold)
    devices = str(c_build / "plain" / "devices")
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/sh\n" + f"#SBATCH --output={out}\n"
                      + ("#SBATCH --pump\n" if how != "pump-run" else "")
                      + f"exec {PUMP_RUN + ' -- ' if how == 'pump-run' else ''}{devices} 0 0 hold < {hold}\n")
    writer = os.open(hold, os.O_RDWR)  # never blocks; the script's read ends when it closes
    try:
        slurm_job = cluster.run(["sbatch", "--parsable", str(script)], env=cluster.env(job_env)).stdout.strip()
        socket = shared_pumpd_socket(job_env)
        [job] = wait_for(lambda: [j for j in jobs(socket)["jobs"] if j["sessions"] == 1])
    finally:
        os.close(writer)
    cluster.wait_idle()
    assert (job["name"], job["group"], job["ranks"]) == (f"slurm-{slurm_job}.batch",) * 2 + ([0],)
    got = results(out.read_text())
    expected = bare(c_build, job_env, 0)
    assert [(r["checksum"], r["gpu_faults"]) for r in got] == [(expected["checksum"], 0)], out.read_text()
    nothing_left(c_build, job_env)


PROBE = """#!/bin/sh
# Stands in for pump-run --serve-env: says the ids it runs with as a variable, or fails
# (asked with a PUMP_ variable: the plugin passes pump-run only the variables it reads).
if [ -n "$PUMP_PROBE_FAIL" ]; then echo "probe: failing as asked" >&2; exit 3; fi
printf 'PROBE_IDS=%s\\0\\0' "$(grep -E '^([UG]id|Groups|NoNewPrivs):' /proc/self/status | tr -s '\\t' ' ' | tr '\\n' ';')"
exec cat > /dev/null
"""


@pytest.fixture
def probe_cluster(plugin, cluster):
    """A second cluster whose plugin runs PROBE in pump-run's place, in a directory uid
    65534 can reach (pytest's are private)."""
    directory = pathlib.Path(tempfile.mkdtemp(prefix="pump-slurm-"))
    directory.chmod(0o755)
    probe = directory / "probe"
    probe.write_text(PROBE)
    probe.chmod(0o755)
    (directory / "slurm").mkdir()
    c = SlurmCluster(directory / "slurm", f"required {cluster.dir / 'spank_pump.so'} pump_run={probe}\n")
    try:
        with c.running():
            yield c
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def test_the_plugin_runs_pump_run_as_the_job_user_alone_and_survives_its_failure(probe_cluster):
    """The plugin's hook runs with root's real and saved uid: its pump-run must hold the job
    user's ids and groups alone, with no_new_privs (else the user's environment, PYTHONPATH and all, would
    run code as root); a pump-run that fails leaves the tasks running without pump, said
    on the step's stderr."""
    env = probe_cluster.env(clean_env("XDG_RUNTIME_DIR"))
    run = probe_cluster.run(["srun", "--uid=65534", "--gid=65534", "--pump", "sh", "-c", 'echo "$PROBE_IDS"'],
                            env=env, cwd="/")
    assert run.stdout.split() == ["Uid:", "65534", "65534", "65534", "65534;Gid:", "65534", "65534", "65534",
                                  "65534;Groups:", "65534", ";NoNewPrivs:", "1;"], run.stdout
    failed = probe_cluster.run(["srun", "--pump", "sh", "-c", 'echo "ran: ${PROBE_IDS:-without pump}"'],
                               env=dict(env, PUMP_PROBE_FAIL="1"), cwd="/")
    assert failed.stdout == "ran: without pump\n"
    assert "--serve-env gave no environment; the tasks run without pump" in failed.stderr, failed.stderr
    log = (probe_cluster.dir / "log" / "slurmd.log").read_text()
    assert "pump: probe: failing as asked" in log and "--serve-env ended with status 3" in log, log


def test_the_spank_option_gives_the_variables_pump_run_gives(cluster, plugin, job_env):
    """The same variables, with the same values, as `srun pump-run` gives its command, but
    those that name one pump-run (its job, its counters' directory, its watchdog)."""
    def variables(*argv):
        out = cluster.run(["srun", *argv, "/usr/bin/env", "-0"], env=cluster.env(job_env)).stdout
        return {k: v for k, v in (e.split("=", 1) for e in out.split("\0") if e)
                if job_env.get(k) != v and not k.startswith(("SLURM_", "SLURMD_"))}  # Slurm's own: per run
    own = ("PUMP_JOB", "PUMP_STATS_DIR", "PUMP_RUN_TOKEN")
    by_plugin = variables("--pump")
    by_pump_run = variables(PUMP_RUN, "--")
    assert {"LD_PRELOAD", "PUMP_JOB", "PUMP_SOCKET", "PUMP_STATS_DIR"} <= set(by_plugin), by_plugin
    assert {k: v for k, v in by_plugin.items() if k not in own} == \
        {k: v for k, v in by_pump_run.items() if k not in own}
