"""pump's own driver calls cost the thread that makes them in the simulator what they cost in
fakecuda (issue 28 item 2): the same constants, read from fakecuda_model.h, and the same rule
(fakecuda/cost.c), checked here against fakecuda itself; the launching thread makes those
before its kernel, pump's worker those decided after it."""

import dataclasses
import json
import subprocess
import sys

import pytest

from helpers import clean_env
from pump.simulate import engine, host, workload
from synthetic_trace import MIB, TraceBuilder

# Asks fakecuda (LD_LIBRARY_PATH) what each of pump's kinds of call charges its caller: a
# prefetch of one 2 MiB block, of a range of three, and an eviction of one resident block.
FAKECUDA_COSTS = r"""
import ctypes, json
lib = ctypes.CDLL("libcuda.so.1")
class Cost(ctypes.Structure):
    _fields_ = [("calls", ctypes.c_uint64), ("caller_ns", ctypes.c_uint64), ("worker_ns", ctypes.c_uint64)]
def ok(r):
    assert r == 0, r
def caller_ns():
    c = Cost()
    ok(lib.fakecuda_get_entry_cost(b"prefetch", ctypes.byref(c)))
    return c.caller_ns
ok(lib.cuInit(0))
dev, ctx, stream, ptr = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_uint64()
ok(lib.cuDeviceGet(ctypes.byref(dev), 0))
ok(lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev))
ok(lib.cuCtxSetCurrent(ctx))
ok(lib.cuStreamCreate(ctypes.byref(stream), 1))
ok(lib.cuMemAllocManaged(ctypes.byref(ptr), ctypes.c_size_t(6 << 20), 1))
lib.fakecuda_host_touch(ctypes.c_void_p(ptr.value), ctypes.c_size_t(6 << 20))
out = {}
for what, base, size, to in (("one", 0, 2 << 20, 0), ("three", 0, 6 << 20, 0), ("evict", 0, 2 << 20, -1)):
    ok(lib.cuStreamSynchronize(stream))
    before = caller_ns()
    ok(lib.cuMemPrefetchAsync(ctypes.c_uint64(ptr.value + base), ctypes.c_size_t(size), to, stream))
    out[what] = caller_ns() - before
ok(lib.cuStreamSynchronize(stream))
# The shim's link probe (shim/engine/link_rate.c): two events around one prefetch of host-resident
# blocks, here 32 of them; the median of seven. fakecuda sleeps its modelled costs and a stream's
# thread stamps its events, so a loaded machine moves a probe either way: one probe read 19.6 GB/s
# in a CI run, and with three CPU burners on two cores some read the copy's 24.8 (the start
# stamped late, after the call's host time), against the model's 20.0.
big, start, end, ms = ctypes.c_uint64(), ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_float()
ok(lib.cuMemAllocManaged(ctypes.byref(big), ctypes.c_size_t(64 << 20), 1))
lib.fakecuda_host_touch(ctypes.c_void_p(big.value), ctypes.c_size_t(64 << 20))
ok(lib.cuEventCreate(ctypes.byref(start), 0))
ok(lib.cuEventCreate(ctypes.byref(end), 0))
rates = []
for _ in range(7):
    ok(lib.cuEventRecord(start, stream))
    ok(lib.cuMemPrefetchAsync(big, ctypes.c_size_t(64 << 20), 0, stream))
    ok(lib.cuEventRecord(end, stream))
    ok(lib.cuStreamSynchronize(stream))
    ok(lib.cuEventElapsedTime(ctypes.byref(ms), start, end))
    rates.append((64 << 20) / (ms.value * 1e-3))
    ok(lib.cuMemPrefetchAsync(big, ctypes.c_size_t(64 << 20), -1, stream))  # back to the host, untimed
    ok(lib.cuStreamSynchronize(stream))
out["probed_bytes_per_s"] = sorted(rates)[3]
print(json.dumps(out))
"""


def test_the_simulator_charges_what_fakecuda_charges(c_build):
    env = dict(clean_env(), LD_LIBRARY_PATH=str(c_build / "plain"))
    proc = subprocess.run([sys.executable, "-c", FAKECUDA_COSTS], env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    measured = json.loads(proc.stdout)
    costs = host.HostCosts.of_fakecuda()
    model = engine.fakecuda()
    # The pages each call moves cost the caller beside the passes (the first call's block is
    # resident when the second runs); a move to the host waits for its copy, the pages' CPU
    # time inside that wait (the measured rate is the whole call's: not charged twice).
    copy = 2 * MIB / model.d2h_rate
    assert copy > costs.moved(2 * MIB)
    modelled = {"one": costs.migrate(1) + costs.moved(2 * MIB), "three": costs.migrate(3) + costs.moved(4 * MIB),
                "evict": costs.migrate(1) + copy}
    for what, seconds in modelled.items():
        assert measured[what] == pytest.approx(seconds * 1e9, rel=1e-6, abs=1), (what, measured, modelled)
    # What pumpd plans at, timed as the shim times it, is the model's planning rate (the call's
    # fixed cost aside: 4.8 us over 32 blocks), well below the copy's (5%: the probes' noise, a
    # fifth of the 25% between the two rates).
    assert measured["probed_bytes_per_s"] == pytest.approx(costs.probed_rate(model.bandwidth), rel=0.05), measured
    assert costs.probed_rate(model.bandwidth) < 0.85 * model.bandwidth


def _one_buffer(tmp_path, blocks=3, steps=4):
    t = TraceBuilder()
    buf = t.alloc(blocks * 2 * MIB)
    other = t.alloc(blocks * 2 * MIB)
    for s in range(steps):
        t.step(s)
        for b in (buf, other):
            t.launch(1, [b], [(b, blocks * 2 * MIB, True)], 1e9, blocks * 2 * MIB)
    return workload.load(t.write(str(tmp_path / "one.trace")), batch_launches=2)


def test_pumps_calls_delay_the_launches_that_make_them(tmp_path):
    """Two buffers of three blocks take turns in room for one: the launch rule evicts one
    range and prefetches the other at every launch, on the launching thread."""
    w = _one_buffer(tmp_path)
    model = engine.gpu_model("h100-pcie")
    free = dataclasses.replace(model, host_costs=False)
    cap = 3 * 2 * MIB
    charged, uncharged = engine.run(w, "launch", cap, model), engine.run(w, "launch", cap, free)
    costs = host.HostCosts.of_fakecuda()
    # Per launch after the first: one eviction range (waiting for its copy) and one prefetch
    # range, each moving its three blocks.
    prefetch = costs.migrate(3) + costs.moved(3 * 2 * MIB)
    evict = costs.migrate(3) + 3 * 2 * MIB / model.d2h_rate
    per_launch = evict + prefetch
    assert charged.driver_ranges == 2 * w.launches - 1
    assert charged.host_seconds == pytest.approx(prefetch + (w.launches - 1) * per_launch)
    assert uncharged.host_seconds == 0 and uncharged.driver_ranges == 0
    # Same moves, later launches: a step lasts at least its launching thread's calls (it
    # begins when the GPU is idle, and its kernels wait for their hooks' calls).
    assert charged.bytes_d2h == uncharged.bytes_d2h and charged.prefetch_calls == uncharged.prefetch_calls
    assert charged.steady_mean("host") == pytest.approx(2 * per_launch)
    assert charged.step_mean_seconds >= charged.steady_mean("host") > uncharged.step_mean_seconds


def test_ideal_and_the_drivers_naive_cost_pump_nothing(tmp_path):
    w = _one_buffer(tmp_path)
    for policy in ("ideal", "naive"):
        assert engine.run(w, policy, 3 * 2 * MIB, engine.gpu_model("h100-pcie")).host_seconds == 0


def test_the_calls_decided_after_a_kernel_are_the_workers():
    """pump's worker (shim/engine/prefetch_worker.c) makes the calls a rule decides after a kernel (a
    plan's trigger, policy off's evictions): they cost the worker's clock, and the launching
    thread's goes on from where it was. Before the worker, the eviction moved the launching
    thread's clock to 1.750025 s."""
    t = host.LaunchThread(host.HostCosts.of_fakecuda(), [0, 2 * MIB, 4 * MIB])
    costs = host.HostCosts.of_fakecuda()
    t.hook(1.0)
    assert t.call("prefetch", 0, 1.0) == pytest.approx(1.0 + costs.migrate(1))
    t.hook()  # the kernel is launched: what follows is decided after it
    assert t.call("evict", 1, 1.5, wait=0.25) == pytest.approx(1.5 + costs.migrate(1) + 0.25)
    assert t.clock == pytest.approx(1.0 + costs.migrate(1))
    assert t.worker_seconds == pytest.approx(costs.migrate(1) + 0.25)
    assert t.seconds == pytest.approx(2 * costs.migrate(1) + 0.25)
    t.hook(2.0)
    assert t.call("prefetch", 2, 2.0) == pytest.approx(2.0 + costs.migrate(1))

