"""Lookahead learns a real PyTorch job's step (issue 41 item 1): examples/train_gpt.py on torch's
CUDA build (the real client, on fakecuda's H100 persona) under `pump-run --policy lookahead`
with pump's allocator (`[memory] torch_allocator = "pump"`), whose tensors are placed where they
went the step before (shim/policy/placement.c), after each optimizer step's mark.

The pool behind pump's allocator hands out, of several freed blocks of a size, the one freed
last (FAKECUDA_POOL_REUSE=freed; what the driver's pool does is not documented): without
placement the step's launch keys repeat for about half its launches (52% here: the keys of the
launches on blocks that change hands every step repeat every other step) and pumpd learns no
iteration; with it every key repeats, pumpd learns the step (451 launches on torch 2.14, 448 on
2.15) and its plan's triggers fire. Under PyTorch's own caching allocator the same holds once
its tensors are named by their place in the step (PUMP_TORCH_NAMES=1). What it does not check: bytes and faults (kernels are no-ops on fakecuda, issue 41 item 4)."""

import json
import pathlib
import subprocess

import pytest

from helpers import PUMP_RUN, clean_env
from pump import trace
from test_real_client import cuda_torch  # noqa: F401 (the fixture that skips without torch's CUDA build)
from test_real_client_training import PERSONA

ROOT = pathlib.Path(__file__).resolve().parent.parent
STEPS = 60
# The tiny preset's training step, in launches, per torch release (major.minor): 2.15 fills three
# tensors fewer a step (FillFunctor launches, 154 against 151; the rest the same kernels), as
# fakecuda's launch log counts them bare (FAKECUDA_LAUNCH_LOG, --steps 8 less --steps 4, over 4;
# FAKECUDA_POOL_REUSE=freed): 2.11, the GPU machines', (3936 - 2100) / 4.
STEP_LAUNCHES = {"2.11": 459, "2.14": 451, "2.15": 448}


UNSET_SLOT_KEYS = 3  # launch keys a step may lose to words PyTorch left unset (see the test)
ATTEMPTS = 4  # runs made while the shim drops records (see run_lookahead)


def run_lookahead(python, c_build, out, placement):
    """The job under lookahead: (pump-run's process, pump's totals, `pump trace stats`). A run
    whose ring dropped events is made again: on a loaded 2-core machine the embedded pumpd
    sometimes reads a ring of this fast job too late (1,103 of about 82,000 records dropped in 1
    of 6 runs here; issue 45 item 7), and a trace with a hole in it has no period to find. A
    run that dropped none has every record in its trace: pumpd reads rings while it plans
    (issue 45 item 1; before, the end of a job waited out a plan being made, and one CI run
    traced 56 of 60 steps in each of 4 runs)."""
    for attempt in range(ATTEMPTS):
        run = _run_lookahead(python, c_build, out / str(attempt), placement)
        if run[1]["events_dropped"] == 0:
            break
    return run


def _run_lookahead(python, c_build, out, placement):
    """placement: pump's allocator, placing tensors (True) or not (False); "names": PyTorch's
    caching allocator, its tensors named by their place in the step (PUMP_TORCH_NAMES=1)."""
    out.mkdir(parents=True)
    env = clean_env()
    env.update(LD_LIBRARY_PATH=str(c_build / "plain"), FAKECUDA_PERSONA=PERSONA, FAKECUDA_POOL_REUSE="freed",
               XDG_CACHE_HOME=str(out / "cache"))
    options = []
    if placement == "names":
        (out / "job.toml").write_text('[memory]\ntorch_allocator = "caching"\n')
        options = ["--config", str(out / "job.toml")]
        env.update(PUMP_TORCH_NAMES="1")
    else:
        env.update(PUMP_TORCH_ALLOCATOR="pump", PUMP_TORCH_PLACEMENT="1" if placement else "0")
    cmd = [PUMP_RUN, "--policy", "lookahead", *options, "--daemon", "embedded", "--trace", str(out / "pump.trace"),
           "--stats", str(out / "pump.json"), "--", python, str(ROOT / "examples" / "train_gpt.py"),
           "--steps", str(STEPS), "--device", "cuda", "--no-demo"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    totals = json.loads((out / "pump.json").read_text())["totals"]
    return proc, totals, trace.stats(out / "pump.trace")


@pytest.fixture(scope="module")
def step_launches(cuda_torch):  # noqa: F811
    """The step's launches on the client's torch; a release not in STEP_LAUNCHES fails, naming it."""
    version = subprocess.run([cuda_torch, "-c", "import torch; print(torch.__version__)"], capture_output=True,
                             text=True, timeout=300, check=True).stdout.strip()
    release = ".".join(version.split(".")[:2])
    if release not in STEP_LAUNCHES:
        pytest.fail(f"torch {version}: its step's launches are not in STEP_LAUNCHES (count them as its comment says)")
    return STEP_LAUNCHES[release]


@pytest.fixture(scope="module")
def runs(cuda_torch, c_build, tmp_path_factory):  # noqa: F811
    tmp = tmp_path_factory.mktemp("iteration")
    return {placement: run_lookahead(cuda_torch, c_build, tmp / f"placement-{placement}", placement)
            for placement in (True, False, "names")}


def test_placed_tensors_make_every_launch_key_repeat_and_lookahead_plans(runs, step_launches):
    proc, t, doc = runs[True]
    it = doc["iteration"]
    assert doc["steps"] == STEPS  # the optimizer's marks, as STEP records
    # Every key but a few whose launches carry stack garbage: PyTorch leaves slots of its
    # by-value structs unset (an OffsetCalculator's strides past its dims, a ReduceOp's empty
    # ops_t and its padding), so a word there may hold a stale pointer into a live tensor one
    # step and not the next, and the scan, which cannot tell it from a pointer, adds that
    # tensor to the launch's key. In 11 runs here, 3 at a time: the step's 161st launch,
    # reduce_kernel<..., MinMaxOps<long, long, int>>, named a 4,160-byte tensor one step and not
    # the next in 2 (1 key of 451 lost); fakecuda's launch log (FAKECUDA_LAUNCH_LOG) of that
    # kernel showed a 768-byte tensor at its struct's offsets 200 and 392 in 59 of 120 launches
    # in one run and in none in two others. 2 keys were lost in a loaded pytest run; 3 allowed
    # here. The step is learned whole all the same (below).
    assert it["launches"] == step_launches and it["keys_repeated"] >= step_launches - UNSET_SLOT_KEYS, it
    assert t["placement_steps"] == STEPS and t["placement_hits"] == t["placement_wanted"] > 0
    assert t["errors"] == 0 and t["events_dropped"] == 0
    assert f"lookahead learned an iteration of {step_launches} launches" in proc.stderr, proc.stderr[-2000:]
    assert t["plan_triggers"] > 0
    # The plan's launches find their blocks where it put them: a placed tensor keeps what pump
    # knew of its memory (hooks_memory.c's retire), so fresh tensors are not prefetched again
    assert t["launches_planned"] >= 0.9 * t["plan_triggers"], (t["launches_planned"], t["plan_triggers"])


def test_without_placement_the_keys_do_not_repeat_and_nothing_is_learned(runs):
    proc, t, doc = runs[False]
    assert t["events_dropped"] == 0, t  # a hole in the trace leaves it no iteration at all
    it = doc["iteration"]
    assert it["keys_repeated_share"] < 0.9, it
    assert "lookahead learned no iteration" in proc.stderr, proc.stderr[-2000:]
    assert t["plan_triggers"] == 0 and t["placement_steps"] == 0


def test_named_tensors_of_the_caching_allocator_make_lookahead_learn_the_step(runs, step_launches):
    # PyTorch's own caching allocator (its tensors followed by pump's bridge) moves tensors from
    # step to step: by address, lookahead learned no iteration of this job (seen: "lookahead
    # learned no iteration", 0 plan triggers, with PUMP_TORCH_NAMES=0). Named by their place in
    # the step (shim/lookup/names.h), pumpd learns the step and its plan's triggers fire, their
    # ranges read back as the tensors holding the names.
    proc, t, doc = runs["names"]
    assert t["torch_tensor_allocs"] > 1000 and t["tensor_names_bound"] > 0.9 * t["torch_tensor_allocs"], t
    assert t["errors"] == 0 and t["events_dropped"] == 0
    assert f"lookahead learned an iteration of {step_launches} launches" in proc.stderr, proc.stderr[-2000:]
    assert t["plan_triggers"] > 0 and t["launches_planned"] >= 0.9 * t["plan_triggers"], t
