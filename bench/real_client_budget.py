"""real_client_budget.py: the real client at a 50% budget, its kernels' traffic counted (issue 41
items 4 and its targets; scripts/bench-real-client-budget runs it and writes
bench/results/real-client-budget.json).

PyTorch's CUDA build, unmodified, trains a workload on fakecuda as an H100 SXM 80GB
(bench/steady_real_client.py runs bench/real_client_step.py and reads its steps). fakecuda runs
PyTorch's kernels without a body, so each run below is given what every launch touched,
recorded once from PyTorch's own view of each operator's tensors (tests/real_client/
operator_uses.py; FAKECUDA_LAUNCH_USES): faults, bytes and the stalls they cost count.

Per workload:
  record     the job under pump-run (no budget) and the recorder: what each launch touched; its
             recorder's Python cost stays in this run, whose figures are not used (lookahead,
             whose allocator places tensors otherwise, has a recording of its own)
  budget     half of the 2 MiB blocks a steady step touches (the recording's median step)
  bound      over the recording's steady steps, repeated (traffic_bound): W, the GPU->host bytes
             per step no policy avoids: at one cut place in every step (the copies a cut counts,
             made since the cut a step before, are other copies than the next cut's), the data
             written since then and read later that the room cannot hold (pump/simulate/bound.py's
             live_written_profile, each step a period of its own); B, the host->GPU bytes, the
             larger of W (what is copied back live is brought back) and Belady's MIN at the budget
             with a use that overwrites a block whole free (steady_bytes_per_cycle with
             creations: what the block held is dead there, and a policy that discards dead data
             moves none of it; blocks one at a time: a bound on every policy); traffic_us their
             times at fakecuda's fastest copy each way, overlapping (full duplex: fakecuda books
             the driver's evictions beside prefetches), and bound_us the larger of that and the
             bare run's step: no policy makes PyTorch's host work faster, and kernels take no
             modelled compute time of their own on fakecuda
  runs       each with the recording, on a device of the budget's size (FAKECUDA_DEVICE_MEMORY: a
             really full card, where what does not fit is the driver's to evict) unless said:
             bare (on the persona's 80 GB, cuMemAlloc's plain memory: no fault, the launching
             threads' floor), pump (pump-run --capacity host: the job's footprint beyond the
             device on the host), lookahead (the same, --policy lookahead), the driver alone
             (pump-run --policy off --capacity host: managed memory, no prefetch), and
             pump_emulated (pump-run --budget on the 80 GB device: pump's evict-only emulation
             of a budget, past which faults fill the device for free: its resident peak shows
             it; the GPU suite's emulated rows), and lookahead_held_discards (lookahead with
             bench/gpu/held_discards.toml: the dead tensors of the blocks pump's allocator keeps
             discarded once the GPU passed their frees, PUMP_HELD_DISCARDS, off by default), and
             pump_allocator and pump_allocator_held_discards (the launch rule on pump's allocator,
             lookahead's recording, without and with held discards: lookahead's plans apart from
             the allocator they run on)
A run with a launch that has no recorded line (launch_uses_missing), or where more than 1% of
launches meet a line they do not match (launch_uses_mismatched: another program or configuration
than the recording's), is refused (checked()).
"""
import bisect
import json
import pathlib
import statistics
import tempfile
import types

import numpy as np

import steady_real_client as client
from pump.simulate import bound
from pump.simulate import constants as K

MIB = 1 << 20
BLOCK = K.BLOCK_BYTES
_MODEL = K.fakecuda_constants()
# The model's fastest copy each way, as fakecuda charges them: in, a migration to the GPU; out,
# the fastest of the driver's evictions, a prefetch to the host and a CPU fault's copy with its
# fixed cost (fakecuda_model.h). No policy's copies run faster, so the bound stays one.
H2D_BYTES_PER_US = _MODEL["FAKECUDA_H2D_BYTES_PER_US"]
D2H_BYTES_PER_US = max(_MODEL["FAKECUDA_EVICT_D2H_BYTES_PER_US"], _MODEL["FAKECUDA_PREFETCH_D2H_BYTES_PER_US"],
                       _MODEL["FAKECUDA_PAGE"] / (_MODEL["FAKECUDA_PAGE"] / _MODEL["FAKECUDA_D2H_BYTES_PER_US"]
                                                  + _MODEL["FAKECUDA_CPU_FAULT_US"]))
WORKLOADS = {"gpt-d256": "tests/real_client/train.py's GPT at width 256 (bench/real_client_step.py)",
             "gpt2-small": "GPT-2 small's configuration, batch 4 of 256 tokens (tests/real_client/workloads.py)"}
TARGET_BYTES_OVER_MIN = 1.25
TARGET_STEP_OVER_BOUND = 1.3
TARGET_PLANNED = 0.95
TARGET_LAUNCH_THREAD_US = 2.0
JOB_FILES = pathlib.Path(__file__).resolve().parent / "gpu"
HELD_DISCARDS = JOB_FILES / "held_discards.toml"
PUMP_ALLOCATOR = JOB_FILES / "pump_allocator.toml"
PUMP_ALLOCATOR_HELD = JOB_FILES / "pump_allocator_held_discards.toml"


class BudgetError(Exception):
    pass


def read_recording(uses_path):
    """(operands by (thread, launch), the order file's launches in order, step starts, sizes), from
    the order file beside the uses file (the uses file names operands by where each launch's
    arguments point in a later run; the order file by allocation, as the bound needs them)."""
    order = json.loads(pathlib.Path(f"{uses_path}.order.json").read_text())
    operands = {(thread, launch): [tuple(use) for use in uses] for thread, launch, uses in order["operands"]}
    return operands, [tuple(x) for x in order["order"]], order["step_starts"], \
        {int(o): n for o, n in order["sizes"].items()}


def blocks_of(uses, sizes, ids, block_bytes):
    """((block id, page mask), ...) touched, written, and both read and written by one launch's
    operands."""
    touched, written, both = {}, {}, {}
    for ordinal, offset, nbytes, mode in uses:
        first, last = offset // K.PAGE_BYTES, (offset + nbytes - 1) // K.PAGE_BYTES
        for page in range(first, last + 1):
            key = (ordinal, page // K.PAGES_PER_BLOCK)
            if key not in ids:
                ids[key] = len(ids)
                block_bytes.append(min(BLOCK, sizes[ordinal] - key[1] * BLOCK))
            bit = 1 << (page % K.PAGES_PER_BLOCK)
            touched[ids[key]] = touched.get(ids[key], 0) | bit
            if "w" in mode:
                written[ids[key]] = written.get(ids[key], 0) | bit
            if mode == "rw":
                both[ids[key]] = both.get(ids[key], 0) | bit
    return tuple(touched.items()), tuple(written.items()), tuple(both.items())


def steady_window(uses_path, warmup):
    """The recording's steady steps as the bound reads them (traffic_bound's first argument):
    per launch the (block, page mask)s it touches, the blocks' bytes, where each step begins,
    and per launch the blocks whose old value is dead there (overwrites: traffic_bound's
    creations); and for live_written_bytes, which takes an access that writes for an overwrite,
    the same launches with a read of what a launch both reads and writes put before it (its old
    value is needed): touched and written per position, and where each step begins there."""
    operands, order, starts, sizes = read_recording(uses_path)
    if len(starts) <= warmup + 1:
        raise BudgetError(f"{uses_path}: {len(starts)} steps recorded, fewer than the warmup {warmup} and two more")
    lo = starts[warmup]
    ids, block_bytes, touched, accesses, live_touched, live_written = {}, [], [], [], [], []
    live_starts = {}
    for position in order[lo:]:
        live_starts[len(touched)] = len(live_touched)
        t, w, both = blocks_of(operands.get(position, ()), sizes, ids, block_bytes)
        touched.append(t)
        accesses.append((t, w, both))
        if both:
            live_touched.append(both)
            live_written.append(())
        live_touched.append(t)
        live_written.append(w)
    live_starts[len(touched)] = len(live_touched)
    overwritten = overwrites(accesses)
    step_bounds = [s - lo for s in starts[warmup:]] + [len(order) - lo]
    live_bounds = [live_starts[s] for s in step_bounds]
    return (touched, np.array(block_bytes, dtype=np.int64), step_bounds, overwritten,
            (live_touched, live_written, live_bounds))


def overwrites(launches):
    """Per launch (its blocks_of), the blocks whose old value is dead there, the window repeated:
    every page of the block this launch does not write without reading it is next read nowhere
    (written first, or not touched again). At such a use a policy that discards dead data brings
    nothing in, and until it keeps nothing of the block that anyone needs."""
    def blocks(t, w, both):
        """(block, pages touched, pages written without a read) for each block a launch touches."""
        written, rewritten = dict(w), dict(both)
        return [(b, mask, written.get(b, 0) & ~rewritten.get(b, 0)) for b, mask in t]

    uses = [blocks(*launch) for launch in launches]
    reads = {}   # (block, page) -> positions where the page is read (first, in its launch)
    writes = {}  # the same, written without a read
    for pos, launch in enumerate(uses):
        for b, mask, only in launch:
            for page in range(K.PAGES_PER_BLOCK):
                if mask >> page & 1:
                    (writes if only >> page & 1 else reads).setdefault((b, page), []).append(pos)
    n = len(launches)

    def next_is_read(b, page, pos):
        """Whether the page's next access after `pos` (cyclically) is a read."""
        r, w = reads.get((b, page), ()), writes.get((b, page), ())
        if not r:
            return False
        after_r, after_w = bisect.bisect_right(r, pos), bisect.bisect_right(w, pos)
        next_r = r[after_r] if after_r < len(r) else r[0] + n
        next_w = w[after_w] if after_w < len(w) else (w[0] + n if w else None)
        return next_w is None or next_r < next_w

    # A use that reads some of the block is none; one that writes it all without reading is one
    # where no other page is read next.
    return [frozenset(b for b, mask, only in launch if only == mask and not any(
        next_is_read(b, page, pos) for page in range(K.PAGES_PER_BLOCK) if not only >> page & 1))
        for pos, launch in enumerate(uses)]


def touched_block_bytes_per_step(window) -> int:
    """The median over a steady_window's steps of the bytes of the blocks each touches."""
    touched, block_bytes, step_bounds = window[:3]
    return int(statistics.median(sum(int(block_bytes[b]) for b in {b for launch in touched[a:z] for b, _ in launch})
                                 for a, z in zip(step_bounds, step_bounds[1:])))


def traffic_bound(window, capacity):
    """The bound at `capacity` bytes over a steady_window (see the module's docstring), per step."""
    touched, block_bytes, step_bounds, overwritten, (live_touched, live_written, live_bounds) = window
    steps = len(step_bounds) - 1
    singles, creations = [], set()
    for launch, blocks in zip(touched, overwritten):
        for b, _ in launch:
            if b in blocks:
                creations.add((len(singles), b))
            singles.append((b,))
    fetched = bound.steady_bytes_per_cycle(singles, block_bytes, capacity // BLOCK, creations=frozenset(creations))
    fetched /= steps
    live_view = types.SimpleNamespace(written=live_written, touched=live_touched, launches=len(live_touched),
                                      events={}, block_address=np.arange(len(block_bytes), dtype=np.int64) * BLOCK)
    # Each step a period of its own, cut at the same place in every step (so that the copies each
    # cut counts, made since the cut a step before, are other copies): the place counting most.
    profiles = [bound.live_written_profile(live_view, a, z) for a, z in zip(live_bounds, live_bounds[1:])]
    shortest = min(len(p) for p in profiles)
    live = max((int(p[:shortest].max()) if shortest else 0) for p in profiles)
    over = sum(np.maximum(0, p[:shortest] - capacity) for p in profiles) if shortest else np.zeros(1)
    write_back = float(over.max()) / steps
    h2d = max(fetched, write_back)  # what is copied back live is brought back in
    return {"min_bytes_per_step": round(h2d), "min_bytes_d2h_per_step": round(write_back),
            "min_fetched_bytes_per_step": round(fetched), "live_written_bytes": live,
            "touched_block_bytes_per_step": touched_block_bytes_per_step(window),
            "traffic_us": round(max(h2d / H2D_BYTES_PER_US, write_back / D2H_BYTES_PER_US), 1), "bound_steps": steps}


MISMATCHED_MOST = 0.01  # of the launches given their lines


def checked(result, what):
    """The run's steady figures, refused where a launch had no recorded line, or more than 1% of
    them met a line they did not match. A caching allocator that makes its segments in another
    order (when its streams' events complete decides which cached block it reuses, and so when it
    must allocate) leaves an operand named by allocation order on another allocation: each such
    launch touches the operands it can place, and is counted (launch_uses_mismatched_per_step)."""
    s = result["steady"]
    if s["launch_uses_missing"] or s["launch_uses_mismatched"] > MISMATCHED_MOST * s["launches_given_uses"] \
            or not s["launches_given_uses"]:
        raise BudgetError(f"{what}: {s['launch_uses_missing']:g} launches per step without a recorded line, "
                          f"{s['launch_uses_mismatched']:g} mismatched, {s['launches_given_uses']:g} given theirs: "
                          f"the run is not the recording's program and configuration ({result['command']})")
    return s


def figures(result, what):
    s = checked(result, what)
    launches = result["launches_per_step"]
    out = {"launches_per_step": launches, "bytes_h2d_per_step": round(s["bytes_h2d"]),
           "bytes_d2h_per_step": round(s["bytes_d2h_all"]),
           # of those, moves of a value no one read before it was overwritten or discarded (fakecuda.h)
           "bytes_dead_h2d_per_step": round(s["bytes_dead_h2d"]), "bytes_dead_d2h_per_step": round(s["bytes_dead_d2h"]),
           "gpu_faults_per_step": s["gpu_faults"],
           "fault_stall_us_per_step": round(s["gpu_fault_stall_ns"] / 1000, 1),
           "gpu_faults_unpointed_per_step": s["gpu_faults_unpointed"],
           "driver_evictions_per_step": s["driver_evictions"], "device_resident_peak": s["device_resident_peak"],
           "step_us": round(s["wall_ns"] / 1000, 1),
           "launch_thread_us_per_launch": round((s["cpu_ns"] + s["thread_host_ns"]) / launches / 1000, 3),
           "launch_uses_mismatched_per_step": s["launch_uses_mismatched"],
           "bytes_read_discarded_per_step": s["bytes_read_discarded"]}
    if s["pump"] is not None:
        managed = s["pump"]["launches"]
        out["planned_launch_fraction"] = round(s["pump"]["launches_planned"] / managed, 4) if managed else 0.0
        out["pump_errors"] = s["pump"]["errors"]
        for field in ("prefetch_bytes", "bytes_evicted", "bytes_evicted_dead", "evictions", "bytes_discarded",
                      "torch_tensor_discards", "held_discards", "budget_skips"):
            out[f"pump_{field}_per_step"] = round(s["pump"][field], 1)
        out["pump_budget_bytes"] = s["pump"]["budget_bytes"]  # in force at the end (pump's own moves with readings)
    return out


def median_run(runs):
    """Per figure, the median over rounds, and each round's step time."""
    keys = runs[0].keys()
    out = {k: statistics.median(r[k] for r in runs) for k in keys}
    out["step_us_rounds"] = [r["step_us"] for r in runs]
    return out


# The variants beyond bare, pump, lookahead and the driver alone, which the targets need: each
# run unless left out (scripts/bench-real-client-budget --variants).
OPTIONAL_VARIANTS = ("pump_emulated", "lookahead_held_discards", "pump_allocator", "pump_allocator_held_discards")


def record(python, pump_run, as_written, name, steps, uses, pump_args=()):
    """The workload under pump-run (pump_args), recorded into `uses` (and the files beside it):
    run_client's result, refused where the recording did not name every launch."""
    made = client.run_client(python, pump_run, as_written, steps, client.WARMUP, None, (), list(pump_args),
                             extra_env={"FAKECUDA_LAUNCH_LOG": f"{uses}.log"},
                             client_args=("--workload", name, "--record-uses", str(uses)))
    summary = made["recorded"]
    if summary["unnamed"] or summary["launches_written"] != summary["launches_logged"]:
        raise BudgetError(f"{name}: the recording named {summary['launches_written']} of "
                          f"{summary['launches_logged']} launches: {summary}")
    return made


def half_budget(window) -> int:
    """The budget: half of the 2 MiB blocks a steady step of the window touches."""
    return touched_block_bytes_per_step(window) // 2 // BLOCK * BLOCK


def measure_workload(python, pump_run, as_written, name, steps, rounds, workdir, optional=OPTIONAL_VARIANTS):
    warmup = client.WARMUP

    def run(pump_args, uses, device_memory=None):
        return client.run_client(python, pump_run, as_written, steps, warmup, device_memory, (), pump_args,
                                 extra_env={"FAKECUDA_LAUNCH_USES": str(uses)}, client_args=("--workload", name))

    # PyTorch's caching allocator places the job's tensors bare, under pump's launch rule and
    # under the driver alone; lookahead runs it under pump's allocator (pump/run.py), which
    # makes other allocations: a recording of its own, made at the budget.
    uses = pathlib.Path(workdir) / f"{name}.uses"
    summary = record(python, pump_run, as_written, name, steps, uses)["recorded"]
    window = steady_window(uses, warmup)
    budget = half_budget(window)
    limit = traffic_bound(window, budget)
    ahead_uses = pathlib.Path(workdir) / f"{name}-lookahead.uses"
    full = ["--capacity", "host"]  # a device of the budget's size: the job's footprint beyond it on the host
    lookahead = [*full, "--policy", "lookahead"]
    record(python, pump_run, as_written, name, steps, ahead_uses, lookahead)
    ahead_limit = traffic_bound(steady_window(ahead_uses, warmup), budget)
    device = str(budget)
    variants = {"bare": (None, uses, None), "pump": (full, uses, device), "lookahead": (lookahead, ahead_uses, device),
                "pump_emulated": (["--budget", str(budget)], uses, None),
                "lookahead_held_discards": ([*lookahead, "--config", str(HELD_DISCARDS)], ahead_uses, device),
                "pump_allocator": ([*full, "--config", str(PUMP_ALLOCATOR)], ahead_uses, device),
                "pump_allocator_held_discards": ([*full, "--config", str(PUMP_ALLOCATOR_HELD)], ahead_uses, device)}
    variants = {v: run_as for v, run_as in variants.items() if v not in OPTIONAL_VARIANTS or v in optional}
    made = {v: [] for v in variants}
    commands = {}
    for _ in range(rounds):
        for variant, (args, recording, device_memory) in variants.items():
            result = run(args, recording, device_memory)
            made[variant].append(figures(result, f"{name} {variant}"))
            commands[variant] = result["command"]
    driver = run(["--policy", "off", *full], uses, device)
    commands["driver_at_budget"] = driver["command"]
    driver_figures = figures(driver, f"{name} driver_at_budget")
    medians = {v: median_run(made[v]) for v in variants}
    bare, pump, ahead = medians["bare"], medians["pump"], medians["lookahead"]
    return {
        "about": WORKLOADS[name], "budget_bytes": budget, "launches_per_step": bare["launches_per_step"],
        "recording": summary, **limit, "bound_us": max(limit["traffic_us"], bare["step_us"]),
        "bound_under_pumps_allocator": ahead_limit,
        "bytes_h2d_per_step": pump["bytes_h2d_per_step"], "bytes_d2h_per_step": pump["bytes_d2h_per_step"],
        "step_us": pump["step_us"], "planned_launch_fraction": ahead["planned_launch_fraction"],
        "driver_step_over_pump": round(driver_figures["step_us"] / pump["step_us"], 2),
        "launch_thread_us_over_bare": round(ahead["launch_thread_us_per_launch"] - bare["launch_thread_us_per_launch"], 3),
        "variants": {"bare": bare, "pump": pump, "lookahead": ahead, "driver_at_budget": driver_figures,
                     **{v: medians[v] for v in OPTIONAL_VARIANTS if v in medians}},
        "commands": commands,
    }


def measure(python, pump_run, as_written, steps, rounds, names=tuple(WORKLOADS), optional=OPTIONAL_VARIANTS,
            keep=None):
    """keep: a folder to leave the recordings in (NAME.uses, NAME-lookahead.uses and the files
    beside them), else a temporary one."""
    with tempfile.TemporaryDirectory(prefix="bench-real-client-budget-") as workdir:
        workdir = keep or workdir
        workloads = {name: measure_workload(python, pump_run, as_written, name, steps, rounds, workdir, optional)
                     for name in names}
    return {"python": python, "persona": client.PERSONA, "steps": steps, "warmup": client.WARMUP, "rounds": rounds,
            "link_bytes_per_us": {"h2d": H2D_BYTES_PER_US, "d2h": D2H_BYTES_PER_US}, "workloads": workloads}


def targets(result):
    """(workload, target, value, met) for each of issue 41's targets on the tier."""
    rows = []
    for name, w in result["workloads"].items():
        for way, least in (("h2d", "min_bytes_per_step"), ("d2h", "min_bytes_d2h_per_step")):
            ratio = w[f"bytes_{way}_per_step"] / max(1, w[least])
            rows.append((name, f"bytes {way} per step at most {TARGET_BYTES_OVER_MIN:g}x the bound's {least}",
                         f"{ratio:.2f}x", ratio <= TARGET_BYTES_OVER_MIN))
        ratio = w["step_us"] / max(1.0, w["bound_us"])
        rows.append((name, f"step within {TARGET_STEP_OVER_BOUND:g}x of bound_us", f"{ratio:.2f}x",
                     ratio <= TARGET_STEP_OVER_BOUND))
        rows.append((name, f"at least {TARGET_PLANNED:.0%} of steady launches planned (lookahead)",
                     f"{w['planned_launch_fraction']:.1%}", w["planned_launch_fraction"] >= TARGET_PLANNED))
        rows.append((name, f"launching thread at most {TARGET_LAUNCH_THREAD_US:g} us per launch above bare "
                     "(lookahead)", f"{w['launch_thread_us_over_bare']:g} us",
                     w["launch_thread_us_over_bare"] <= TARGET_LAUNCH_THREAD_US))
    return rows


TABLE_HEADER = ("workload", "variant", "MiB in", "MiB out", "dead in / out", "GPU faults", "unpointed", "step µs",
                "launching thread µs", "peak MiB", "planned")


def table_rows(w):
    """One workload's rows of the table (TABLE_HEADER's columns after the workload's): the bound's,
    then each variant's."""
    rows = [[f"bound at {w['budget_bytes'] / MIB:.0f} MiB", f"{w['min_bytes_per_step'] / MIB:.1f}",
             f"{w['min_bytes_d2h_per_step'] / MIB:.1f}", "", "", "", f"{w['bound_us']:g} (traffic {w['traffic_us']:g})",
             "", "", ""]]
    for variant, v in w["variants"].items():
        planned = f"{v['planned_launch_fraction']:.1%}" if variant not in ("bare", "driver_at_budget") else ""
        rows.append([variant, f"{v['bytes_h2d_per_step'] / MIB:.1f}", f"{v['bytes_d2h_per_step'] / MIB:.1f}",
                     f"{v['bytes_dead_h2d_per_step'] / MIB:.1f} / {v['bytes_dead_d2h_per_step'] / MIB:.1f}",
                     f"{v['gpu_faults_per_step']:g}", f"{v['gpu_faults_unpointed_per_step']:g}", f"{v['step_us']:g}",
                     f"{v['launch_thread_us_per_launch']:g}", f"{v['device_resident_peak'] / MIB:.0f}", planned])
    return rows


def print_table(result):
    print(f"real client at a 50% budget on fakecuda ({result['persona']}), steps {result['warmup'] + 1}.."
          f"{result['steps']}, medians of {result['rounds']} rounds; MiB per step, us per step")
    print(" | ".join(TABLE_HEADER))
    for name, w in result["workloads"].items():
        for row in table_rows(w):
            print(" | ".join([name, *row]))
        print(f"{name}: the driver's step over pump's: {w['driver_step_over_pump']:g}x")
    for name, target, value, met in result["target_rows"]:
        print(f"target {'met   ' if met else 'MISSED'} {name}: {target}: {value}")
