"""Workloads the project did not write, on the real client (issue 43 item 4): torchvision's
resnet18 with mixed precision and channels_last, and a transformers GPT-2 from a config (AdamW,
gradient accumulation, a shorter last batch, an evaluation pass, save_pretrained), in
tests/real_client/outside.py (torch.compile's kernels are the tier's in
test_real_client_allocators.py). PyTorch's CUDA build (PUMP_REAL_CLIENT_PYTHON, with torchvision
and transformers: scripts/real-client-venv installs them) runs them on fakecuda bare, with
FAKECUDA_PERSONA set, and under pump-run without it (the default device is the H100 persona).
What must hold, each able to fail:
- both runs exit 0, every job runs its steps, and they print the same (the same checkpoints);
- every launch fakecuda ran reached pump's hooks, whose handle kind pump knew, in a process pump
  did not stand aside in; no driver call pump made failed, no event was dropped;
- nothing the libraries look up is missing from the driver (cuDNN looks up cuCtxPushCurrent,
  cuCtxPopCurrent and cuLibraryLoadFromFile by dlsym and says "Could not load symbol" where
  they are missing), and pump says nothing of a launch that passed it by.
Not checked here: values (kernels are no-ops on fakecuda)."""
import json
import os
import subprocess

import pytest

from helpers import PUMP_RUN, clean_env
from test_real_client import ROOT, cuda_torch  # noqa: F401 (the fixture that skips without torch's CUDA build)
from test_real_client_training import PERSONA, launch_count_differences

OUTSIDE = ROOT / "tests" / "real_client" / "outside.py"
JOBS = ("resnet_amp", "hf_gpt2")
BYPASS_NOTICES = ("pump cannot put its hook there", "went past pump", "Could not load symbol")


@pytest.fixture(scope="module")
def outside_python(cuda_torch):  # noqa: F811
    """The real client's interpreter, if it has torchvision and transformers; else the test is
    skipped (or fails, as cuda_torch does, where PUMP_REAL_CLIENT_PYTHON names it)."""
    probe = subprocess.run([cuda_torch, "-c", "import torchvision, transformers"], capture_output=True, text=True,
                           timeout=300)
    if probe.returncode != 0:
        missing = pytest.fail if os.environ.get("PUMP_REAL_CLIENT_PYTHON") else pytest.skip
        missing(f"{cuda_torch} lacks torchvision or transformers (scripts/real-client-venv installs them): "
                f"{probe.stderr.strip().splitlines()[-1:]}")
    return cuda_torch


def run(python, c_build, out, pump):
    """One run of every job: (process, the jobs' JSON, fakecuda's stats, pump's stats or None)."""
    out.mkdir()
    env = clean_env()
    env.update(LD_LIBRARY_PATH=str(c_build / "plain"), FAKECUDA_STATS=str(out / "fakecuda.json"),
               HF_HUB_OFFLINE="1", TRANSFORMERS_VERBOSITY="error")
    cmd = [python, str(OUTSIDE), str(out), ",".join(JOBS)]
    if pump:
        cmd = [PUMP_RUN, "--stats", str(out / "pump.json"), "--", *cmd]
    else:
        env["FAKECUDA_PERSONA"] = PERSONA
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    jobs = json.loads(proc.stdout.strip().splitlines()[-1]) if proc.stdout.strip() else None
    pump_stats = json.loads((out / "pump.json").read_text()) if pump else None
    return proc, jobs, json.loads((out / "fakecuda.json").read_text()), pump_stats


@pytest.fixture(scope="module")
def runs(outside_python, c_build, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("outside")
    return {"bare": run(outside_python, c_build, tmp / "bare", False),
            "pump": run(outside_python, c_build, tmp / "pump", True)}


def test_the_outside_jobs_run_under_pump_as_they_do_bare(runs):
    (bare, bare_jobs, _, _), (pumped, pump_jobs, _, stats) = runs["bare"], runs["pump"]
    assert bare.returncode == 0, bare.stderr[-3000:]
    failed = {k: v["error"] for k, v in bare_jobs.items() if not v["ok"]}
    assert not failed and set(bare_jobs) == set(JOBS), failed
    assert pumped.returncode == 0 and stats["exit_code"] == 0, pumped.stderr[-3000:]
    assert pump_jobs == bare_jobs  # every job ran its steps and saved the same checkpoint


def test_every_launch_of_the_outside_jobs_reached_pumps_hooks(runs):
    _, _, fakecuda, pump = runs["pump"]
    t = pump["totals"]
    print(f"fakecuda {fakecuda['launches']} launches; pump {t['launches']} ({t['launches_kernel_handles']} "
          f"CUkernel, {t['launches_function_handles']} CUfunction), {len(pump['processes'])} processes")
    assert fakecuda["launches"] > 2000  # resnet18's and GPT-2's kernels, not a few
    assert not launch_count_differences(fakecuda, pump)
    assert (t["errors"], t["events_dropped"], t["prefetch_refusals"]) == (0, 0, 0), t


@pytest.mark.parametrize("variant", ["bare", "pump"])
def test_nothing_the_outside_jobs_look_up_is_missing_or_passed_by(runs, variant):
    proc = runs[variant][0]
    said = [line for line in proc.stderr.splitlines() if any(notice in line for notice in BYPASS_NOTICES)]
    assert not said, said[:5]
