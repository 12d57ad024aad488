"""The simulator's fault path (pump/simulate/gpu_truth.py) is fakecuda's (issue 28 item 1):
the fault-time prefetcher's rule against fakecuda/fault_prefetch.c itself, compiled
here, on random blocks; and whole workloads replayed on fakecuda with no pump against the
simulator's naive model, count for count: faults, batches, bytes each way, the driver's
evictions (batches ending inside blocks, partly touched blocks, short blocks, a full GPU)."""

import ctypes
import dataclasses
import json
import os
import random
import subprocess
import sys

import pytest

from helpers import clean_env
from pump.simulate import constants as K
from pump.simulate import engine, workload
from pump.simulate.gpu_truth import FaultRules, GpuTruth, prefetch_pages
from synthetic_trace import MIB, TraceBuilder

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FAKECUDA = os.path.join(ROOT, "fakecuda")
LOC_UNPOP, LOC_HOST, LOC_DEV0 = 0, 1, 2     # fakecuda_internal.h, FC_LOC_*
BIT_FAULTED, BIT_DRIVER_PF = 8, 16          # FC_BIT_*
KIB = 1 << 10


def test_the_presets_take_the_drivers_defaults_as_fakecuda_names_them():
    f = K.fakecuda_constants()
    assert f["FAKECUDA_UVM_PERF_PREFETCH_ENABLE"] == 1
    path = K.GPU_PRESETS[K.DEFAULT_GPU].fault_path
    assert (path.batch_faults, path.prefetch_threshold, path.prefetch_min_faults) == (
        f["FAKECUDA_UVM_PERF_FAULT_BATCH_COUNT"], f["FAKECUDA_UVM_PERF_PREFETCH_THRESHOLD"],
        f["FAKECUDA_UVM_PERF_PREFETCH_MIN_FAULTS"])
    model = engine.fakecuda()
    assert (model.fault_batch, model.prefetch_threshold, model.prefetch_min_faults) == (
        path.batch_faults, path.prefetch_threshold, path.prefetch_min_faults)


@pytest.fixture(scope="module")
def fault_prefetch_c(tmp_path_factory):
    """fault_prefetch.c built alone, with its knobs settable (fakecuda's stats.c holds them)."""
    out = tmp_path_factory.mktemp("fault_prefetch")
    headers = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "find-cuda-headers")],
                             capture_output=True, text=True)
    if headers.returncode:
        pytest.skip("cuda.h not found (pip install nvidia-cuda-runtime)")
    stub = out / "cfg.c"
    stub.write_text('#include "fakecuda_internal.h"\nfc_config fc_cfg;\n'
                    "void set_cfg(unsigned enable, unsigned threshold, unsigned min_faults)\n"
                    "{ fc_cfg.prefetch_enable = enable; fc_cfg.prefetch_threshold = threshold;"
                    " fc_cfg.prefetch_min_faults = min_faults; }\n")
    lib = out / "libfault_prefetch.so"
    subprocess.run(["cc", "-std=c11", "-O1", "-shared", "-fPIC", "-I", FAKECUDA, "-I", headers.stdout.strip(),
                    os.path.join(FAKECUDA, "fault_prefetch.c"), str(stub), "-o", str(lib)], check=True)
    return ctypes.CDLL(str(lib))


class PrefetchInfo(ctypes.Structure):
    _fields_ = [("proc", ctypes.c_uint8), ("faults", ctypes.c_uint32)]


def _c_prefetch(lib, npages, resident, faulted, populated):
    """fc_prefetch_plan's pages, as a mask, on a fresh block (no preferred location)."""
    arr = ctypes.c_uint8 * npages
    loc = arr(*[LOC_DEV0 if resident >> i & 1 else LOC_HOST if populated >> i & 1 else LOC_UNPOP
                for i in range(npages)])
    bits = arr(*[BIT_FAULTED if faulted >> i & 1 else 0 for i in range(npages)])
    lib.fc_prefetch_plan(ctypes.c_size_t(npages), loc, arr(), bits, ctypes.c_uint8(LOC_DEV0),
                         ctypes.byref(PrefetchInfo(LOC_DEV0, 0)))
    return sum(1 << i for i in range(npages) if bits[i] & BIT_DRIVER_PF)


@pytest.mark.parametrize("threshold", [51, 0, 25, 75, 100])
def test_the_prefetch_rule_is_fault_prefetch_cs(fault_prefetch_c, threshold):
    """2,000 random blocks (full and short, sparse and dense): the same pages, every one."""
    fault_prefetch_c.set_cfg(1, threshold, 1)
    rng = random.Random(threshold)
    for _ in range(2000):
        npages = rng.choice([K.PAGES_PER_BLOCK] * 3 + list(range(1, K.PAGES_PER_BLOCK)))
        full = (1 << npages) - 1
        density = rng.random()
        resident = sum(1 << i for i in range(npages) if rng.random() < density / 2)
        faulted = sum(1 << i for i in range(npages) if rng.random() < density) & ~resident & full
        if not faulted:
            continue
        populated = resident | rng.getrandbits(npages)
        want = _c_prefetch(fault_prefetch_c, npages, resident, faulted, populated)
        got = prefetch_pages(npages, faulted | resident, faulted, threshold) & ~resident
        assert got == want, (npages, bin(resident), bin(faulted), bin(got), bin(want))


# ---- whole workloads, replayed on fakecuda with no pump ----
def _workload_trace(path, seed):
    """Allocations, some with a short last block; launches touching random ranges (inside
    blocks, across them, longer than a batch), whole allocations, and the same block twice."""
    rng = random.Random(seed)
    t = TraceBuilder()
    sizes = [20 * MIB, 5 * MIB + 192 * KIB, 9 * MIB, 3 * MIB + 64 * KIB, 12 * MIB]
    bases = [t.alloc(s) for s in sizes]
    for step in range(4):
        t.step(step)
        for _ in range(12):
            i = rng.randrange(len(bases))
            if rng.random() < 0.2:
                t.launch(1 + i, [bases[i]])
                continue
            extents = []
            for _ in range(rng.randint(1, 3)):
                start = rng.randrange(0, sizes[i] // (64 * KIB)) * 64 * KIB + rng.choice([0, 4 * KIB])
                length = rng.choice([64 * KIB, 700 * KIB, 1536 * KIB, 17 * MIB, 3 * MIB])
                extents.append((bases[i] + start, min(length, sizes[i] - start), rng.random() < 0.5))
            t.launch(1 + i, [bases[i]], extents)
    return t.write(str(path))


def _replayed(c_build, trace, device_memory):
    """fakecuda's counters after replay_trace ran the trace on it, no pump."""
    stats = trace.parent / "fakecuda.json"
    env = dict(clean_env(), LD_LIBRARY_PATH=str(c_build / "plain"), FAKECUDA_STATS=str(stats))
    if device_memory:
        env["FAKECUDA_DEVICE_MEMORY"] = str(device_memory)
    proc = subprocess.run([str(c_build / "plain" / "replay_trace"), str(trace)], env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return json.loads(stats.read_text())


@pytest.mark.parametrize("device_mib", [0, 16, 9])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_replay_on_fakecuda_faults_as_the_simulator_says(c_build, tmp_path, seed, device_mib):
    """The simulator's naive model with fakecuda's constants, no budget, on a GPU of fakecuda's
    memory (0: fakecuda's default, more than the workload): every count equal."""
    trace = tmp_path / "w.trace"
    _workload_trace(trace, seed)
    measured = _replayed(c_build, trace, device_mib * MIB)
    model = engine.fakecuda()
    capacity = device_mib * MIB or 1 << 40
    if device_mib:
        model = dataclasses.replace(model, gpu_limits_memory=True)
    r = engine.run(workload.load(trace, daemon_reads_steps=True), "naive", capacity, model)
    predicted = {"gpu_faults": r.faults, "gpu_fault_batches": r.fault_batches,
                 "bytes_faulted_h2d": r.bytes_faulted_h2d, "bytes_fault_prefetched_h2d": r.bytes_fault_prefetched_h2d,
                 "driver_evictions": r.driver_evictions, "bytes_evicted_d2h": r.bytes_d2h}
    assert {k: measured[k] for k in predicted} == predicted
    # The workload exercises what is compared: the prefetcher saves faults, moves bytes once
    # pages have been to the host (first touches populate in place), and the GPU fills.
    off = engine.run(workload.load(trace, daemon_reads_steps=True), "naive", capacity,
                     dataclasses.replace(model, prefetch_threshold=None))
    assert off.faults > r.faults
    assert (measured["bytes_fault_prefetched_h2d"] > 0, measured["driver_evictions"] > 0) == (bool(device_mib),) * 2


def test_a_short_blocks_chunk_keeps_its_place_when_pump_empties_it(tmp_path):
    """devmem.c (block_mark_memory_used, block_clear_resident_processor): a full block emptied
    by pump gives its chunk up (UNUSED, evicted first at no cost) and goes to USED's tail when
    it comes back; a short block's chunk stays on USED where it was allocated, so it is the
    driver's next victim.  And only a wholly discarded full block ranks before USED."""
    t = TraceBuilder()
    short, full, other = t.alloc(MIB + 192 * KIB), t.alloc(2 * MIB), t.alloc(2 * MIB)
    for base in (short, full, other):
        t.launch(1, [base])
    w = workload.load(t.write(str(tmp_path / "s.trace")))
    r = engine.Result("naive", 0, [], [])
    gpu = GpuTruth(w, r, 8 * MIB, True, FaultRules(256, 51, 1))
    s, f, o = range(3)
    for b in (s, f, o):
        gpu.kernel(w.touch_order[b])
    assert list(gpu.chunks) == [s, f, o] and gpu.bytes == 5 * MIB + 192 * KIB
    for b in (s, f):
        gpu.evict(b)                       # pump moves them to the host
    assert list(gpu.chunks) == [s, o]      # the short chunk stays, empty, in its place
    gpu.kernel(w.touch_order[f])           # f comes back: a new chunk at USED's tail
    assert list(gpu.chunks) == [s, o, f]
    gpu.kernel(w.touch_order[s])           # s comes back into its old chunk: no move
    assert list(gpu.chunks) == [s, o, f]
    gpu.capacity = 6 * MIB                 # room for 2 MiB more: one victim, the short block
    assert gpu.make_room(2 * MIB, None) == MIB + 192 * KIB and list(gpu.chunks) == [o, f]
    gpu.kernel(w.touch_order[s])
    gpu.discard(s, w.block_pages[s])       # a wholly discarded short block stays on USED
    gpu.discard(f, w.block_pages[f])       # a full one ranks first
    assert list(gpu.chunks) == [f, o, s]
