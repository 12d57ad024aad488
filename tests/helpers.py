"""What several test files share: the installed pump-run, an environment free of
pump's and fakecuda's variables, a pumpd to start and stop, and a job of another user
served while a test attacks pumpd."""

import importlib.machinery
import importlib.util
import os
import pathlib
import sys
import threading
import time

# The console script installed beside this Python: it imports the installed
# package (with libpump.so), never the source tree's.
PUMP_RUN = str(pathlib.Path(sys.executable).parent / "pump-run")
# pump-run's end line for a job none of whose processes called the CUDA driver (--quiet drops it).
IDLE = ("pump-run: pump was idle: no process of the job called the CUDA driver (a job on the CPU, "
        "or CUDA never initialised)\n")


def load_script(path, name):
    """A script of scripts/ (no .py suffix) loaded as a module, to test its functions."""
    loader = importlib.machinery.SourceFileLoader(name, str(path))
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader(name, loader))
    loader.exec_module(module)
    return module


def clean_env(*drop):
    """os.environ without LD_PRELOAD, PUMP_* and FAKECUDA_*, nor the names in drop."""
    gone = {"LD_PRELOAD", *drop}
    return {k: v for k, v in os.environ.items() if k not in gone and not k.startswith(("PUMP_", "FAKECUDA_"))}


def make_plan_pages(fd):
    """What the shim does when it maps a plan (shim/channel/channel_worker.c): reads each page
    once, so that the pages exist, in the job's memory; pumpd writes triggers only then."""
    import mmap

    from pump import channel
    mm = mmap.mmap(fd, channel.PLAN_SIZE, mmap.MAP_SHARED, mmap.PROT_READ)
    for offset in range(0, channel.PLAN_SIZE, mmap.PAGESIZE):
        mm[offset]
    mm.close()


def start_pumpd(socket_path, *args, env=None, timeout=15.0, **popen):
    """Start the installed pumpd on socket_path; return its Popen once it answers."""
    import subprocess

    from pump import protocol
    # cwd "/": the installed package, never the source tree's pump/ (python -m puts cwd first)
    proc = subprocess.Popen([sys.executable, "-m", "pumpd", "--socket", str(socket_path), "--foreground", *args],
                            env=env if env is not None else clean_env(), cwd="/", **popen)
    deadline = time.monotonic() + timeout
    while protocol.ping(str(socket_path), timeout=0.5) is None:
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"pumpd did not start (exit status {proc.wait()})")
        time.sleep(0.05)
    return proc


def markdown_table(path, header: str, nth: int = 0) -> list:
    """The rows of the nth Markdown table under the header line `header` in the file at path,
    each a list of its cells, stripped (a doc's table checked against committed results)."""
    lines = pathlib.Path(path).read_text().splitlines()
    at = [i for i, line in enumerate(lines) if line == header][nth]
    rows = []
    for line in lines[at + 2:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split("|")])
    return rows


def channel_record(kind: str, device: int, count: int, *args):
    """One ring record (pump_channel.h) of `kind`, for `device`, its arg words `args`."""
    import numpy as np

    from pump import channel
    r = np.zeros(1, channel.EVENT)
    r["kind"], r["count"], r["device"] = channel.KIND[kind], count, device
    r["arg"][0, :len(args)] = args
    return r


def ringless_session():
    """A pumpd session to ingest decoded batches into, with no ring behind it."""
    from pumpd.jobs import Session

    class NoRing:
        header = None

    return Session(1, os.getpid(), 0.0, NoRing(), None)


def stop_pumpd(proc):
    import subprocess
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()




class Served(threading.Thread):
    """A job of another user served while a test attacks: ping, status and an attach (the
    shim's session replaced each round) every 20 ms; what failed is kept."""

    def __init__(self, path, job=None):
        from pump import protocol
        super().__init__(daemon=True)
        self.path, self.rounds, self.failed, self.running = path, 0, [], True
        if job is None:
            with protocol.Client(path) as c:
                job = c.request({"op": "register", "name": "served"})["job"]
        self.job = job

    def round(self):
        from fakeshim import FakeShim
        from pump import protocol
        try:
            assert protocol.ping(self.path, timeout=2) is not None, "ping not answered"
            with protocol.Client(self.path, timeout=2) as c:
                assert self.job in [j["job"] for j in c.request({"op": "status"})["jobs"]]
            FakeShim(self.path, job=self.job, name="served").close()
        except (OSError, protocol.ProtocolError, AssertionError) as exc:
            self.failed.append(repr(exc))
        self.rounds += 1

    def run(self):
        while self.running:
            self.round()
            time.sleep(0.02)

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.running = False
        self.join()


# Why there is no real NVIDIA GPU and driver here (fakecuda does not count); exit 0 if there is.
_GPU_PROBE = """
import ctypes, sys
try:
    lib = ctypes.CDLL("libcuda.so.1")
except OSError:
    sys.exit("no CUDA driver (libcuda.so.1 does not load)")
if hasattr(lib, "fakecuda_register_kernel"):
    sys.exit("libcuda.so.1 is fakecuda, pump's CPU model")
rc = lib.cuInit(0)
if rc:
    sys.exit(f"cuInit failed with CUresult {rc}")
n = ctypes.c_int()
if lib.cuDeviceGetCount(ctypes.byref(n)) or n.value < 1:
    sys.exit("the CUDA driver sees no device")
"""
_no_gpu_reason = None


def no_gpu_reason() -> str:
    """Why no real GPU is here ("" when one is): asked once, in a child process, so that
    the test process itself never initialises CUDA."""
    global _no_gpu_reason
    if _no_gpu_reason is None:
        import subprocess
        probe = subprocess.run([sys.executable, "-c", _GPU_PROBE], env=clean_env(), capture_output=True,
                               text=True, timeout=60)
        _no_gpu_reason = "" if probe.returncode == 0 else (probe.stderr.strip().splitlines() or ["no GPU"])[-1]
    return _no_gpu_reason


def has_gpu() -> bool:
    return not no_gpu_reason()


def needs_gpu(test):
    """Marks a test `gpu` and skips it where there is no real GPU."""
    import pytest
    return pytest.mark.gpu(pytest.mark.skipif(not has_gpu(), reason=f"needs an NVIDIA GPU: {no_gpu_reason()}")(test))
