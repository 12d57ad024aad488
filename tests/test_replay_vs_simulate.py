"""A real model's trace replayed on fakecuda under pump-run with a budget gives the fault
and byte counts `pump simulate --gpu fakecuda` predicts for the same policy (issue 4:
within 5%; lookahead within 10%, its plan made from times a loaded host's clock takes). The
trace is generated here (ResNet-50's training steps at batch 2, by `pump trace generate`), so
this also runs the generator end to end.  A small trace of a caching allocator's segments
(test_segments_replay_as_the_simulator_predicts) is compared too: replay_trace and the simulator
keep its segments whole, a dead tensor's memory in them, or both free it (--no-segments).

Policies compared: off (pump's evict-only emulation of an oversubscribed GPU; the
simulator's "naive"), launch, and lookahead with a live (embedded) pumpd: the replay pauses
at each step (replay_trace --step-pause) so that pumpd reads each step whole and plans in
the pause, as `pump simulate --gpu fakecuda` models it. The trace runs 8 steps: its
iteration is two steps long (the caching allocator alternates buffers), pumpd learns it
after step 5, and steps 6 and 7 run on the plan."""

import json
import re
import subprocess
import sys

import numpy as np
import pytest

from helpers import PUMP_RUN, clean_env
from pump.simulate import constants, workload
from synthetic_trace import MIB, TraceBuilder

TOLERANCE = 0.05
# lookahead's plan is made from what the shim timed on the host's clock (the link rate its
# prefetches met, the kernels' times), which a loaded host moves: see the runs below.
LOOKAHEAD_TOLERANCE = 0.10
COUNTS = ("gpu_faults", "gpu_fault_batches", "bytes_prefetched_h2d", "bytes_faulted_h2d", "bytes_d2h")


@pytest.fixture(scope="module")
def model_trace(tmp_path_factory):
    pytest.importorskip("torch")
    path = tmp_path_factory.mktemp("replay") / "resnet50-b2.trace"
    proc = subprocess.run([sys.executable, "-m", "pump.cli", "trace", "generate", "resnet50", "--batch", "2",
                           "--steps", "8", "-o", str(path)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    return path


def simulated(path, policy, budget, *extra):
    proc = subprocess.run([sys.executable, "-m", "pump.cli", "simulate", str(path), "--gpu", "fakecuda",
                           "--capacity", str(budget), "--policy", policy, "--json", *extra],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    return doc["fakecuda_counts"][policy], doc["peak_footprint_bytes"]


def replayed(c_build, tmp_path, path, policy, budget, *extra):
    stats = tmp_path / f"fakecuda-{policy}.json"
    # PUMP_EVICT_AHEAD=0: the simulator models each launch making its own room, not pump's worker
    # making it ahead (shim/policy/residency_ahead.c), which moved the replay's faults 15% (1,648 against
    # 1,952 under launch)
    # PUMP_TORCH_DISCARDS=0: the simulator keeps a dead tensor's memory in its segment, resident
    # and counted (pump/simulate/segments.py), as the launch rule does without discards
    env = dict(clean_env(), LD_LIBRARY_PATH=str(c_build / "plain"), FAKECUDA_STATS=str(stats), PUMP_EVICT_AHEAD="0",
               PUMP_TORCH_DISCARDS="0")
    # lookahead needs pumpd (an embedded one: no system pumpd answers here), and time
    # between steps for it to read each step and publish its plan: planning the learned
    # iteration is Python work that takes longer on a loaded machine, and a plan that lands
    # inside the next step's launches starts at another launch than the model's.
    daemon, pause = (["--daemon", "embedded"], ["--step-pause", "1000"]) if policy == "lookahead" else \
        (["--daemon", "none"], [])
    proc = subprocess.run([PUMP_RUN, *daemon, "--policy", {"naive": "off"}.get(policy, policy),
                           "--budget", str(budget), "--", str(c_build / "plain" / "replay_trace"), *extra, *pause,
                           "--kernel-times", str(workload.load(str(path)).write_kernel_times(
                               tmp_path / "kernel-times", constants.GPU_PRESETS[constants.DEFAULT_GPU])), str(path)],
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    return json.loads(stats.read_text()), proc.stderr


# lookahead agrees because pumpd's plan follows the same launches as the model's: it plans
# the learned iteration from its canonical start (pumpd reads the ring in pieces and learns
# mid-step; the model reads whole steps), and a launch's kernel time is its key's median
# interval (one interval the loaded host stretched moved the plan's room for transfers in
# flight).  Before, the replay faulted 256, 288 or 336 times a planned step from run to run
# against the model's 192 (fed the replay's own reads and intervals, the model reproduced
# each run's count, launch for launch).
# naive: pump's worker made policy off's evictions (the emulated card's) while the next kernels
# already ran, so the emulated card held more than the budget (device_resident_peak 585 MB
# against 298) and the replay faulted 26,507..47,867 times against the model's 173,864; the
# next kernel now waits for them (residency.c, pump_residency_off_launch) and the replay
# agrees count for count.
# lookahead parted from the model in most runs for long (the runs' faults spread 1,472 to 2,652
# against the model's 1,952 to 2,272), for one input after another that pumpd and the model's
# Foresight planned from differently: the link rate (pumpd's PCIe fallback, then the rate the
# shim measures: LINK records, shim/engine/link_rate.c, which the model takes as
# host.HostCosts.probed_rate), the kernel times (launch intervals, then the times the GPU
# measured: KERNEL records). The last two were where the plan starts and the first rate:
# - the learned iteration started at its least launch key, a hash of addresses that differ from
#   run to run and from the trace's, so each run planned another rotation of the same cycle
#   (192, 256 or 320 faults a planned step; the model itself gives 1,760 to 2,144 faults over
#   rotations); it now starts where its launches' shapes say (iteration.canonical_start);
# - the rate planned for was the first pumpd heard, kept within Foresight's tolerance until
#   the plan was made: 24.4 GB/s from the first, small prefetches in one run of eight (288
#   faults a planned step), 20.0 in the others; before a plan each rate is now taken.
# Ten runs of the replay then gave 2,208 faults each (160, 256, 256, 256, then 320 a step on
# the plan) against the model's 2,144. On a loaded host (CI's 2 cores running the suite: 2,016
# there) they still part: 20 runs here, 12 of them beside two busy loops, gave 2,016 to 2,208
# (planned steps 288 or 320 faults, the first planned one 224 to 320; the rate planned at 19.6
# to 23.2 GB/s), the bytes moved 15.2 to 15.9 GB against the model's 15.3: within 6% and 4%.
# Beside another pytest worker (CI's fast tier on two workers) one run read 1,808 (-16%), so
# lookahead's case is slow and wants the machine alone (CI's `pytest -m alone`).


@pytest.mark.parametrize("policy", ["naive", "launch", pytest.param("lookahead", marks=pytest.mark.alone)])
def test_replay_matches_the_simulator(c_build, tmp_path, model_trace, policy):
    _, peak = simulated(model_trace, "ideal", 1 << 40)
    budget = peak // 2 // (2 << 20) * (2 << 20)  # half the footprint, in whole 2 MiB blocks
    predicted, _ = simulated(model_trace, policy, budget)
    measured, summary = replayed(c_build, tmp_path, model_trace, policy, budget)
    assert predicted["bytes_d2h"] > 0 and predicted["gpu_faults"] > 0  # the budget binds
    tolerance = LOOKAHEAD_TOLERANCE if policy == "lookahead" else TOLERANCE
    for count in COUNTS:
        p, m = predicted[count], measured[count]
        assert abs(p - m) <= tolerance * max(p, m), (count, p, m, summary)
    # The budget held: what fakecuda had on the GPU at most, against it (a kernel may fault
    # in pages between evictions: at most one launch's worth over).
    assert measured["device_resident_peak"] <= budget * 1.25, (measured, budget)
    # pump-run says what lookahead learned (one process: one iteration, the trace's step).
    said = re.findall(r"^pump-run: lookahead learned an iteration of (\d+) launches(?:, planned at .*)?$", summary, re.M)
    assert (len(said), int(said[0]) > 0 if said else None) == ((1, True) if policy == "lookahead" else (0, None)), \
        summary


def caching_allocator_trace(path, steps=6, layers=4, size=4 * MIB):
    """A training loop's memory under a caching allocator, as the shim traces it: weights of
    their own; activations in one segment (carved: ALLOC, FREE, ALLOC at its base), written
    forward and freed backward; a gradient scratch tensor in a second segment, placed at one of
    two offsets per layer and freed after it.  Every base a launch names has an extent there
    (replay_trace gives a kernel only its ranges: a base without one is not seen by the shim)."""
    t = TraceBuilder()
    weights = [t.alloc(size) for _ in range(layers)]
    acts_segment = scratch_segment = None
    for s in range(steps):
        t.step(s)
        acts = []
        for i in range(layers):
            if acts_segment is None:
                acts_segment = t.alloc(layers * size)
                t.free(acts_segment, layers * size)
            acts.append(acts_segment + i * size)
            t._record("alloc", 0, acts[i], size, 1)
            t.launch(100 + i, [weights[i], acts[i]], [(weights[i], size, False), (acts[i], size, True)], 1e9, 2 * size)
        for i in reversed(range(layers)):
            if scratch_segment is None:
                scratch_segment = t.alloc(2 * size)
                t.free(scratch_segment, 2 * size)
            g = scratch_segment + (i + 1) % 2 * size
            t._record("alloc", 0, g, size, 1)
            t.launch(200 + i, [weights[i], acts[i], g],
                     [(weights[i], size, False), (acts[i], size, False), (g, size, True)], 2e9, 3 * size)
            t.free(acts[i], size)
            t.launch(300 + i, [weights[i], g], [(g, size, False), (weights[i], size, True)], 1e9, 2 * size)
            t.free(g, size)
    return t.write(str(path))


# Both keep the segments whole (a dead tensor's memory resident and counted, evicted first and
# brought back for the next tensor there) or both free dead tensors: count for count the same
# (with segments 240 MiB in and 260 out under launch; freed, 116 and 120).
@pytest.mark.parametrize("segments", [True, False], ids=["segments", "no-segments"])
@pytest.mark.parametrize("policy", ["naive", "launch"])
def test_segments_replay_as_the_simulator_predicts(c_build, tmp_path, policy, segments):
    path = caching_allocator_trace(tmp_path / "caching.trace")
    budget = 20 * MIB   # half the footprint (weights 16 MiB, segments 24 MiB)
    extra = () if segments else ("--no-segments",)
    predicted, peak = simulated(path, policy, budget, *extra)
    measured, summary = replayed(c_build, tmp_path, path, policy, budget, *extra)
    assert peak == 40 * MIB   # weights, activations and the scratch segment at once
    assert predicted["bytes_d2h"] > 0
    for count in COUNTS:
        assert predicted[count] == measured[count], (count, predicted[count], measured[count], summary)


def test_launch_times_leave_pumps_own_calls_out(c_build, tmp_path, model_trace):
    """pumpd reads kernel times from the gaps between launch calls; fakecuda charges pump's
    prefetches and evictions to the launching thread, and the shim stamps each LAUNCH less its
    thread's time in them, so the gaps (between steps' pauses) add up to far less than those
    calls took.  Stamped plainly, the gaps held all of it."""
    _, peak = simulated(model_trace, "ideal", 1 << 40)
    budget = peak // 2 // (2 << 20) * (2 << 20)
    stats, recorded = tmp_path / "fakecuda.json", tmp_path / "recorded.trace"
    env = dict(clean_env(), LD_LIBRARY_PATH=str(c_build / "plain"), FAKECUDA_STATS=str(stats))
    proc = subprocess.run([PUMP_RUN, "--daemon", "embedded", "--policy", "launch", "--budget", str(budget),
                           "--trace", str(recorded), "--", str(c_build / "plain" / "replay_trace"),
                           "--step-pause", "200", str(model_trace)],
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    pump_calls = json.loads(stats.read_text())["entry_costs"]["prefetch"]["caller_ns"] / 1e9
    times = np.concatenate([b.launch_time for _, b in workload.load(str(recorded)).batches]).astype(np.int64)
    gaps = np.diff(times) / 1e9
    running = gaps[gaps < 0.1].sum()       # less the steps' pauses (--step-pause 200 ms)
    assert pump_calls > 0.2 and running < 0.5 * pump_calls, (running, pump_calls)


def test_a_plan_on_named_tensors_keeps_their_discards(c_build, tmp_path):
    """A plan counts a dead named tensor's room free at its free (pump/foresight.py gives a dead
    name no eviction), which only its discard makes so; so under a plan's triggers the shim goes
    on discarding named tensors (shim/hooks/torch_trace.c), and stops for tensors known by their
    addresses (where the discards' waits for the freeing stream cost a planned step 2.8x for no
    byte less: docs/limits.md). Before, discards stopped at the plan's first trigger either way."""
    path = caching_allocator_trace(tmp_path / "caching.trace", steps=10)
    counts = {}
    for names in ("1", "0"):
        pump_stats = tmp_path / f"pump-{names}.json"
        env = dict(clean_env(), LD_LIBRARY_PATH=str(c_build / "plain"), PUMP_TORCH_NAMES=names,
                   PUMP_TORCH_DISCARDS="1")
        proc = subprocess.run([PUMP_RUN, "--daemon", "embedded", "--policy", "lookahead", "--budget", str(20 * MIB),
                               "--stats", str(pump_stats), "--", str(c_build / "plain" / "replay_trace"),
                               "--step-pause", "500", str(path)],
                              env=env, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr
        counts[names] = json.loads(pump_stats.read_text())["totals"]
        assert counts[names]["plan_triggers"] > 0 and counts[names]["errors"] == 0, (names, proc.stderr)
    discards = {names: c["torch_tensor_discards"] for names, c in counts.items()}
    assert discards["1"] > discards["0"] > 0, discards
