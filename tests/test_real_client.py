"""The real client: PyTorch's CUDA build (torch 2.14.1+cu130: its own cudart 13.0 and cuBLAS)
runs its host side on fakecuda with a GPU persona (FAKECUDA_PERSONA), unmodified: no
LD_PRELOAD, fakecuda as libcuda.so.1 on the library path. Issue 26 items 1 and 3.

The interpreter is PUMP_REAL_CLIENT_PYTHON (a virtual environment holding torch's CUDA build,
e.g. /work/venv-cuda/bin/python), or this one; where its torch is missing or not a CUDA build
the tests are skipped, saying so. What they check:
- the host side reaches what fakecuda models today: init, the persona's properties exactly,
  allocation, memory figures, streams and events, pinned host memory, copies, synchronize;
- what the runtime asked for and fakecuda lacks is exactly the committed ledger
  (fakecuda/real_client_not_found.txt: cuGetProcAddress names, refused export tables,
  unmodelled export-table slots), so a new runtime's new need fails here by name, not as a hang;
- kernels run from the runtime's real fatbins (issue 26 item 2): fill_, x + 1, and a cuBLAS
  matmul (cublasCreate asks the occupancy of clusters and CU_LIMIT_CIG_ENABLED). Kernels are
  no-ops on fakecuda: their results are not computed, so no value is checked."""

import json
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

from helpers import clean_env

ROOT = pathlib.Path(__file__).resolve().parent.parent
LEDGER = ROOT / "fakecuda" / "real_client_not_found.txt"
PYTHON = os.environ.get("PUMP_REAL_CLIENT_PYTHON") or sys.executable
# persona: (name, compute capability, total bytes, SMs, L2 bytes), as persona.c sources them
PERSONAS = {
    "h100-sxm-80gb": ("NVIDIA H100 80GB HBM3", [9, 0], 85017755648, 132, 52428800),
    "a100-pcie-40gb": ("NVIDIA A100-PCIE-40GB", [8, 0], 42298834944, 108, 41943040),
}

STEPS = textwrap.dedent(r"""
    import json, sys, time
    import torch
    steps = {}
    def step(name, fn):
        t = time.time()
        try:
            steps[name] = {"ok": True, "value": fn()}
        except Exception as e:
            steps[name] = {"ok": False, "error": f"{type(e).__name__}: {str(e).splitlines()[0]}"}
        steps[name]["s"] = round(time.time() - t, 3)
    def props():
        p = torch.cuda.get_device_properties(0)
        return [p.name, [p.major, p.minor], p.total_memory, p.multi_processor_count, p.L2_cache_size]
    def stream_event():
        s, e = torch.cuda.Stream(), torch.cuda.Event()
        e.record(s)
        e.synchronize()
        return e.query()
    step("is_available", torch.cuda.is_available)
    step("device_count", torch.cuda.device_count)
    step("properties", props)
    step("arch_list", torch.cuda.get_arch_list)
    step("empty", lambda: torch.empty(1024, device="cuda").numel())
    step("mem_get_info", lambda: list(torch.cuda.mem_get_info()))
    step("memory_stats", lambda: torch.cuda.memory_stats()["allocated_bytes.all.current"])
    step("stream_event", stream_event)
    step("copy_h2d", lambda: torch.ones(4).to("cuda").numel())
    step("pinned", lambda: torch.empty(4, pin_memory=True).is_pinned())
    step("pinned_copy", lambda: torch.ones(4, pin_memory=True).to("cuda", non_blocking=True).numel())
    step("synchronize", lambda: torch.cuda.synchronize() is None)
    if "kernels" in sys.argv:
        step("fill", lambda: torch.empty(4, device="cuda").fill_(1.0).numel())
        step("randn", lambda: torch.randn(64, device="cuda").numel())
        step("add", lambda: (torch.zeros(4, device="cuda") + 1).sum().item())
        step("matmul", lambda: (torch.ones(8, 8, device="cuda") @ torch.ones(8, 8, device="cuda")).sum().item())
    print(json.dumps({"torch": torch.__version__, "cuda": torch.version.cuda, "steps": steps}))
""")


@pytest.fixture(scope="module")
def cuda_torch():
    """The interpreter, if its torch is a CUDA build; else the test is skipped, saying why, or
    fails where PUMP_REAL_CLIENT_PYTHON named it (.ci/run does: the tier must run there)."""
    missing = pytest.fail if os.environ.get("PUMP_REAL_CLIENT_PYTHON") else pytest.skip
    probe = subprocess.run([PYTHON, "-c", "import torch; print(torch.version.cuda or '')"], capture_output=True,
                           text=True, timeout=300)
    if probe.returncode != 0:
        missing(f"no torch importable by {PYTHON} (set PUMP_REAL_CLIENT_PYTHON to a venv holding torch's "
                f"CUDA build: scripts/real-client-venv makes one): {probe.stderr.strip().splitlines()[-1:]}")
    if not probe.stdout.strip():
        missing(f"the torch of {PYTHON} is not a CUDA build (torch.version.cuda is None)")
    return PYTHON


def run_client(c_build, tmp_path, persona, *args):
    stats = tmp_path / f"fakecuda-{persona}.json"
    env = clean_env()
    env.update(LD_LIBRARY_PATH=str(c_build / "plain"), FAKECUDA_PERSONA=persona, FAKECUDA_STATS=str(stats))
    proc = subprocess.run([PYTHON, "-c", STEPS, *args], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    result["fakecuda"] = json.loads(stats.read_text())
    result["not_found"] = result["fakecuda"]["not_found"]
    print(json.dumps({k: v for k, v in result["steps"].items()}, indent=1))
    return result


@pytest.mark.parametrize("persona", sorted(PERSONAS))
def test_host_side_runs_on_the_persona(cuda_torch, c_build, tmp_path, persona):
    r = run_client(c_build, tmp_path, persona)
    steps = r["steps"]
    failed = {k: v["error"] for k, v in steps.items() if not v["ok"]}
    assert not failed, failed
    name, cc, total, sms, l2 = PERSONAS[persona]
    assert steps["is_available"]["value"] is True and steps["device_count"]["value"] == 1
    assert steps["properties"]["value"] == [name, cc, total, sms, l2]
    assert f"sm_{cc[0]}{cc[1]}" in steps["arch_list"]["value"]  # the runtime has cubins for it
    free, tot = steps["mem_get_info"]["value"]
    assert tot == total and 0 < free <= total
    assert steps["stream_event"]["value"] is True
    assert steps["pinned"]["value"] is True  # page-locked host memory, as PyTorch asks for it


OPTIONAL_PREFIXES = ("cuGreenCtx", "cuDevResource", "cuDevSmResource", "cuDeviceGetDevResource", "cuCtxFromGreenCtx",
                     "cuMulticast")


def ledger():
    """{kind: set of names} from the committed ledger ("kind name" per line, # comments; "" is the
    empty name, which the runtime looks up too)."""
    out = {"cuGetProcAddress": set(), "cuGetExportTable": set(), "export_table_slot": set()}
    for line in LEDGER.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            kind, name = line.split()
            out[kind].add("" if name == '""' else name)
    return out


def test_what_the_runtime_asked_for_and_lacks_is_the_ledger(cuda_torch, c_build, tmp_path):
    """Exactly the ledger: a name more is a new need of the runtime (model it, or add it to the
    ledger saying why not); a name fewer is one fakecuda now has (drop it from the ledger)."""
    r = run_client(c_build, tmp_path, "h100-sxm-80gb")
    seen = {kind: set(names) for kind, names in r["not_found"].items() if kind != "unnamed"}
    assert r["not_found"]["unnamed"] == 0
    want = ledger()
    # PyTorch's optional entry points (the ledger's comment) are looked up all or none: torch 2.11
    # asks for none of them, 2.14 and 2.15 for all
    optional = {name for name in want["cuGetProcAddress"] if name.startswith(OPTIONAL_PREFIXES)}
    if not seen["cuGetProcAddress"] & optional:
        want["cuGetProcAddress"] -= optional
    diff = {kind: {"new (not in the ledger)": sorted(seen[kind] - want[kind]),
                   "gone (fakecuda has it now)": sorted(want[kind] - seen[kind])}
            for kind in want if seen[kind] != want[kind]}
    print({kind: len(names) for kind, names in seen.items()}, "names not found, by kind")
    assert not diff, json.dumps(diff, indent=1)
    assert not seen["export_table_slot"], "an unmodelled export-table slot was called"


def test_the_own_device_is_a_card_the_client_runs_on(cuda_torch, c_build, tmp_path):
    """Without FAKECUDA_PERSONA (a user or a test that forgets it): fakecuda's own device answers
    the H100's attributes, so the client runs its kernels there too. Before (issue 43), every
    release died: SIGFPE in torch.randn (0 threads per SM), cublasCreate failing."""
    r = run_client(c_build, tmp_path, "", "kernels")
    failed = {k: v["error"] for k, v in r["steps"].items() if not v["ok"]}
    assert not failed, failed
    name, cc, total, sms, l2 = r["steps"]["properties"]["value"]
    assert (name, cc, total, sms, l2) == ("fakecuda device 0", [9, 0], 80 << 30, 132, 52428800)
    assert r["steps"]["randn"]["value"] == 64 and r["fakecuda"]["launches"] >= 6


def test_kernels(cuda_torch, c_build, tmp_path):
    r = run_client(c_build, tmp_path, "h100-sxm-80gb", "kernels")
    failed = {k: v["error"] for k, v in r["steps"].items() if not v["ok"]}
    assert not failed, failed
    # each step launched at least one kernel (fill_, add, sum, cuBLAS's gemm, sum) on the driver
    assert r["fakecuda"]["launches"] >= 5, r["fakecuda"]["launches"]
