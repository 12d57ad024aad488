"""Kernel times as the GPU gives them (issue 28 item 6): the shim times a few launches of each
launch key with events on the launch's stream (shim/engine/kernel_time.c) and writes KERNEL records
(key, ns); pumpd decodes and checks them (pump/channel.py) and plans each key at the shortest
of its latest samples, before the launch intervals, which are the host's pace
(daemon/pumpd/lookahead.py); a key's time that arrives after its launches were read still
counts at the plan (Foresight.retime). `pump simulate` gives its planner the simulated
kernels' times the same way (pump/simulate/engine.py)."""

import collections
import pathlib
import subprocess

import numpy as np
import pytest

from helpers import PUMP_RUN, channel_record, clean_env
from pump import channel, config, run, trace
from pump.simulate import constants, engine, workload
from pumpd import lookahead
from synthetic_trace import training_trace
from test_budget import LAUNCHES, write_trace

MiB = 1 << 20


def kernel_record(device: int, key: int, ns: int, count: int = 2) -> np.ndarray:
    return channel_record("kernel", device, count, key, ns)


def test_decode_gives_each_timed_kernel():
    batch = channel.decode(np.concatenate([kernel_record(0, 0xabc, 5_000), kernel_record(3, 0xdef, 7)]))
    assert batch.kernels == [(0, 0xabc, 5_000), (3, 0xdef, 7)]
    assert (batch.invalid, batch.problems) == (0, [])


@pytest.mark.parametrize("device, key, ns, count", [(-1, 1, 1, 2), (64, 1, 1, 2), (0, 0, 1, 2), (0, 1, 0, 2),
                                                    (0, 1, 1 << 48, 2), (0, 1, 1, 3)])
def test_a_malformed_kernel_record_is_rejected_and_named(device, key, ns, count):
    batch = channel.decode(np.concatenate([kernel_record(device, key, ns, count), kernel_record(1, 9, 10)]))
    assert batch.kernels == [(1, 9, 10)]  # the good one after it still counts
    assert batch.invalid == 1
    assert batch.problems == [f"KERNEL record for device {device} with count {count}, key {key:#x}, {ns} ns; "
                              "allowed: ordinals 0..63, count 2, a key other than 0, ns in 1..2^48-1"]


def launches(keys, times_ns, bases=(0x7f0000000000,)):
    """A batch of launches of the given functions (one base each), at the given call times."""
    records = [channel_record("launch", 0, 1, key, 0x77, bases[0]) for key in keys]
    batch = np.concatenate(records)
    batch["time_ns"] = times_ns
    return batch


def test_pumpd_plans_a_timed_key_at_its_shortest_sample_and_the_rest_at_their_intervals():
    la = lookahead.Lookahead(64 * MiB, 25e9)
    first = channel.decode(launches([1, 2, 1, 2], [0, 100_000, 200_000, 300_000]))
    keys = channel.launch_keys(first)
    # key of function 1 timed three times on the GPU: a fault-stretched sample does not count
    la.plan(channel.decode(np.concatenate([kernel_record(0, int(keys[0]), ns) for ns in (9_000, 4_000, 2_000_000)])))
    la.plan(first)
    seconds = la.policy.seconds
    assert seconds[2] == pytest.approx(4e-6)     # timed: the shortest of its samples
    assert seconds[3] == pytest.approx(100e-6)   # not timed: its launch interval
    assert la.kernel_seconds == {int(keys[0]): 4e-6}


def test_the_kernel_table_pumpd_keeps_is_bounded(monkeypatch):
    monkeypatch.setattr(lookahead, "KERNEL_KEYS_MAX", 4)
    la = lookahead.Lookahead(64 * MiB, 25e9)
    la.plan(channel.decode(np.concatenate([kernel_record(0, key, 1_000 + i) for i, key in
                                           enumerate(range(1, 8)) for _ in range(20)])))
    assert len(la.kernel_ns) <= 4 and all(len(v) <= lookahead.KERNEL_SAMPLES for v in la.kernel_ns.values())


def test_a_kernel_time_that_came_after_its_launches_counts_at_the_plan():
    """The iteration's launches were read with their intervals (1 ms each: host-paced); the
    GPU's times (1 us) arrive before the iteration is learned: the plan's room for transfers
    in flight follows the GPU's longest kernel, not the host's pace."""
    la = lookahead.Lookahead(64 * MiB, 25e9)
    period = [1, 2, 3, 4]
    times = iter(range(0, 10**9, 1_000_000))
    batch = channel.decode(launches(period, [next(times) for _ in period]))
    la.plan(batch)
    la.plan(channel.decode(np.concatenate([kernel_record(0, int(k), 1_000) for k in channel.launch_keys(batch)])))
    for _ in range(3):
        la.plan(channel.decode(launches(period, [next(times) for _ in period])))
    assert la.policy.learned
    assert la.policy.seconds.max() == pytest.approx(1e-3)  # what was read: the intervals
    assert la.policy.reserve_bytes(la.policy.period, la.policy.retime(
        la.policy.schedule_keys, la.policy.seconds[-la.policy.period:])) == int(25e9 * 1e-6)


def test_the_simulated_planner_takes_the_simulated_kernels_times(tmp_path):
    """pump simulate's lookahead plans with each key's shortest simulated kernel time so far
    (faults included), as pumpd does with the GPU's; never shorter than the roofline's."""
    t, _, _ = training_trace(steps=6, layers=6)
    w = workload.load(t.write(str(tmp_path / "t.trace")), batch_launches=5)
    run = engine._Run(w, "lookahead", w.peak_footprint // 2, engine.gpu_model(constants.DEFAULT_GPU))
    run.go()
    roofline = collections.defaultdict(list)
    for key, seconds in zip(w.keys.tolist(), run.kernel_s.tolist()):
        roofline[key].append(seconds)
    assert run.shortest and all(run.shortest[key] >= min(roofline[key]) - 1e-12 for key in run.shortest)
    assert run.foresight.learned


@pytest.mark.parametrize("policy, timed", [("lookahead", "1"), ("launch", None), ("off", None)])
def test_only_lookahead_has_the_gpu_time_kernels(policy, timed):
    """Timing costs driver calls on the launching thread (two event records a timed launch):
    pump-run asks for it where pumpd plans on it, not under the launch rule alone."""
    cfg = config.resolve_job({"policy": policy}, None, None)
    env, _ = run.job_environment(cfg, "/lib/libpump.so", {})
    assert env.get("PUMP_KERNEL_TIMES") == timed and env["PUMP_POLICY"] == policy


@pytest.mark.parametrize("settings, allocator", [
    ({"policy": "lookahead"}, "pump"),                                      # PyTorch's steps then repeat
    ({"policy": "lookahead", "torch_allocator": "caching"}, "caching"),     # the user's choice stands
    ({"policy": "lookahead", "managed_all": False}, None),                  # no allocator of pump's
    ({"policy": "launch"}, None),                                          # the shim's default, caching
])
def test_lookahead_takes_pumps_allocator_for_pytorch_unless_told_otherwise(settings, allocator):
    cfg = config.resolve_job(settings, None, None)
    env, _ = run.job_environment(cfg, "/lib/libpump.so", {})
    assert env.get("PUMP_TORCH_ALLOCATOR") == allocator


def test_the_shim_times_kernels_on_the_gpu(c_build, tmp_path):
    """A replay of three steps whose kernels compute 2 ms each (replay_trace --kernel-times)
    under pump-run: pumpd's trace holds KERNEL records of every launch key, each at least the
    compute time, the last ones reported at the synchronisation after them (no launch follows
    to read them at). Each key's shortest sample, the one pumpd plans on, is at most 1 ms more
    (fakecuda's touches and faults): a probe that bracketed two kernels would read 4 ms or
    more every time. Any one sample can read more: fakecuda's stream is a thread on the wall
    clock, and a busy machine descheduling it between the two records stretches the kernel
    (4.9 ms read with four busy loops on the two cores), which a GPU never does."""
    steps = 3  # each key's PUMP_KERNEL_FIRST_SAMPLES
    path = write_trace(tmp_path / "t.trace", steps)
    times = tmp_path / "times"
    times.write_bytes(np.full(steps * len(LAUNCHES), 2_000_000, "<u8").tobytes())
    recorded = tmp_path / "run.trace"
    env = dict(clean_env(), LD_LIBRARY_PATH=str(c_build / "plain"))
    proc = subprocess.run([PUMP_RUN, "--daemon", "embedded", "--policy", "lookahead", "--trace", str(recorded), "--",
                           str(c_build / "plain" / "replay_trace"), "--step-pause", "300",  # pumpd attaches
                           "--kernel-times", str(times), str(path)],
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    keys, kernels = set(), []
    for _pid, records in trace.read(str(recorded))[1]:
        batch = channel.decode(records)
        kernels += batch.kernels
        if batch.launch_function is not None and len(batch.launch_function):
            keys |= set(channel.launch_keys(batch).tolist())
    assert {key for _, key, _ in kernels} == keys, proc.stderr
    assert all(device == 0 and ns >= 2_000_000 for device, _, ns in kernels), kernels
    shortest = {key: min(ns for _, k, ns in kernels if k == key) for key in keys}
    assert all(ns <= 3_000_000 for ns in shortest.values()), kernels
    shown = subprocess.run([str(pathlib.Path(PUMP_RUN).parent / "pump"), "trace", "show", str(recorded)],
                           capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0 and f"a launch of key {kernels[0][1]:#x} ran {kernels[0][2]} ns on the GPU" \
        in shown.stdout, shown.stderr
