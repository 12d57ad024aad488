"""The real client's training loops (tests/real_client/train.py: GPT-style with AdamW foreach and
fused, a conv net with cuDNN benchmarking, and the GPT-style step captured in a CUDA graph and
replayed) on fakecuda's H100 persona, under pump-run with each way PyTorch's memory can be
handed out, against the same loops bare (issue 26 item 4):
- "caching": PyTorch's caching allocator, followed by pump's bridge (pump/boot/torch_trace.cpp,
  built against the job's PyTorch), so that pump sees tensors, not segments;
- "pump_allocator": `[memory] torch_allocator = "pump"` (PUMP_TORCH_ALLOCATOR=pump), pump's
  allocator with PyTorch's memory answers (pump/boot/torch_allocator.cpp);
- "expandable": PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (virtual memory management:
  pump leaves it device memory, so it has nothing to prefetch there). PyTorch 2.14's expandable
  segments ask NVML about fabric access at their first mapping and call through null pointers
  where there is no libnvidia-ml.so.1: these runs get fakecuda's (build/tests/nvml).
What must hold, in every mode: the job exits and prints as it does bare (every loop ran, the
same checkpoints, PyTorch's memory answers held: train.py's memory_answers); pump followed or
was the allocator; fakecuda's launch count is pump's; no driver call pump made failed; every
live allocation a launch's real layout points into was sent for prefetch, of a PyTorch tensor
list the slots its kernel reads (test_real_client_training.layout_misses), and nothing through
the other slots; and a small model through torch.compile, whose Triton
kernels build for the persona without a GPU. Each check is seen failing once with what it guards
broken: a memory answer one block off (the bridge compiled from a patched copy), PyTorch's own
pluggable allocator in place of pump's bridge, a driver call made to fail, the graph launch hook
passed by, the scan cut to 8 parameters (build/tests/scan8/libpump.so, test build only).
Not checked here: values (kernels are no-ops on fakecuda), faults, timing."""

import json
import os
import subprocess

import pytest

from helpers import PUMP_RUN, clean_env
from test_real_client import cuda_torch  # noqa: F401 (the fixture that skips without torch's CUDA build)
from test_real_client_training import PERSONA, TRAIN, launch_count_differences, layout_misses, unused_slots

LOOPS = "gpt_foreach,gpt_fused,conv,graph"
MODES = {
    "caching": {},
    "pump_allocator": {"PUMP_TORCH_ALLOCATOR": "pump"},
    "expandable": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"},
}
NOT_FOLLOWED = "PyTorch's allocator is not followed"
NO_ANSWERS = "PyTorch's memory answers (memory_stats) are missing"


def run(python, c_build, out, pump, loops=LOOPS, **extra):
    """Runs the loops; returns (process, the client's JSON, fakecuda's stats, pump's stats or None)."""
    out.mkdir()
    env = clean_env()
    env.update(LD_LIBRARY_PATH=str(c_build / "plain"), FAKECUDA_PERSONA=PERSONA,
               FAKECUDA_STATS=str(out / "fakecuda.json"), **extra)
    if "expandable_segments" in extra.get("PYTORCH_CUDA_ALLOC_CONF", ""):
        env["LD_LIBRARY_PATH"] += os.pathsep + str(c_build / "nvml")
    cmd = [python, str(TRAIN), str(out), loops]
    if pump:
        env["FAKECUDA_LAUNCH_LOG"] = str(out / "launches.jsonl")
        cmd = [PUMP_RUN, "--trace", str(out / "pump.trace"), "--stats", str(out / "pump.json"), "--", *cmd]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    lines = proc.stdout.strip().splitlines()
    result = json.loads(lines[-1]) if lines else None
    read = lambda name: json.loads((out / name).read_text()) if (out / name).exists() else None  # noqa: E731
    return proc, result, read("fakecuda.json"), read("pump.json")  # none where the process died


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """One cache of pump's bridges for the module: each is built once, from this tree's source."""
    return str(tmp_path_factory.mktemp("bridges"))


@pytest.fixture(scope="module")
def runs(cuda_torch, c_build, tmp_path_factory, cache):  # noqa: F811
    tmp = tmp_path_factory.mktemp("allocators")
    bare = {"": run(cuda_torch, c_build, tmp / "bare", False)}
    bare["expandable"] = run(cuda_torch, c_build, tmp / "bare-expandable", False, **MODES["expandable"])
    pumped = {mode: run(cuda_torch, c_build, tmp / mode, True, XDG_CACHE_HOME=cache, **env)
              for mode, env in MODES.items()}
    return {"bare": bare, "pump": pumped, "dir": tmp}


def bare_of(runs, mode):
    return runs["bare"]["expandable" if mode == "expandable" else ""]


def differences_from_bare(bare, pumped):
    """How a pumped run differs from the bare one (which ran every loop): exit status, any loop it
    ran or a memory answer (empty: none)."""
    (b, b_out, _, _), (p, p_out, _, stats) = bare, pumped
    out = {}
    if b.returncode != 0 or p.returncode != b.returncode or (stats and stats["exit_code"] != 0):
        out["exit (bare, pump)"] = (b.returncode, p.returncode, b.stderr[-1500:], p.stderr[-1500:])
    differing = {k: v for k, v in (p_out or {}).items() if (b_out or {}).get(k) != v}
    if differing or not p_out:
        out["output"] = differing
    if b_out and (not b_out["memory"]["ok"] or b_out["memory"]["violations"]):
        out["bare memory answers"] = b_out["memory"]
    return out


def failed_calls(pump_stats):
    t = pump_stats["totals"]
    return {k: t[k] for k in ("errors", "events_dropped", "capacity_refusals", "prefetch_refusals") if t[k]}


@pytest.mark.parametrize("mode", MODES)
def test_the_job_runs_under_pump_as_it_does_bare(runs, mode):
    bare_out = bare_of(runs, mode)[1]
    assert bare_out and all(v["ok"] for v in bare_out.values()), bare_out
    assert not differences_from_bare(bare_of(runs, mode), runs["pump"][mode])


@pytest.mark.parametrize("mode", MODES)
def test_pump_follows_or_is_the_allocator(runs, mode):
    proc, _, _, stats = runs["pump"][mode]
    t = stats["totals"]
    notices = [line for line in proc.stderr.splitlines() if line.startswith("pump:") and "launches (" not in line]
    print(mode, {k: t[k] for k in ("torch_allocs", "torch_tensor_allocs", "vmm_allocs", "graph_launches")}, notices)
    if mode == "caching":  # the bridge built against torch 2.14's headers (C++20) and attached
        assert t["torch_tensor_allocs"] > 1000 and t["torch_allocs"] == 0
    elif mode == "pump_allocator":  # pump's allocator, with its memory answers (no fallback notice)
        assert t["torch_allocs"] > 1000 and t["torch_tensor_allocs"] == 0
    else:  # expandable segments: cuMemCreate memory, which pump leaves as device memory
        assert t["vmm_allocs"] > 0 and t["torch_allocs"] == 0
    assert not [n for n in notices if NOT_FOLLOWED in n or NO_ANSWERS in n], notices
    assert t["graph_launches"] >= 3  # the graph loop replayed its captured step


@pytest.mark.parametrize("mode", MODES)
def test_every_launch_reached_pumps_hooks(runs, mode):
    _, _, fakecuda, pump = runs["pump"][mode]
    assert fakecuda["launches"] > 1000
    assert not launch_count_differences(fakecuda, pump)


@pytest.mark.parametrize("mode", MODES)
def test_no_driver_call_pump_makes_fails(runs, mode):
    stats = runs["pump"][mode][3]
    assert stats["exit_code"] == 0  # a job that died made fewer calls: it vouches for none
    assert not failed_calls(stats)


@pytest.mark.parametrize("mode", MODES)
def test_pump_sent_every_live_allocation_the_real_layouts_point_into(runs, mode):
    out = runs["dir"] / mode
    log, misses, wide, stale = layout_misses(out / "launches.jsonl", out / "pump.trace")
    print(f"{mode}: {len(log)} launches, {wide} wider than the trace keeps, {stale} words into freed space")
    assert not misses, json.dumps(misses[:5], indent=1) + f"\n... {len(misses)} launches in all"


def test_fakecuda_tells_which_slots_of_a_tensor_list_the_kernel_reads(runs):
    """PyTorch's foreach and fused-optimizer launches (multi_tensor_apply) pass their tensors in a
    by-value struct whose slots past the launch's tensors hold an earlier launch's: fakecuda logs
    the words the kernel reads (fakecuda/tensor_lists.c, from the block_to_tensor the launch
    filled). Every such launch of torch's build has a layout fakecuda knows, and what it says the
    kernel reads is what the host filled: the first k slots of every list (a launch's tensors fill
    them from 0, each with a block at least), each a pointer into an allocation. pump reads the
    same structs on its own (shim/lookup/tensor_lists.c) and takes nothing through the other
    slots (issue 43 item 5; its scan took every word before: 6,199 allocations, 32 MB, here). Seen
    failing with a block_to_tensor read 8 bytes late (fakecuda's or pump's)."""
    out = runs["dir"] / "caching"
    log = [json.loads(line) for line in (out / "launches.jsonl").read_text().splitlines()]
    lists = [e for e in log if "multi_tensor_apply_kernel" in e["kernel"]]
    unknown = sorted({(e["params"][0][1], e["kernel"][:160]) for e in lists if "tensor_list" not in e})
    assert len(lists) > 50 and not unknown, unknown
    for e in lists:
        tl, pointers = e["tensor_list"], {p[1] for p in e["pointers"] if p[0] == 0}
        lists_read = [sorted(o // 8 - d * tl["tensors"] for o in tl["reads"] if o // 8 // tl["tensors"] == d)
                      for d in range(tl["depth"])]
        k = len(lists_read[0])
        assert k and all(slots == list(range(k)) for slots in lists_read), (e["kernel"][:120], lists_read)
        assert set(tl["reads"]) <= pointers, (e["kernel"][:120], tl["reads"][:8])
    unused = unused_slots(out / "launches.jsonl", out / "pump.trace")
    print(unused)
    assert unused["launches"] > 50 and unused["alive"] > 0 and unused["taken"] == 0, unused


def test_a_compiled_model_runs_under_pump_as_it_does_bare(cuda_torch, c_build, tmp_path, cache):  # noqa: F811
    """torch.compile builds for the persona without a GPU: Inductor's Triton kernels are compiled
    by Triton's own ptxas for sm_90 (an offline compiler), fakecuda loads their cubins and runs
    them as no-ops. Autotuning launches each candidate; its modules come and go, so the driver
    reuses handles. Compiled in-process (TORCHINDUCTOR_COMPILE_THREADS=1): a pool of compile
    workers would be processes that never touch the driver, which pump reports as passed through."""
    env = dict(TORCHINDUCTOR_COMPILE_THREADS="1")
    bare = run(cuda_torch, c_build, tmp_path / "bare", False, loops="compiled",
               TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor-bare"), **env)
    pumped = run(cuda_torch, c_build, tmp_path / "pump", True, loops="compiled", XDG_CACHE_HOME=cache,
                 TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor-pump"), **env)
    assert bare[1] and bare[1]["compiled"]["ok"], (bare[1], bare[0].stderr[-3000:])
    assert not differences_from_bare(bare, pumped)
    assert not launch_count_differences(pumped[2], pumped[3]) and not failed_calls(pumped[3])
    log, misses, _, _ = layout_misses(tmp_path / "pump" / "launches.jsonl", tmp_path / "pump" / "pump.trace")
    triton = sum(1 for e in log if e["kernel"].startswith("triton_"))
    print(f"{len(log)} launches, {triton} of Triton kernels")
    assert triton > 0 and not misses, misses[:5]


# ---- each check above, seen failing with what it guards broken ----

def off_by_one_block_compiler(tmp_path):
    """A C++ compiler that builds pump's allocator bridge from a copy whose memory_stats count
    every allocation's bytes one 512-byte block (the caching allocator's smallest) too large. Only
    allocated_bytes: a size made larger where the bridge takes it would also count an allocation
    of 1 MiB less 511 to 1 MiB in the large pool and its free in the small pool, whose count then
    goes negative, which PyTorch asserts on (SIGABRT) before any memory answer is read: torch
    2.15's conv loop allocates exactly 1 MiB three times, 2.14's never."""
    script = tmp_path / "c++-off-by-one-block"
    script.write_text(f"""#!/bin/sh
for arg; do
  case "$arg" in
    *torch_allocator.cpp) sed 's/s.allocated_bytes\\[t\\].increase(size)/s.allocated_bytes[t].increase(size + 512)/' "$arg" \\
        > {tmp_path}/patched.cpp; set -- "$@" {tmp_path}/patched.cpp ;;
    *) set -- "$@" "$arg" ;;
  esac
  shift
done
exec c++ "$@"
""")
    script.chmod(0o755)
    return script


def test_a_memory_answer_off_by_one_block_is_seen(cuda_torch, c_build, runs, tmp_path):  # noqa: F811
    pumped = run(cuda_torch, c_build, tmp_path / "run", True, loops="conv", CXX=str(off_by_one_block_compiler(tmp_path)),
                 XDG_CACHE_HOME=str(tmp_path / "cache"), **MODES["pump_allocator"])
    assert (tmp_path / "patched.cpp").exists()  # the patched copy is what was built
    violations = pumped[1]["memory"]["violations"]
    print(violations)
    assert any(v.startswith("allocated_bytes.all.current") for v in violations)
    assert "output" in differences_from_bare(bare_of(runs, "pump_allocator"), pumped)


def test_pytorchs_own_pluggable_allocator_is_seen(cuda_torch, c_build, runs, tmp_path):  # noqa: F811
    """Without the bridge (no compiler), PyTorch's CUDAPluggableAllocator stands in: memory_stats
    and cuDNN's cacheInfo raise (pytorch/pytorch#98481), and the job no longer runs as bare."""
    pumped = run(cuda_torch, c_build, tmp_path / "run", True, loops="conv", CXX="/nowhere/c++",
                 XDG_CACHE_HOME=str(tmp_path / "cache"), **MODES["pump_allocator"])
    assert NO_ANSWERS in pumped[0].stderr
    out = pumped[1]
    print(out["conv"], out["memory"])
    assert "does not yet support cacheInfo" in out["conv"]["error"]
    assert "does not yet support getDeviceStats" in out["memory"]["error"]
    assert "output" in differences_from_bare(bare_of(runs, "pump_allocator"), pumped)


def test_a_failed_driver_call_is_seen(cuda_torch, c_build, tmp_path, cache):  # noqa: F811
    """pump's prefetches refused by the driver: the check on pump's driver calls must see it."""
    pumped = run(cuda_torch, c_build, tmp_path / "run", True, loops="conv", XDG_CACHE_HOME=cache,
                 FAKECUDA_FAIL="cuMemPrefetchBatchAsync=CUDA_ERROR_INVALID_VALUE")
    print(failed_calls(pumped[3]))
    assert failed_calls(pumped[3])


def test_the_graph_launch_hook_passed_by_is_seen(cuda_torch, c_build, tmp_path, cache):  # noqa: F811
    """A driver whose cuGetProcAddress answers cuGraphLaunch with an internal function: the
    replays' kernels pass pump by, and the launch count check must see it."""
    pumped = run(cuda_torch, c_build, tmp_path / "run", True, loops="graph", XDG_CACHE_HOME=cache,
                 FAKECUDA_PROCADDR_INTERNAL="cuGraphLaunch,cuGraphLaunch_ptsz")
    assert pumped[0].returncode == 0 and "pump cannot put its hook there" in pumped[0].stderr, pumped[0].stderr[-3000:]
    diff = launch_count_differences(pumped[2], pumped[3])
    print(diff)
    assert diff["graph launches (fakecuda, pump)"] == (3, 0)  # each replay passed pump by


def test_a_scan_cut_to_8_parameters_is_seen(cuda_torch, c_build, tmp_path, cache):  # noqa: F811
    shim = c_build / "scan8" / "libpump.so"
    assert shim.is_file(), "build/tests/scan8/libpump.so: built by tests/real_client/broken_shim.cmake"
    out = tmp_path / "run"
    pumped = run(cuda_torch, c_build, out, True, loops="gpt_fused", XDG_CACHE_HOME=cache, PUMP_SHIM_PATH=str(shim))
    assert pumped[0].returncode == 0, pumped[0].stderr[-3000:]
    _, misses, _, _ = layout_misses(out / "launches.jsonl", out / "pump.trace")
    print(len(misses), misses[:1])
    assert misses and all("sgemm" in m["kernel"] or "gemm" in m["kernel"] for m in misses[:3])


def test_the_bridges_build_against_the_clients_pytorch(runs, cache):
    """Both bridges were compiled against PyTorch 2.14's own headers into the module's cache
    (C++20: 2.14's c10/util/intrusive_ptr.h declares operator<=>; C++17 fails)."""
    built = sorted(name.split("-")[0] for name in os.listdir(os.path.join(cache, "pump")))
    assert built == ["torch_allocator", "torch_trace"], built


REFUSED = """
import torch
try:
    x = torch.empty(1 << 20, device="cuda")
    print("allocated", x.data_ptr() != 0)
except torch.OutOfMemoryError as e:
    print("OutOfMemoryError", str(e).splitlines()[0])
"""


@pytest.mark.parametrize("bridge", [True, False], ids=["pumps-bridge", "pytorchs-pluggable"])
def test_an_allocation_pump_refuses_is_pytorchs_out_of_memory_error(cuda_torch, c_build, tmp_path, cache, bridge):  # noqa: F811
    """The driver refuses pump's pool allocation: pump's allocator answers NULL, which its bridge
    raises as torch.OutOfMemoryError; PyTorch's own CUDAPluggableAllocator hands the NULL to the
    tensor as its data (the pytorchs-pluggable case shows the tensor PyTorch then makes)."""
    env = clean_env()
    env.update(LD_LIBRARY_PATH=str(c_build / "plain"), FAKECUDA_PERSONA=PERSONA, PUMP_TORCH_ALLOCATOR="pump",
               FAKECUDA_FAIL="cuMemAllocFromPoolAsync=CUDA_ERROR_OUT_OF_MEMORY",
               XDG_CACHE_HOME=cache if bridge else str(tmp_path / "cache"), **({} if bridge else {"CXX": "/nowhere/c++"}))
    proc = subprocess.run([PUMP_RUN, "--", cuda_torch, "-c", REFUSED], env=env, capture_output=True, text=True,
                          timeout=600)
    print(proc.stdout, proc.stderr[-2000:])
    if bridge:
        assert proc.stdout.startswith("OutOfMemoryError CUDA out of memory: pump's allocator could not allocate 4194304")
    else:
        assert proc.stdout.strip() == "allocated False"  # a tensor with no memory behind it
