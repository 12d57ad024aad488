"""steady_real_client.py: scripts/bench-steady's real-client row (issue 26 item 4).

PyTorch's CUDA build, unmodified (its interpreter named by --real-client or
PUMP_REAL_CLIENT_PYTHON, as tests/test_real_client*.py take it), trains the GPT-style model of
tests/real_client/train.py on fakecuda as an H100 SXM 80GB (FAKECUDA_PERSONA), in
bench/real_client_step.py. The runs and their comparison are bench-steady's own (its scenario():
bare, under pump-run, and under pump-run with the ioctls on a driver thread); only the program
differs: the client's readings become the per-step figures steady_step prints. Scenarios:
  fitting   the job on the persona's 80 GB
  budget50  pump-run --budget of half of what fitting made resident; its fair baseline, as
            bench-steady's, is the driver alone with only the budget's memory: pump-run
            --policy off (managed_all's managed memory, no prefetch, no budget) on a device of
            the budget's size (FAKECUDA_DEVICE_MEMORY)
The launching threads are PyTorch's two: the Python thread and the autograd engine's thread
for the device; their CPU and the driver host time fakecuda charged to each are summed. A bare
run whose driver time is not all on those two threads is refused (a launch from a thread the
client does not read would leave the figures short). Kernels are no-ops on fakecuda: no value
is computed or compared, so discarded pages are not filled with poison (FAKECUDA_DISCARD_FILL=none:
that fill is host time on fakecuda's stream worker, which a GPU's discard does not take); a read of
one still counts (bytes_read_discarded)."""
import json
import os
import pathlib
import re
import subprocess
import tempfile

import commands

ROOT = pathlib.Path(__file__).resolve().parent.parent
CLIENT = ROOT / "bench" / "real_client_step.py"
FAKECUDA_H = ROOT / "fakecuda" / "fakecuda.h"
DRIVER_DIR = ROOT / "build" / "tests" / "plain"
PERSONA = "h100-sxm-80gb"
LOCK_HELD_LINE = "pump's rule: no lock held across a driver call"
# The autograd thread is read in each step's backward, the Python thread at each step's start:
# the steady window starts at step WARMUP, read on the autograd thread in step WARMUP - 1's,
# which must itself be past the first step's loading (so WARMUP >= 2), and past the steps in
# which PyTorch's allocator still carves memory no tensor had before: under pump the first use of
# such memory is prefetched, a first touch, not a steady cost (this client's last one is in step
# 3: with pump's shim printing each prefetched range and each tensor, 16 steps prefetched
# nothing after it).
WARMUP = 3
STEADY_STEPS = 40  # per run, by default: PyTorch's host time per step varies far more than steady_step's
MIB = 1 << 20


def python_of(named):
    """The interpreter to use (the flag's, else PUMP_REAL_CLIENT_PYTHON) and None, or None and why not."""
    python = named or os.environ.get("PUMP_REAL_CLIENT_PYTHON")
    if not python:
        return None, "no torch CUDA build named (--real-client PYTHON or PUMP_REAL_CLIENT_PYTHON)"
    try:
        probe = subprocess.run([python, "-c", "import torch; print(torch.version.cuda or '')"],
                               capture_output=True, text=True, timeout=300)
    except OSError as exc:
        return None, f"{python}: {exc}"
    if probe.returncode != 0:
        return None, f"{python} cannot import torch: {probe.stderr.strip().splitlines()[-1:]}"
    if not probe.stdout.strip():
        return None, f"{python}'s torch is not a CUDA build"
    return python, None


def stats_layout():
    """struct fakecuda_stats's field names, from fakecuda.h (every field a uint64_t, in order)."""
    body = re.search(r"struct fakecuda_stats \{(.*?)\n\};", FAKECUDA_H.read_text(), re.S).group(1)
    body = re.sub(r"/\*.*?\*/", "", body, flags=re.S)
    names = []
    for declaration in filter(None, (d.strip() for d in body.split(";"))):
        kind, _, rest = declaration.partition(" ")
        if kind != "uint64_t":
            raise ValueError(f"fakecuda.h: struct fakecuda_stats holds a {kind}: this reader takes uint64_t only")
        names += [n.strip() for n in rest.split(",")]
    return names


def decode_driver(raw_hex, names):
    raw = bytes.fromhex(raw_hex)
    return {name: int.from_bytes(raw[8 * i:8 * i + 8], "little") for i, name in enumerate(names)}


def decode_pump(raw_hex):
    from pump import stats  # this Python's pump, which reads the record's layout from its header
    return stats.parse_record(bytes.fromhex(raw_hex)) if raw_hex else None


PUMP_FIELDS = ("launches", "launches_managed", "launches_prefetched", "prefetch_calls", "prefetch_ranges",
               "prefetch_bytes", "resident_skips", "budget_skips", "bytes_evicted", "evictions", "scan_words",
               "scan_hits", "events_written", "bytes_discarded", "torch_tensor_discards", "held_discards",
               "launches_planned", "bytes_evicted_dead")


def window(a, b, a_threads, b_threads, steps):
    """steady_step's per-step figures from reading a to reading b (whole-process), with the
    launching threads' readings a_threads to b_threads (each a list of (cpu_ns, host_ns))."""
    names = stats_layout()
    da, db = decode_driver(a["fakecuda"], names), decode_driver(b["fakecuda"], names)
    out = {name: (db[name] - da[name]) / steps for name in names}
    out["device_resident_bytes"] = db["device_resident_bytes"]
    out["device_resident_peak"] = db["device_resident_peak"]  # since load: the most any device held
    out["cpu_ns"] = sum(y["cpu_ns"] - x["cpu_ns"] for x, y in zip(a_threads, b_threads)) / steps
    out["thread_host_ns"] = sum(y["host_ns"] - x["host_ns"] for x, y in zip(a_threads, b_threads)) / steps
    out["wall_ns"] = (b["wall_ns"] - a["wall_ns"]) / steps
    out["entries"] = {name: dict(zip(("calls", "caller_ns", "worker_ns"), ((y - x) / steps for x, y in zip(ea, eb))))
                      for name, ea in a["entries"].items() if (eb := b["entries"][name]) != ea}
    pa, pb = decode_pump(a["pump"]), decode_pump(b["pump"])
    out["pump"] = None if pa is None or pb is None else {
        **{f: (pb[f] - pa[f]) / steps for f in PUMP_FIELDS}, "resident_bytes": pb["resident_bytes"],
        "budget_bytes": pb["budget_bytes"], "errors": pb["errors"]}
    return out


def parse(client):
    """The client's readings as steady_step's JSON object: "first" (step 0; its autograd part only
    up to that thread's first reading) and "steady" (steps WARMUP..STEPS-1)."""
    starts, end, autograd, steps = client["starts"], client["end"], client["autograd"], client["steps"]
    if len(starts) != steps or len(autograd) != steps or len({r["tid"] for r in autograd}) != 1:
        raise ValueError(f"the client read {len(starts)} steps on the Python thread and {len(autograd)} on "
                         f"{len({r['tid'] for r in autograd})} autograd threads, for {steps} steps")
    born = {"cpu_ns": 0, "host_ns": 0}
    first = window(starts[0], starts[1], [starts[0], born], [starts[1], autograd[0]], 1)
    steady = window(starts[WARMUP], end, [starts[WARMUP], autograd[WARMUP - 1]], [end, autograd[-1]],
                    steps - WARMUP)
    # loss_bits: none to compare (fakecuda computes no value of a real kernel)
    return {"first": first, "steady": steady, "launches_per_step": steady["launches"], "loss_bits": [],
            "torch": client["torch"]}


def run_client(python, pump_run, as_written, steps, warmup, device_memory, program_args=(), pump_args=None,
               ioctl_thread="caller", extra_env=None, client_args=()):
    """bench-steady's run() for the real client: one run, bare (pump_args None) or under pump-run;
    extra_env (FAKECUDA_LAUNCH_USES, ...) and client_args (--record-uses PATH) as
    bench/real_client_budget.py gives them. The result's "recorded": the recorder's summary."""
    if warmup != WARMUP or program_args:
        raise ValueError(f"the real client takes warmup {WARMUP} and no program arguments")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PUMP_", "FAKECUDA_"))}
    env.pop("LD_PRELOAD", None)
    env.update(LD_LIBRARY_PATH=str(DRIVER_DIR), FAKECUDA_PERSONA=PERSONA, FAKECUDA_IOCTL_THREAD=ioctl_thread,
               FAKECUDA_DISCARD_FILL="none")
    if device_memory is not None:
        env["FAKECUDA_DEVICE_MEMORY"] = device_memory
    env.update(extra_env or {})
    command = [python, str(CLIENT), str(steps), str(warmup), *client_args]
    if pump_args is not None:
        command = pump_run + ["--daemon", "embedded", "--quiet", *pump_args, "--", *command]
    with tempfile.TemporaryDirectory(prefix="bench-steady-real-") as cwd:
        proc = subprocess.run(command, env=env, capture_output=True, text=True, cwd=cwd, timeout=900)
    shown = " ".join(as_written(word) for word in command)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"{shown} exited {proc.returncode}: {proc.stderr.strip()[-2000:]}")
    if LOCK_HELD_LINE in proc.stderr:  # fakecuda's check of pump's rule (fakecuda/stats.c)
        said = [line for line in proc.stderr.splitlines() if LOCK_HELD_LINE in line]
        raise RuntimeError(f"{shown}: pump made driver calls under a lock of its own: {said}")
    client = json.loads(lines[-1])
    result = parse(client)
    result["command"] = shown
    result["recorded"] = client.get("recorded")
    if pump_args is not None and (result["steady"]["pump"] is None or result["first"]["pump"] is None):
        raise RuntimeError("libpump's counters could not be read (is the installed pump this tree's?)")
    if pump_args is None:
        charged = sum(e["caller_ns"] for e in result["steady"]["entries"].values())
        if abs(charged - result["steady"]["thread_host_ns"]) > 1:
            raise RuntimeError(f"{shown}: driver time {charged:g} ns per step was charged to callers, "
                               f"{result['steady']['thread_host_ns']:g} ns to the two threads read: PyTorch "
                               "called the driver from another thread")
    return result


class ClientError(Exception):
    pass


def measure(bench, python, steps, rounds):
    """fitting and budget50 through bench-steady's scenario() (bench: that script's namespace)."""
    made = []  # every run's variant and result, so that each round's figure can be shown

    def runner(steps, warmup, device_memory, program_args=(), pump_args=None, ioctl_thread="caller"):
        try:
            result = run_client(python, commands.pump_run_command(), commands.as_written, steps, warmup, device_memory,
                                program_args, pump_args, ioctl_thread)
        except (RuntimeError, ValueError) as exc:
            raise ClientError(f"real client: {exc}") from exc
        variant = "bare" if pump_args is None else "pump_ioctls_on_worker" if ioctl_thread == "worker" else "pump"
        made.append((variant, result))
        return result

    def rounds_of(row):
        """Each round's launch-thread host time per launch: how far this machine's noise goes."""
        row["launch_thread_us_per_launch_rounds"] = {
            variant: [round((r["steady"]["cpu_ns"] + r["steady"]["thread_host_ns"]) / r["launches_per_step"] / 1000, 3)
                      for v, r in made if v == variant] for variant in ("bare", "pump", "pump_ioctls_on_worker")}
        made.clear()
    rows, raw = {}, {}
    rows["fitting"], raw["fitting"] = bench.scenario("real_client fitting", rounds, steps, WARMUP, None, (), [],
                                                     runner=runner)
    rounds_of(rows["fitting"])
    resident = raw["fitting"]["pump"]["steady"]["device_resident_bytes"]
    budget = resident // 2 // bench.BLOCK * bench.BLOCK
    if budget == 0:
        raise ClientError(f"real client: fitting made {resident} bytes resident under pump: no budget to take half of")
    rows["budget50"], raw["budget50"] = bench.scenario("real_client budget50", rounds, steps, WARMUP, None, (),
                                                       ["--budget", str(budget)], runner=runner)
    rounds_of(rows["budget50"])
    rows["budget50"]["budget_bytes"] = budget
    capped = runner(steps, WARMUP, str(budget), (), ["--policy", "off", "--capacity", "host"])
    raw["budget50"]["driver_at_budget"] = capped
    rows["budget50"].update(bench.driver_at_budget(capped["steady"]))
    for name, row in rows.items():
        steady = raw[name]["pump"]["steady"]["pump"]
        row["scan_words_per_launch"] = round(steady["scan_words"] / steady["launches"], 1)
    return {"python": python, "torch": raw["fitting"]["bare"]["torch"], "persona": PERSONA, "steps": steps,
            "warmup": WARMUP, "rounds": rounds, "launches_per_step": raw["fitting"]["pump"]["launches_per_step"],
            "scenarios": rows, "not_judged": NOT_JUDGED,
            "runs": {name: {k: {"command": v["command"], "first": v["first"], "steady": v["steady"]}
                            for k, v in runs.items()} for name, runs in raw.items()}}


# fakecuda runs a real kernel (one without a C body) as a no-op that touches no memory: the driver
# alone never faults, so it moves nothing, and bytes over the link against it judge nothing.
# And pump asks for PyTorch's tensors (ranges inside blocks) where the imitation asks for whole
# blocks: bytes asked less bytes moved counts no resident block (the driver moves whole pages).
NOT_JUDGED = ("budget50's bytes each way against the driver alone: fakecuda's real kernels touch no memory, so "
              "the driver alone moves nothing (the accesses of a real kernel are not modelled); and resident "
              "blocks prefetched again: pump asks for tensors, not blocks, so bytes asked less bytes moved "
              "counts none (the calls added in fitting show them)")


def targets(bench, result):
    """The imitation's targets (bench-steady's constants), for this row's scenarios."""
    f, b = result["scenarios"]["fitting"], result["scenarios"]["budget50"]
    rows = [
        ("real_client fitting", "no driver call added per steady step", f"{f['added_driver_calls_per_step']:g} calls",
         f["added_driver_calls_per_step"] == 0),
        ("real_client fitting", "0 modelled driver us added per steady step", f"{f['added_driver_us_per_step']:g} us",
         f["added_driver_us_per_step"] == 0),
        ("real_client fitting", f"CPU added per launch <= {bench.OWN_CPU_TARGET_NS:g} ns",
         f"{f['added_cpu_ns_per_launch']:g} ns", f["added_cpu_ns_per_launch"] <= bench.OWN_CPU_TARGET_NS),
    ]
    for key, knob in (("", "ioctls on the caller"), ("_ioctls_on_worker", "ioctls on the driver's thread")):
        added = b[f"launch_thread_us_per_launch{key}"] - b["launch_thread_us_per_launch_without_pump"]
        rows.append(("real_client budget50", f"launch threads' host time per launch at most "
                     f"{bench.LAUNCH_THREAD_ADDED_TARGET_US:g} us above the bare launch's ({knob})",
                     f"{b[f'launch_thread_us_per_launch{key}']:g} vs {b['launch_thread_us_per_launch_without_pump']:g} us",
                     added <= bench.LAUNCH_THREAD_ADDED_TARGET_US))
    rows.append(("real_client budget50", "zero driver evictions", f"{b['driver_evictions']:g}",
                 b["driver_evictions"] == 0))
    return rows  # not the traffic targets nor resident blocks prefetched: see NOT_JUDGED


def print_section(result):
    """The row's own table section, after bench-steady's."""
    s = result["scenarios"]
    print(f"real client: {result['torch']} on fakecuda ({result['persona']}), tests/real_client/train.py's GPT "
          f"(bench/real_client_step.py), {result['launches_per_step']:g} launches per step, steps "
          f"{result['warmup'] + 1}..{result['steps']}")
    for name, row in s.items():
        added = ", ".join(f"{k} {v['calls']:g} ({v['us']:g} us)" for k, v in row["added_driver_by_entry"].items())
        print(f"real client {name}: added driver calls {row['added_driver_calls_per_step']:g} per step "
              f"({added or 'none'}), added CPU {row['added_cpu_ns_per_launch']:g} ns per launch "
              f"({row['added_cpu_ns_per_launch_ioctls_on_caller']:g} with the ioctls on the caller); "
              f"launch threads' host time per launch {row['launch_thread_us_per_launch']:g} us, "
              f"{row['launch_thread_us_per_launch_ioctls_on_worker']:g} with the ioctls on a driver thread, "
              f"{row['launch_thread_us_per_launch_without_pump']:g} bare; wall per launch {row['wall_us_per_launch']:g}, "
              f"{row['wall_us_per_launch_ioctls_on_worker']:g}, {row['wall_us_per_launch_without_pump']:g} bare; "
              f"{row['prefetch_calls_per_step']:g} prefetch calls, {row['gpu_faults_per_step']:g} GPU faults "
              f"({row['gpu_faults_per_step_without_pump']:g} bare), {row['scan_words_per_launch']:g} words scanned "
              f"per launch")
        spread = "; ".join(f"{v} {', '.join(f'{us:g}' for us in runs)}"
                           for v, runs in row["launch_thread_us_per_launch_rounds"].items())
        print(f"real client {name}, launch threads' host time per launch in each round (us): {spread}")
    b = s["budget50"]
    print(f"real client budget50: budget {b['budget_bytes'] / MIB:.0f} MiB; MiB in, out per step "
          f"{b['bytes_h2d_per_step'] / MIB:.1f}, {b['bytes_d2h_per_step'] / MIB:.1f} against the "
          f"driver alone with the budget's memory {b['bytes_h2d_per_step_driver_at_budget'] / MIB:.1f}, "
          f"{b['bytes_d2h_per_step_driver_at_budget'] / MIB:.1f} ({b['gpu_faults_per_step_driver_at_budget']:g} "
          f"faults, {b['driver_evictions_driver_at_budget']:g} driver evictions)")
    print(f"not judged: {NOT_JUDGED}")
    for name, target, value, met in result["target_rows"]:
        print(f"target {'met   ' if met else 'MISSED'} {name}: {target}: {value}")

