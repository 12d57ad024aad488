"""`pump-run torchrun ...`: the whole run is one pump job, each worker a member named by its
rank; an elastic restart (a worker killed with SIGKILL while it holds its session,
--max-restarts 1) keeps the job, drops the dead worker's session and takes the new
workers', and leaves nothing behind. Workers are fakecuda's `devices` program, each on the
device of its LOCAL_RANK (FAKECUDA_DEVICES=2); torchrun is the test extra's PyTorch's."""

import json
import os
import re
import pathlib
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from helpers import PUMP_RUN, clean_env, start_pumpd, stop_pumpd
from pump import protocol

TORCHRUN = pathlib.Path(sys.executable).parent / "torchrun"

# Rank 1's first attempt holds its session (its JSON line printed, stdin a FIFO nobody
# closes), is killed with SIGKILL, and fails the attempt; torchrun restarts both workers.
WORKER = textwrap.dedent("""\
    #!/bin/sh
    if [ "$RANK" = 1 ] && [ "$TORCHELASTIC_RESTART_COUNT" = 0 ]; then
        dir=$(mktemp -d); mkfifo "$dir/hold"
        "$DEVICES" "$LOCAL_RANK" "$LOCAL_RANK" hold < "$dir/hold" > "$dir/out" &
        victim=$!
        exec 3> "$dir/hold"
        while ! grep -q checksum "$dir/out"; do sleep 0.1; done
        cat "$dir/out"
        echo "$victim" > "$KILLED"
        kill -9 "$victim"; wait "$victim"
        rm -rf "$dir"
        exit 1
    fi
    exec "$DEVICES" "$LOCAL_RANK" "$LOCAL_RANK"
""")


@pytest.fixture
def daemon(tmp_path):
    socket = tmp_path / "pumpd.sock"
    proc = start_pumpd(socket)
    yield socket
    stop_pumpd(proc)


def jobs(socket):
    with protocol.Client(str(socket)) as client:
        return client.request({"op": "status"})["jobs"]


def results(stdout):
    return [json.loads(line) for line in stdout.splitlines() if line.startswith('{"checksum"')]


@pytest.mark.skipif(not TORCHRUN.exists(), reason="no torchrun beside this Python (pip install '.[test]')")
def test_an_elastic_restart_keeps_one_job_and_leaves_nothing(c_build, daemon, tmp_path):
    worker = tmp_path / "worker.sh"
    worker.write_text(WORKER)
    worker.chmod(0o755)
    killed = tmp_path / "killed"
    env = dict(clean_env(), LD_LIBRARY_PATH=str(c_build / "plain"), FAKECUDA_DEVICES="2",
               DEVICES=str(c_build / "plain" / "devices"), KILLED=str(killed))
    bare = [results(subprocess.run([str(c_build / "plain" / "devices"), d, d], env=env, capture_output=True,
                                   text=True, timeout=60).stdout)[0] for d in ("0", "1")]
    run = subprocess.Popen([PUMP_RUN, "--daemon", "system", "--socket", str(daemon), "--name", "elastic", "--",
                            str(TORCHRUN), "--standalone", "--nproc-per-node", "2", "--no-python",
                            "--max-restarts", "1", str(worker)],
                           env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen = []
    while run.poll() is None:  # the job as pump status shows it while the run goes on
        seen += [(j["name"], j["sessions"], tuple(j["ranks"])) for j in jobs(daemon)]
        time.sleep(0.05)
    out, err = run.communicate()
    assert run.returncode == 0, err[-3000:]
    # The workers computed what they compute without pump, and under pump nothing faulted.
    got = results(out)
    assert len(got) == 4, out  # two attempts, two workers each (the killed one printed first)
    assert {r["checksum"] for r in got} == {b["checksum"] for b in bare} and len({b["checksum"] for b in bare}) == 1
    assert [r["gpu_faults"] for r in got] == [0] * 4 and all(b["gpu_faults"] == b["expected_faults"] for b in bare)
    # One job throughout, its workers named by rank (a dead worker's session is dropped
    # within pumpd's liveness interval: at most both attempts' four at once).
    assert {name for name, _, _ in seen} == {"elastic"}, seen
    assert max(sessions for _, sessions, _ in seen) <= 4 and any(r == (0, 1) for _, _, r in seen), seen
    # Nothing left: the job is gone from pumpd with its sessions, no worker runs.
    assert jobs(daemon) == []
    victim = int(killed.read_text())
    assert not psutil.pid_exists(victim) or psutil.Process(victim).status() == psutil.STATUS_ZOMBIE
    left = [p for p in psutil.process_iter(["cmdline"]) if str(worker) in " ".join(p.info["cmdline"] or [])]
    assert left == [], left
    assert "pump: 8 launches (8 on managed memory)" in err and "4 processes" in err, err[-2000:]


@pytest.mark.skipif(not TORCHRUN.exists(), reason="no torchrun beside this Python (pip install '.[test]')")
def test_torchrun_outside_pump_run_still_makes_one_job(c_build, daemon, tmp_path):
    """`torchrun ... pump-run ...` (for users who cannot change the outer command): a pump-run
    per worker, joined by their group (the run id and torchrun's agent) into one job."""
    worker = tmp_path / "worker.sh"
    worker.write_text(f'#!/bin/sh\nexec "{PUMP_RUN}" --daemon system --socket "{daemon}" -- '
                      f'"$DEVICES" "$LOCAL_RANK" "$LOCAL_RANK" hold < "$HOLD"\n')
    worker.chmod(0o755)
    hold = tmp_path / "hold"
    os.mkfifo(hold)
    env = dict(clean_env(), LD_LIBRARY_PATH=str(c_build / "plain"), FAKECUDA_DEVICES="2",
               DEVICES=str(c_build / "plain" / "devices"), HOLD=str(hold))
    run = subprocess.Popen([str(TORCHRUN), "--standalone", "--nproc-per-node", "2", "--no-python", str(worker)],
                           env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    with open(hold, "w"):  # the workers hold until this closes
        deadline = time.monotonic() + 60
        while not [j for j in jobs(daemon) if j["sessions"] == 2] and time.monotonic() < deadline:
            time.sleep(0.1)
        [job] = jobs(daemon)
    out, err = run.communicate(timeout=120)
    assert run.returncode == 0, err[-3000:]
    # The group: the run id (--standalone makes one up) and torchrun's agent, the workers' parent.
    assert re.fullmatch(rf"torchrun-[\w.-]+-{run.pid}", job["group"]) and job["name"] == job["group"], job
    assert (job["pump_runs"], job["sessions"], job["ranks"]) == (2, 2, [0, 1])
    assert [r["gpu_faults"] for r in results(out)] == [0, 0]
    assert jobs(daemon) == []
