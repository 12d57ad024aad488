"""Which GPU each job uses: the shim's DEVICE records (CUDA ordinal and UUID), decoded
(pump/channel.py), shown (`pump trace show`), and used by pumpd, which matches each UUID
to an NVML index and counts each job against the pools of the GPUs it uses (the
arbiter's division with two GPUs; NVML simulated by a pynvml stand-in, in-process and
on pumpd's PYTHONPATH); with the fake shim and with the real one on fakecuda device 1."""

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from fakeshim import FakeShim
from helpers import PUMP_RUN, clean_env, start_pumpd, stop_pumpd
from pump import channel, protocol
from pumpd.arbiter import Arbiter, Terms
from pumpd.jobs import Job
from test_daemon import status, wait_for

MiB = 1 << 20
PUMP = str(pathlib.Path(sys.executable).parent / "pump")


def fakecuda_uuid_bytes(device: int) -> bytes:
    """fakecuda's UUID of a device (fakecuda/device.c)."""
    return b"fakecuda\x40\x80" + bytes(5) + bytes([device])


FAKE0, FAKE1 = (channel.uuid_from_cuda_bytes(fakecuda_uuid_bytes(d)) for d in (0, 1))
assert FAKE1 == "GPU-66616b65-6375-6461-4080-000000000001"


def device_args(uuid: str):
    """A DEVICE record's arg0 and arg1 for a UUID spelled as NVML spells it."""
    raw = bytes.fromhex(uuid[4:].replace("-", ""))
    return int.from_bytes(raw[:8], "little"), int.from_bytes(raw[8:], "little")


def device_record(device: int, uuid: str, count: int = channel.UUID_BYTES) -> np.ndarray:
    r = np.zeros(1, channel.EVENT)
    r["kind"], r["count"], r["device"] = channel.KIND["device"], count, device
    r["arg"][0, :2] = device_args(uuid)
    return r


# ---- decoding and showing ----

def test_decode_gives_each_ordinal_its_uuid():
    batch = channel.decode(np.concatenate([device_record(1, FAKE1), device_record(0, FAKE0)]))
    assert batch.devices == [(1, FAKE1), (0, FAKE0)]
    assert (batch.invalid, batch.problems) == (0, [])


@pytest.mark.parametrize("device, count, problem", [
    (-1, 16, "DEVICE record with CUDA ordinal -1; ordinals are 0..63"),
    (64, 16, "DEVICE record with CUDA ordinal 64; ordinals are 0..63"),
    (2, 8, "DEVICE record for device 2 with count 8; it carries a 16-byte UUID"),
])
def test_a_malformed_device_record_is_rejected_and_named(device, count, problem):
    batch = channel.decode(np.concatenate([device_record(device, FAKE1, count), device_record(0, FAKE0)]))
    assert batch.devices == [(0, FAKE0)]  # the good one after it still counts
    assert (batch.invalid, batch.problems) == (1, [problem])


def test_pump_trace_show_prints_the_uuid_as_nvml_does(tmp_path):
    from pump import trace
    path = tmp_path / "t.trace"
    w = trace.TraceWriter(os.open(path, os.O_WRONLY | os.O_CREAT, 0o644), "j1", "devices")
    w.write(11, np.concatenate([device_record(1, FAKE1), device_record(-3, FAKE0)]))
    w.close()
    shown = subprocess.run([PUMP, "trace", "show", str(path)], capture_output=True, text=True, timeout=30)
    assert shown.returncode == 0, shown.stderr
    lines = [line.split(None, 3) for line in shown.stdout.splitlines()[1:]]
    assert [(pid, kind, what) for pid, _ms, kind, what in lines] == [
        ("11", "device", f"1 {FAKE1}"),
        ("11", "device", "invalid: DEVICE record with CUDA ordinal -3; ordinals are 0..63")]
    doc = json.loads(subprocess.run([PUMP, "trace", "stats", "--json", str(path)], capture_output=True,
                                    text=True, timeout=30).stdout)
    assert doc["kinds"]["device"] == 2


# ---- the arbiter with two GPUs (NVML lists them in the other order than CUDA) ----

NVML_SAMPLE = {"gpus": [{"index": 0, "uuid": FAKE1, "memory_total": 80 << 30},
                        {"index": 1, "uuid": FAKE0.upper(), "memory_total": 40 << 30}]}


def jobs_on(*placements, **terms):
    """A Job per placement (the GPU UUIDs its processes named), named a, b, c, ..."""
    jobs = []
    for i, uuids in enumerate(placements):
        job = Job(f"j{i}", "abcdefgh"[i], 0, 100 + i, 0.0, created=float(i))
        job.terms = Terms(gpu_uuids=list(uuids), **terms)
        jobs.append(job)
    return jobs


def divided(pool, jobs, sample=NVML_SAMPLE):
    arbiter = Arbiter(pool)
    arbiter.observe_telemetry(sample)
    arbiter.apply(jobs)
    return {j.name: (j.budget, j.terms.gpus) for j in jobs}, sorted(arbiter.pools.values(), key=lambda p: p["gpu"])


def test_jobs_on_different_gpus_each_get_their_gpu_s_pool():
    budgets, pools = divided("24MiB", jobs_on([FAKE0], [FAKE1], [FAKE1]))
    # FAKE1 is NVML's GPU 0 (shared by b and c), FAKE0 NVML's GPU 1 (a alone).
    assert budgets == {"a": (24 * MiB, [1]), "b": (12 * MiB, [0]), "c": (12 * MiB, [0])}
    assert pools == [{"gpu": 0, "pool_bytes": 24 * MiB, "assigned_bytes": 24 * MiB, "jobs": 2, "unmet": 0},
                     {"gpu": 1, "pool_bytes": 24 * MiB, "assigned_bytes": 24 * MiB, "jobs": 1, "unmet": 0}]


def test_a_percentage_pool_is_each_gpu_s_own_memory():
    budgets, _ = divided("50%", jobs_on([FAKE0], [FAKE1]))
    assert budgets == {"a": (20 << 30, [1]), "b": (40 << 30, [0])}


def test_a_job_seen_on_no_device_stays_on_gpu_0():
    budgets, pools = divided("24MiB", jobs_on([], [FAKE1], [FAKE0]))
    assert budgets == {"a": (12 * MiB, [0]), "b": (12 * MiB, [0]), "c": (24 * MiB, [1])}
    assert [p["jobs"] for p in pools] == [2, 1]


def test_a_job_on_two_gpus_counts_on_both_and_takes_its_least_grant():
    # GPU 0 (FAKE1): a, b, c share; GPU 1 (FAKE0): a and d.  a gets 8 on GPU 0, 12 on GPU 1: 8.
    budgets, pools = divided("24MiB", jobs_on([FAKE0, FAKE1], [FAKE1], [FAKE1], [FAKE0]))
    assert budgets == {"a": (8 * MiB, [0, 1]), "b": (8 * MiB, [0]), "c": (8 * MiB, [0]), "d": (12 * MiB, [1])}
    # On GPU 1, a holds 8 of its 12 MiB grant: 4 MiB stay unassigned.
    assert [(p["gpu"], p["jobs"], p["assigned_bytes"]) for p in pools] == [(0, 3, 24 * MiB), (1, 2, 20 * MiB)]


def test_a_minimum_is_met_only_where_it_fits_on_every_gpu():
    jobs = jobs_on([FAKE0, FAKE1], [FAKE0], min_bytes=16 * MiB)
    jobs[1].terms.promised = True  # b holds 16 MiB of GPU 1 (FAKE0) already
    divided("24MiB", jobs)
    assert (jobs[0].terms.state, jobs[0].terms.promised) == ("unmet", False)
    assert jobs[0].budget == 8 * MiB  # what GPU 1 has left; GPU 0 alone would give 24


def test_without_nvml_the_uuids_are_shown_but_every_job_counts_on_gpu_0(caplog):
    budgets, _ = divided("24MiB", jobs_on([FAKE0], [FAKE1]), sample=None)
    assert budgets == {"a": (12 * MiB, [0]), "b": (12 * MiB, [0])}
    assert "NVML lists no GPU" in caplog.text


def test_terms_of_an_older_pumpd_with_gpu_0_still_load():
    terms = Terms.from_json({**Terms(share=2.0).to_json(), "gpu": 0})
    assert (terms.share, terms.gpu_uuids, terms.gpus) == (2.0, [], [])


# ---- inside pumpd, NVML simulated on its PYTHONPATH ----

FAKE_PYNVML = '''
"""pynvml for pumpd under test: the GPUs below, in NVML's order."""
GPUS = {gpus!r}
NVML_PCIE_UTIL_TX_BYTES, NVML_PCIE_UTIL_RX_BYTES = 0, 1


class _Memory:
    def __init__(self, total):
        self.total, self.used, self.free = total, 0, total


class _Utilization:
    gpu = memory = 0


def nvmlInit():
    pass


def nvmlShutdown():
    pass


def nvmlDeviceGetCount():
    return len(GPUS)


def nvmlDeviceGetHandleByIndex(index):
    return index


def nvmlDeviceGetUUID(handle):
    return GPUS[handle][0]


def nvmlDeviceGetName(handle):
    return "fake GPU %d" % handle


def nvmlDeviceGetMemoryInfo(handle):
    return _Memory(GPUS[handle][1])


def nvmlDeviceGetPcieThroughput(handle, counter):
    return 0


def nvmlDeviceGetUtilizationRates(handle):
    return _Utilization()
'''


@pytest.fixture
def nvml_pumpd(tmp_path):
    """A pumpd with a 24 MiB pool per GPU whose NVML lists fakecuda device 1 as GPU 0 and
    device 0 as GPU 1 (as CUDA_VISIBLE_DEVICES=1,0 would number them)."""
    nvml_dir = tmp_path / "nvml"
    nvml_dir.mkdir()
    (nvml_dir / "pynvml.py").write_text(FAKE_PYNVML.format(gpus=[(FAKE1, 80 << 30), (FAKE0, 40 << 30)]))
    toml = tmp_path / "pumpd.toml"
    toml.write_text('[budgets]\ngpu_pool = "24MiB"\n[telemetry]\ninterval_s = 0.1\n')
    path = str(tmp_path / "pumpd.sock")
    env = dict(clean_env(), PYTHONPATH=str(nvml_dir))
    start = lambda: start_pumpd(path, "--config", str(toml), env=env,  # noqa: E731
                                stderr=subprocess.PIPE, text=True)
    procs = [start()]
    yield path, procs, start
    for proc in procs:
        stop_pumpd(proc)


def register(path, name):
    with protocol.Client(path) as c:
        return c.request({"op": "register", "name": name, "policy": "launch"})["job"]


def by_name(path):
    return {j["name"]: j for j in status(path)}


def placed(path, expected):
    """Each named job's (gpu_uuids, gpus, budget_bytes) in pumpd's status is as expected."""
    jobs = by_name(path)
    return all(name in jobs and (jobs[name]["gpu_uuids"], jobs[name]["gpus"], jobs[name]["budget_bytes"]) == want
               for name, want in expected.items())


def test_pumpd_divides_per_gpu_by_uuid(nvml_pumpd):
    path, _, _ = nvml_pumpd
    a, b = FakeShim(path, job=register(path, "a")), FakeShim(path, job=register(path, "b"))
    # Neither has named a device: both on GPU 0, sharing its pool.
    assert wait_for(lambda: placed(path, {"a": ([], [0], 12 * MiB), "b": ([], [0], 12 * MiB)}))
    a.emit("device", *device_args(FAKE0), count=16, device=0)   # NVML's GPU 1
    assert wait_for(lambda: placed(path, {"a": ([FAKE0], [1], 24 * MiB), "b": ([], [0], 24 * MiB)}))
    assert wait_for(lambda: (a.plan.budget_bytes, b.plan.budget_bytes) == (24 * MiB, 24 * MiB))
    b.emit("device", *device_args(FAKE0), count=16, device=0)
    assert wait_for(lambda: placed(path, {"a": ([FAKE0], [1], 12 * MiB), "b": ([FAKE0], [1], 12 * MiB)}))
    # a also works on FAKE1 (its device 1): counted on both GPUs; 12 MiB on GPU 1 is its least.
    a.emit("device", *device_args(FAKE1), count=16, device=1)
    assert wait_for(lambda: placed(path, {"a": ([FAKE0, FAKE1], [0, 1], 12 * MiB)}))
    with protocol.Client(path) as c:
        pools = sorted(c.request({"op": "status"})["pools"], key=lambda p: p["gpu"])
    assert [(p["gpu"], p["jobs"], p["assigned_bytes"]) for p in pools] == [(0, 1, 12 * MiB), (1, 2, 24 * MiB)]
    a.close()
    b.close()


def test_a_malformed_device_record_is_refused_and_the_session_goes_on(nvml_pumpd):
    path, procs, _ = nvml_pumpd
    shim = FakeShim(path, job=register(path, "a"))
    shim.emit("device", *device_args(FAKE1), count=16, device=-5)
    shim.emit("device", *device_args(FAKE1), count=16, device=1)
    shim.emit("device", *device_args(FAKE0), count=16, device=1)  # ordinal 1 named again, as another GPU
    shim.emit("alloc", 1 << 30, 4 << 20, 1, count=1, device=-1)
    assert wait_for(lambda: placed(path, {"a": ([FAKE1], [0], 24 * MiB)}))
    assert wait_for(lambda: by_name(path)["a"]["events"] == 4)
    assert by_name(path)["a"]["events_invalid"] == 2
    shim.close()
    stop_pumpd(procs[0])
    log = procs[0].stderr.read()
    assert "(pid %d): DEVICE record with CUDA ordinal -5; ordinals are 0..63: record ignored" % os.getpid() in log
    assert log.count("record ignored") == 1  # once per session


def test_a_job_s_gpus_survive_a_pumpd_restart(nvml_pumpd):
    path, procs, start = nvml_pumpd
    job = register(path, "a")
    shim = FakeShim(path, job=job)
    shim.emit("device", *device_args(FAKE0), count=16, device=0)
    assert wait_for(lambda: placed(path, {"a": ([FAKE0], [1], 24 * MiB)}))
    # pumpd writes a job's file off its loop, soon after the change (jobs.py, JobStore.save):
    # a kill -9 before that write loses the change (the real shim names its GPUs again when it
    # resumes; this fake one does not). Two pytest workers on two cores delayed it past the kill.
    saved = pathlib.Path(path).parent / "jobs" / f"{job}.json"
    assert wait_for(lambda: saved.exists() and FAKE0 in saved.read_text())
    procs[0].kill()
    procs[0].wait()
    procs.append(start())
    b = register(path, "b")  # comes after the restart, names no device: GPU 0, alone
    # The new pumpd reads its state back and asks NVML again: slower than 5 s on a loaded host.
    assert wait_for(lambda: placed(path, {"a": ([FAKE0], [1], 24 * MiB), "b": ([], [0], 24 * MiB)}), timeout=30), \
        by_name(path)
    assert b
    shim.close()


# ---- the real shim: a fakecuda program on device 1 of 2 under pump-run ----

class HeldJob:
    """tests/c/devices.c on one device under pump-run and the system pumpd, held running
    until stop()."""

    def __init__(self, c_build, path, tmp_path, name, device):
        self.dir = tmp_path / name
        self.dir.mkdir()
        env = dict(clean_env(), LD_LIBRARY_PATH=str(c_build / "plain"), FAKECUDA_DEVICES="2", TMPDIR=str(self.dir))
        self.proc = subprocess.Popen([PUMP_RUN, "--daemon", "system", "--socket", path, "--name", name, "--",
                                      str(c_build / "plain" / "devices"), str(device), str(device), "hold"],
                                     env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        self.result = json.loads(self.proc.stdout.readline())

    def stop(self):
        _, err = self.proc.communicate(timeout=60)
        assert self.proc.returncode == 0, err
        return err


def test_pumpd_shows_a_real_job_on_the_uuid_of_its_device(c_build, nvml_pumpd, tmp_path):
    path, _, _ = nvml_pumpd
    jobs = []
    try:
        jobs.append(HeldJob(c_build, path, tmp_path, "one", 1))
        assert jobs[0].result["contexts"] == [0, 1]  # device 1 only
        assert wait_for(lambda: placed(path, {"one": ([FAKE1], [0], 24 * MiB)}), timeout=30), by_name(path)
        jobs.append(HeldJob(c_build, path, tmp_path, "zero", 0))
        # Each alone on its GPU: the whole pool each.
        assert wait_for(lambda: placed(path, {"one": ([FAKE1], [0], 24 * MiB), "zero": ([FAKE0], [1], 24 * MiB)}),
                        timeout=30), by_name(path)
        env = dict(clean_env(), PUMP_SOCKET=path, TMPDIR=str(tmp_path))
        doc = json.loads(subprocess.run([PUMP, "status", "--json"], env=env, capture_output=True, text=True,
                                        cwd="/", timeout=30).stdout)
        shown = {j["name"]: (j["gpu_uuids"], j["gpus"]) for j in doc["jobs"]}
        assert shown == {"one": ([FAKE1], [0]), "zero": ([FAKE0], [1])}
    finally:
        for job in jobs:
            job.stop()  # closes its stdin: the program ends
