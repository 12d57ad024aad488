"""pumpd's telemetry: NVML through a fake pynvml module (no GPU or NVML here),
process trees on real processes."""

import logging
import subprocess
import sys
import textwrap
import time
import types
from pathlib import Path
from unittest.mock import patch

import psutil
import pytest


from pump.channel import uuid_from_cuda_bytes  # noqa: E402
from pumpd.telemetry import Telemetry  # noqa: E402

UUID0 = "GPU-11111111-2222-3333-4444-555555555555"
UUID1 = "GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"


class NVMLError(Exception):
    pass


class NVMLError_NotSupported(NVMLError):
    pass


class NVMLError_LibraryNotFound(NVMLError):
    pass


def fake_pynvml(init_error=None, unsupported=()):
    """A pynvml look-alike with two GPUs. ``unsupported``: (index, function
    name) pairs that raise NVMLError_NotSupported."""
    m = types.ModuleType("pynvml")
    m.NVMLError = NVMLError
    m.NVMLError_NotSupported = NVMLError_NotSupported
    m.NVML_PCIE_UTIL_TX_BYTES, m.NVML_PCIE_UTIL_RX_BYTES = 0, 1
    m.calls = []
    gpus = [
        dict(uuid=UUID0, name="Fake A100", used=1 << 30, total=40 << 30, tx=1000, rx=2000, util=37),
        dict(uuid=UUID1.encode(), name=b"Fake H100", used=2 << 30, total=80 << 30, tx=3, rx=4, util=99),
    ]

    def call(name, index):
        m.calls.append(name)
        if (index, name) in unsupported:
            raise NVMLError_NotSupported("Not Supported")
        return gpus[index]

    def nvmlInit():
        m.calls.append("nvmlInit")
        if init_error:
            raise init_error

    m.nvmlInit = nvmlInit
    m.nvmlShutdown = lambda: m.calls.append("nvmlShutdown")
    m.nvmlDeviceGetCount = lambda: len(gpus)
    m.nvmlDeviceGetHandleByIndex = lambda i: i
    m.nvmlDeviceGetUUID = lambda h: call("nvmlDeviceGetUUID", h)["uuid"]
    m.nvmlDeviceGetName = lambda h: call("nvmlDeviceGetName", h)["name"]
    m.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(
        used=call("nvmlDeviceGetMemoryInfo", h)["used"], total=gpus[h]["total"],
        free=gpus[h]["total"] - gpus[h]["used"])
    m.nvmlDeviceGetPcieThroughput = lambda h, c: call("nvmlDeviceGetPcieThroughput", h)["rx" if c else "tx"]
    m.nvmlDeviceGetUtilizationRates = lambda h: types.SimpleNamespace(
        gpu=call("nvmlDeviceGetUtilizationRates", h)["util"], memory=5)
    return m


def test_sample_two_gpus():
    fake = fake_pynvml()
    with patch.dict("sys.modules", {"pynvml": fake}):
        t = Telemetry()
        s = t.sample()
        s2 = t.sample()
    assert s["nvml"] == "ok"
    assert fake.calls.count("nvmlInit") == 1 and s2["gpus"] == s["gpus"]
    g0, g1 = s["gpus"]
    assert g0 == {"uuid": UUID0, "index": 0, "name": "Fake A100", "memory_used": 1 << 30,
                  "memory_total": 40 << 30, "pcie_tx_bytes_per_s": 1000 * 1024,
                  "pcie_rx_bytes_per_s": 2000 * 1024, "utilization_gpu": 37}
    # bytes from old pynvml versions become str
    assert (g1["uuid"], g1["name"], g1["index"]) == (UUID1, "Fake H100", 1)
    assert (g1["pcie_tx_bytes_per_s"], g1["pcie_rx_bytes_per_s"]) == (3072, 4096)
    vm = psutil.virtual_memory()
    assert s["host"]["memory_total"] == vm.total
    assert 0 < s["host"]["memory_available"] <= vm.total


def test_not_supported_field_is_none():
    fake = fake_pynvml(unsupported={(1, "nvmlDeviceGetPcieThroughput"), (0, "nvmlDeviceGetUtilizationRates"),
                                    (1, "nvmlDeviceGetMemoryInfo")})
    with patch.dict("sys.modules", {"pynvml": fake}):
        s = Telemetry().sample()
    g0, g1 = s["gpus"]
    assert s["nvml"] == "ok"
    assert g0["utilization_gpu"] is None and g0["pcie_tx_bytes_per_s"] == 1024000
    assert g1["pcie_tx_bytes_per_s"] is None and g1["pcie_rx_bytes_per_s"] is None
    assert g1["memory_used"] is None and g1["memory_total"] is None
    assert g1["utilization_gpu"] == 99 and g1["uuid"] == UUID1


def test_init_failure_logged_once(caplog):
    fake = fake_pynvml(init_error=NVMLError_LibraryNotFound("NVML Shared Library Not Found"))
    caplog.set_level(logging.DEBUG, logger="pumpd")
    with patch.dict("sys.modules", {"pynvml": fake}):
        t = Telemetry(retry_s=0)  # nvmlInit tried again at every sample
        samples = [t.sample() for _ in range(4)]
        assert t.cuda_to_nvml([UUID0]) == {}
    assert fake.calls.count("nvmlInit") == 5
    for s in samples:
        assert s["gpus"] == []
        assert "nvmlInit failed" in s["nvml"] and "Not Found" in s["nvml"]
        assert s["host"]["memory_total"] > 0
    records = [r for r in caplog.records if r.name == "pumpd"]
    assert len(records) == 1, [r.getMessage() for r in records]
    assert "NVML Shared Library Not Found" in records[0].getMessage()


def test_init_retried_after_interval():
    fake = fake_pynvml(init_error=NVMLError_LibraryNotFound("no driver yet"))
    with patch.dict("sys.modules", {"pynvml": fake}):
        t = Telemetry(retry_s=3600)
        t.sample()
        t.sample()
        assert fake.calls.count("nvmlInit") == 1  # not before retry_s
        with patch("pumpd.telemetry.time.monotonic", return_value=time.monotonic() + 3601):
            fake_ok = fake_pynvml()
            with patch.dict("sys.modules", {"pynvml": fake_ok}):
                s = t.sample()
    assert s["nvml"] == "ok" and len(s["gpus"]) == 2


def test_pynvml_missing(caplog):
    caplog.set_level(logging.DEBUG, logger="pumpd")
    with patch.dict("sys.modules", {"pynvml": None}):  # import raises ImportError
        t = Telemetry()
        s = [t.sample() for _ in range(3)]
    assert all(x["gpus"] == [] and "pynvml not importable" in x["nvml"] for x in s)
    assert len([r for r in caplog.records if r.name == "pumpd"]) == 1


def test_disabled_never_imports():
    fake = fake_pynvml()
    with patch.dict("sys.modules", {"pynvml": fake}):
        t = Telemetry(nvml=False)
        s = t.sample()
        t.shutdown()
    assert s["nvml"] == "disabled" and s["gpus"] == [] and fake.calls == []


def test_shutdown_only_if_inited():
    fake = fake_pynvml()
    with patch.dict("sys.modules", {"pynvml": fake}):
        t = Telemetry()
        t.shutdown()
        assert "nvmlShutdown" not in fake.calls
        t.sample()
        t.shutdown()
        t.shutdown()
    assert fake.calls.count("nvmlShutdown") == 1


def test_uuid_from_cuda_bytes():
    raw = bytes(range(16))
    assert uuid_from_cuda_bytes(raw) == "GPU-00010203-0405-0607-0809-0a0b0c0d0e0f"
    assert uuid_from_cuda_bytes(bytes.fromhex(UUID1[4:].replace("-", ""))) == UUID1
    with pytest.raises(ValueError):
        uuid_from_cuda_bytes(b"\0" * 15)


def test_cuda_to_nvml_reordered():
    """CUDA_VISIBLE_DEVICES=1,0 plus one GPU NVML does not list."""
    fake = fake_pynvml()
    cuda = [uuid_from_cuda_bytes(bytes.fromhex(UUID1[4:].replace("-", ""))),
            UUID0.upper(),                                # case does not matter
            "GPU-99999999-9999-9999-9999-999999999999"]   # unknown: left out
    with patch.dict("sys.modules", {"pynvml": fake}):
        assert Telemetry().cuda_to_nvml(cuda) == {0: 1, 1: 0}
        assert Telemetry().cuda_to_nvml([UUID0[4:], UUID1]) == {0: 0, 1: 1}


# -- process trees ---------------------------------------------------------

TREE = textwrap.dedent("""
    import subprocess, sys
    kids = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]),
            subprocess.Popen([sys.executable, "-c",
                "import subprocess, sys, time; "
                "g = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
                "print(g.pid, flush=True); time.sleep(60)"], stdout=subprocess.PIPE, text=True)]
    grandchild = kids[1].stdout.readline().strip()
    import time                       # CPU time of its own that the accounting cannot miss: four
    while time.process_time() < 0.1:  # interpreters' start-up read 0.0 s once on a loaded machine
        pass
    print(kids[0].pid, kids[1].pid, grandchild, flush=True)
    sys.stdin.readline()              # "reap": kill the first child and wait for it
    kids[0].kill(); kids[0].wait()
    print("reaped", flush=True)
    sys.stdin.readline()
""")


@pytest.fixture
def tree():
    root = subprocess.Popen([sys.executable, "-c", TREE], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    line = root.stdout.readline()
    try:
        yield root, [int(x) for x in line.split()]
    finally:
        procs = [psutil.Process(root.pid)]
        try:
            procs += procs[0].children(recursive=True)
        except psutil.NoSuchProcess:
            pass
        for p in procs:
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        root.wait()


def test_process_tree(tree):
    root, (child, middle, grandchild) = tree
    t = Telemetry.process_tree(root.pid)
    assert sorted(t["pids"]) == sorted([root.pid, child, middle, grandchild])
    rss = sum(psutil.Process(p).memory_info().rss for p in t["pids"])
    assert t["rss_bytes"] > 4 * (1 << 20)
    assert abs(t["rss_bytes"] - rss) < rss * 0.2
    assert t["cpu_seconds"] > 0
    assert Telemetry.process_tree(grandchild)["pids"] == [grandchild]


def test_process_tree_child_exits_midway(tree, monkeypatch):
    """A child in the process table is gone before it is read."""
    root, (child, middle, grandchild) = tree
    real_iter = psutil.process_iter

    def table_then_exit(*args, **kw):
        table = list(real_iter(*args, **kw))
        root.stdin.write("\n")
        root.stdin.flush()
        assert root.stdout.readline().strip() == "reaped"
        return table

    monkeypatch.setattr(psutil, "process_iter", table_then_exit)
    t = Telemetry.process_tree(root.pid)
    assert child not in t["pids"]
    assert sorted(t["pids"]) == sorted([root.pid, middle, grandchild])


def test_the_trees_of_many_jobs_are_read_in_one_pass_of_the_process_table(tree, monkeypatch):
    """Each job's tree as process_tree() gives it, from one read of the process table for all."""
    root, (child, middle, grandchild) = tree
    passes = []
    real_iter = psutil.process_iter
    monkeypatch.setattr(psutil, "process_iter", lambda *a, **k: passes.append(1) or real_iter(*a, **k))
    trees = Telemetry.process_trees([root.pid, middle, grandchild, 2 ** 22 + 7])
    assert len(passes) == 1
    assert sorted(trees[root.pid]["pids"]) == sorted([root.pid, child, middle, grandchild])
    assert sorted(trees[middle]["pids"]) == sorted([middle, grandchild]) and trees[grandchild]["pids"] == [grandchild]
    assert trees[2 ** 22 + 7] == {"pids": [], "rss_bytes": 0, "cpu_seconds": 0.0}


def test_process_tree_counts_exited_children_cpu():
    """CPU burnt by a worker that exited (and was waited for) still counts."""
    script = ("import subprocess, sys\n"
              "subprocess.run([sys.executable, '-c', "
              "'import time\\nt = time.process_time()\\nwhile time.process_time() - t < 0.4: pass'])\n"
              "print('done', flush=True)\n"
              "sys.stdin.readline()\n")
    p = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "done"
        t = Telemetry.process_tree(p.pid)
        assert t["pids"] == [p.pid]
        assert t["cpu_seconds"] >= 0.4
    finally:
        p.kill()
        p.wait()


def test_process_tree_unknown_pid():
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    assert Telemetry.process_tree(p.pid) == {"pids": [], "rss_bytes": 0, "cpu_seconds": 0.0}
