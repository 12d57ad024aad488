#!/usr/bin/env python3
"""pump's GPU benchmark suite (issue 5): every workload under every variant, compared within
one run on one GPU.  bench/README.md explains the cases, the variants and every column.

    python bench/gpu/suite.py [--cases abcde] [--scale X] [--budget-seconds S] [--json FILE]
                              [--train-script PATH] [--work DIR]

Cases: a, the cuda-python kernel chain (host writes its inputs every step); b, the same chain
under an emulated capacity of half its working set; c, examples/train_gpt.py under an emulated
capacity of half its peak footprint; d, the same job, which fits, under plain `pump-run`; e, the
same job under `pump-run --no-managed-all`; f (only when asked for: --cases f), the same job
under real oversubscription, a filler of device memory leaving its managed memory half its peak
(filler.py; a probe at a milder ratio first).  Variants: ideal (plain device memory, no pump; in
f, without the filler), naive (managed memory without pump; under an emulated capacity pump's
evict-only mode, `--policy off --budget B`; in f the driver's own Unified Memory), launch and
lookahead (pump's policies), and for d and e the pump run itself.

Order: the link's prefetch bandwidth and whether it copies discarded memory (discard.py), every
case's timed runs, then the untimed runs: CUPTI's
Unified Memory counters per variant and one `pump-run --trace` per case for the bytes that must
move.  Before every run that asks for managed memory the card's free memory is read (NVML) and
a request that would not fit with membudget's margin (in f, filler.py's rules) is REFUSED,
loudly, and not run.  Sizes
scale with --scale (1 = the defaults below).  Runs stop when --budget-seconds is spent: what was
not run is marked skipped.  Prints progress and the table; --json writes every figure.  Exit
status 1 when a variant failed or its results were not bit-identical to the reference run's
(refused cases, those skipped for time and case f's runs stopped at their cap are reported,
not failed), else 0.
"""

import argparse
import dataclasses
import datetime
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))

import cupti  # noqa: E402
import filler  # noqa: E402
from pump import trace as pump_trace  # noqa: E402
import lowerbound  # noqa: E402
from machine import device_info, versions  # noqa: E402
import membudget  # noqa: E402
import table  # noqa: E402

MiB, GiB = membudget.MiB, membudget.GiB
BLOCK = 2 * MiB                    # pump's budget unit
CASES = "abcde"                   # the default
OPT_IN = "f"                      # only when --cases names it: case f does not fit one device call beside a-e
CHAIN_PAIRS, CHAIN_MIB, CHAIN_REPEAT = 4, 128, 4            # working set 1 GiB at --scale 1
GPT = {"preset": "gpt2", "batch": 8, "seq": 512}            # --batch scales
BANDWIDTH_MIB = 1024
TIMED = {"chain": (2, 10), "gpt": (2, 8)}                   # (warm-up, timed) steps
UNTIMED_STEPS = 5                 # counter and trace runs: enough repeats for pump to learn the iteration
TORCH_SLACK = 1.5                 # PyTorch's cache, fragmentation and workspaces beyond its peak allocated
RUN_CAP_S = 240                   # no single run may take longer
# Case f's cap on each run, and its probe's.  The driver alone may be far slower than case c's
# emulated naive (2.9 s a step on the first H100): at 30 s a step its 10 steps would not end, so
# it is stopped at the cap and reported as timed out, a lower bound on its time, and the case's
# other runs still fit one device call (bench/README.md, case f).
FILLER_RUN_CAP_S = 100
PROBE_CAP_S = 60
MIN_RUN_S = 15                    # a run is not started with less time than this left
UNTIMED_SHARE = 0.3               # of --budget-seconds, kept back from the timed runs for the untimed ones


class OutOfTime(Exception):
    pass


class ProbeTimedOut(Exception):
    """Case f's probe did not finish in PROBE_CAP_S: none of its runs is made."""


@dataclasses.dataclass
class Variant:
    name: str
    pump: list = None             # pump-run options; None: the program runs without pump
    memory: str = "managed"       # chain only: managed or device


@dataclasses.dataclass
class Case:
    key: str
    title: str
    workload: str                 # chain or gpt
    emulated: bool
    variants: list
    capacity: int = 0             # the emulated capacity (the budget), or what the GPU allows
    program: list = None          # the program's argv, less the step counts
    traced: str = None            # the variant whose untimed run is traced for the lower bound
    result: dict = None
    # Case f: the working set the filler is sized for before each managed run (filler.py); a run
    # there that reaches its cap (FILLER_RUN_CAP_S) is a result, a lower bound on its time.
    filler_working_set: int = 0


# ---------------------------------------------------------------- sizes, variants, commands
def chain_sizes(scale: float) -> dict:
    mib = max(1, round(CHAIN_MIB * scale))
    return {"pairs": CHAIN_PAIRS, "mib": mib, "repeat": CHAIN_REPEAT, "working_set": 2 * CHAIN_PAIRS * mib * MiB}


def gpt_args(scale: float, script) -> list:
    batch = max(1, round(GPT["batch"] * scale))
    return [sys.executable, str(script), "--preset", GPT["preset"], "--batch", str(batch), "--seq", str(GPT["seq"]),
            "--device", "cuda", "--json"]


def budget_of(nbytes: int) -> int:
    """An emulated capacity of nbytes, in whole 2 MiB blocks (at least one)."""
    return max(BLOCK, nbytes // BLOCK * BLOCK)


def emulated_variants(budget: int, allowed: int) -> list:
    cap = ["--capacity", str(allowed), "--budget", str(budget)]
    return [Variant("ideal", None, "device"), Variant("naive", ["--policy", "off", *cap]),
            Variant("launch", ["--policy", "launch", *cap]), Variant("lookahead", ["--policy", "lookahead", *cap])]


def fitting_variants(allowed: int) -> list:
    cap = ["--capacity", str(allowed)]
    return [Variant("ideal", None, "device"), Variant("naive", None), Variant("launch", ["--policy", "launch", *cap]),
            Variant("lookahead", ["--policy", "lookahead", *cap])]


def plan_chain(case_key: str, scale: float, free: int, total: int) -> Case:
    """Case a or b, sized by --scale; raises membudget.Refused when the card cannot hold it."""
    s = chain_sizes(scale)
    membudget.check(f"case {case_key} (kernel chain, {s['working_set'] / GiB:.2f} GiB)", s["working_set"], free, total)
    allowed = membudget.allowed(free, total)
    program = [sys.executable, str(HERE / "chain.py"), "--pairs", str(s["pairs"]), "--mib", str(s["mib"]),
               "--repeat", str(s["repeat"])]
    if case_key == "a":
        return Case("a", "kernel chain, host writes its inputs every step; fits", "chain", False,
                    fitting_variants(allowed), allowed, program, "launch")
    budget = budget_of(s["working_set"] // 2)
    return Case("b", f"kernel chain under an emulated capacity of {budget / GiB:.2f} GiB (half its working set)",
                "chain", True, emulated_variants(budget, allowed), budget, program, "launch")


def plan_gpt(case_key: str, program: list, peak_bytes: int, free: int, total: int) -> Case:
    """Case c, d or e of train_gpt.py, whose ideal run peaked at peak_bytes; raises Refused."""
    request = int(peak_bytes * TORCH_SLACK)
    membudget.check(f"case {case_key} (train_gpt.py, peak {peak_bytes / GiB:.2f} GiB x {TORCH_SLACK})",
                    request, free, total)
    allowed = membudget.allowed(free, total)
    if case_key == "c":
        budget = budget_of(peak_bytes // 2)
        variants = emulated_variants(budget, allowed)
        # Last, so that it is what a short time budget leaves out: lookahead on PyTorch's caching
        # allocator, which moves a step's tensors, its tensors named by their places in the step
        # (docs/limits.md), beside lookahead, which takes pump's allocator with its placement
        # (shim/policy/placement.c): what names and placement each give on the GPU.
        # Before it, the launch rule without room made ahead (shim/policy/residency_ahead.c): what pump's
        # worker making the evictions ahead gives on the GPU. First of them, the launch rule keeping
        # the caching allocator's dead tensors (launch discards them under the budget by default:
        # shim/hooks/torch_trace.c), what discarding gives, and beside it launch's decisions with the
        # dead blocks poisoned instead, which says whose fault a changed loss is (torch_discards_poison.toml).
        # Last of all, lookahead discarding the dead tensors of the blocks placement keeps (off by
        # default: shim/policy/held_discards.c): whether its loss stays bit-identical, and what it gives.
        launch = next(v for v in variants if v.name == "launch")
        lookahead = next(v for v in variants if v.name == "lookahead")
        variants.append(Variant("launch-no-discards", [*launch.pump, "--config", str(HERE / "no_discards.toml")]))
        variants.append(Variant("launch-poison", [*launch.pump, "--config", str(HERE / "torch_discards_poison.toml")]))
        variants.append(Variant("launch-no-ahead", [*launch.pump, "--config", str(HERE / "no_evict_ahead.toml")]))
        variants.append(Variant("lookahead-names", [*lookahead.pump, "--config", str(HERE / "torch_names.toml")]))
        variants.append(Variant("lookahead-held-discards",
                                [*lookahead.pump, "--config", str(HERE / "held_discards.toml")]))
        return Case("c", f"train_gpt.py under an emulated capacity of {budget / GiB:.2f} GiB (half its peak)",
                    "gpt", True, variants, budget, program, "launch")
    if case_key == "d":
        return Case("d", "train_gpt.py, fits: plain `pump-run` (managed_all on) against no pump", "gpt", False,
                    [Variant("ideal", None, "device"), Variant("pump", [])], allowed, program)
    return Case("e", "train_gpt.py under `pump-run --no-managed-all` (pump's own overhead)", "gpt", False,
                [Variant("ideal", None, "device"), Variant("pump-no-managed-all", ["--no-managed-all"])], allowed, program)


def plan_filler(program: list, peak_bytes: int, free: int, ram: int) -> Case:
    """Case f, train_gpt.py under a filler that leaves its managed memory half its peak_bytes (the
    ideal run's) beside filler.HEADROOM_BYTES; raises membudget.Refused.  Its capacity, for the
    bound, is all the filler leaves: the context takes some, so the bytes that must move there are
    a lower bound still.  pump's --capacity is the managed memory the sizing checked against the
    host's RAM (peak x TORCH_SLACK), above what the filler leaves free: managed memory goes
    beyond the card, and launch holds pump's own budget under the card's free memory."""
    request = int(peak_bytes * TORCH_SLACK)
    sized = filler.size("case f (train_gpt.py under a filler)", peak_bytes, request, filler.RATIO, free, ram)
    cap = ["--capacity", str(request)]
    variants = [Variant("ideal", None, "device"), Variant("naive", ["--policy", "off", *cap]),
                Variant("launch", ["--policy", "launch", *cap]), Variant("lookahead", ["--policy", "lookahead", *cap])]
    low, high = sized["ratio_range"]
    title = (f"train_gpt.py under real oversubscription: a filler of {sized['filler_bytes'] / GiB:.2f} GiB of device "
             f"memory leaves {sized['left_bytes'] / GiB:.2f} GiB of the {free / GiB:.2f} GiB free; its working set of "
             f"{peak_bytes / GiB:.2f} GiB is {low:.2f}x to {high:.2f}x what managed memory has, as the context takes "
             f"none to all of {filler.HEADROOM_BYTES / GiB:.0f} GiB of headroom (ideal runs without the filler)")
    return Case("f", title, "gpt", False, variants, sized["left_bytes"], program, "launch",
                filler_working_set=peak_bytes)


def ended(run: dict) -> str:
    """How a run ended, for a message: its exit status, or the cap it reached."""
    return f"timed out after {run['seconds']:.0f} s" if run["rc"] is None else f"exit status {run['rc']}"


def pump_run() -> str:
    beside = pathlib.Path(sys.executable).parent / "pump-run"
    found = str(beside) if beside.exists() else shutil.which("pump-run")
    if not found:
        raise SystemExit("suite: pump-run is not installed (pip install --no-build-isolation --no-deps .)")
    return found


def command(case: Case, variant: Variant, warmup: int, steps: int, stats=None, trace=None, filler_bytes=0) -> list:
    argv = list(case.program) + ["--warmup", str(warmup), "--steps", str(steps)]
    if filler_bytes:
        argv += ["--filler-bytes", str(filler_bytes)]
    if case.workload == "chain":
        argv += ["--memory", variant.memory]
    if variant.pump is None:
        return argv
    extra = (["--stats", str(stats)] if stats else []) + (["--trace", str(trace)] if trace else [])
    return [pump_run(), *variant.pump, *extra, "--", *argv]


# ---------------------------------------------------------------- outputs
def parse_output(stdout: str):
    """(step records, final record, every JSON object) of a program printing JSON lines."""
    steps, final, docs = [], None, []
    for line in stdout.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        docs.append(doc)
        if "step" in doc:
            steps.append(doc)
        elif "checksum_hex" in doc:
            final = doc
    return steps, final, docs


def timed_ms(steps: list, warmup: int, count: int, field: str = "ms") -> list:
    """The timed steps' `field`: records marked warm-up are dropped, else the first `warmup` when
    the program printed more than `count` steps; at most the last `count`."""
    if any("warmup" in s for s in steps):
        kept = [s for s in steps if not s.get("warmup")]
    else:
        kept = steps[warmup:] if len(steps) > count else steps
    return [float(s[field]) for s in kept[-count:]]


def compare(reference: dict, run: dict):
    """(identical, what differs) between two runs' outputs: the final checksum and every step's
    loss bits where the program prints them; (None, why) when there is nothing to compare."""
    ref_final, final = reference.get("final") or {}, run.get("final") or {}
    if not final.get("checksum_hex") or not ref_final.get("checksum_hex"):
        return None, "no checksum to compare"
    ref_loss = [s.get("loss_hex") for s in reference.get("steps", [])]
    loss = [s.get("loss_hex") for s in run.get("steps", [])]
    if len(ref_loss) != len(loss):
        return False, f"{len(loss)} steps where the reference has {len(ref_loss)}"
    for i, (a, b) in enumerate(zip(ref_loss, loss)):
        if a != b:
            return False, f"step {i}: loss {b} where the reference has {a}"
    if final["checksum_hex"] != ref_final["checksum_hex"]:
        return False, f"checksum {final['checksum_hex'][:16]}... where the reference has {ref_final['checksum_hex'][:16]}..."
    return True, None


PUMP_FIELDS = ("launches", "launches_managed", "launches_prefetched", "graph_launches", "prefetch_calls",
               "prefetch_bytes", "bytes_evicted", "evictions", "managed_bytes_peak", "capacity_bytes",
               "budget_bytes", "resident_bytes_peak", "plan_triggers", "launches_planned", "events_dropped",
               "errors", "passthrough_processes", "placement_steps", "placement_wanted", "placement_hits",
               "placement_reuses", "placement_releases", "ahead_decisions", "ahead_bytes", "worker_jobs",
               "worker_takeovers", "worker_waits", "prefetch_refusals", "budget_margin_bytes",
               "budget_appeared_bytes")


def outside_emulation(pump: dict):
    """Why an emulated run's time is not a result, or None: memory the driver refused to prefetch
    is never moved by pump, so its pages reach the GPU by faults and stay there, outside the
    emulated capacity, which then holds only pump's share (the H200's lookahead in case c:
    bench/results/gpu-20261126-nvidia-h200, 93 ms a step beside ideal's 92)."""
    refused = (pump or {}).get("prefetch_refusals") or 0
    return (f"not a result: {refused} allocation(s) the driver would not prefetch stayed on the GPU outside the "
            f"emulated capacity" if refused else None)


def pump_totals(stats_file) -> dict:
    """The counters of `pump-run --stats` the suite reports (all of them stay in the file)."""
    try:
        totals = json.loads(pathlib.Path(stats_file).read_text())["totals"]
    except (OSError, ValueError, KeyError) as exc:
        return {"error": f"no pump stats: {exc}"}
    return {k: totals[k] for k in PUMP_FIELDS if k in totals}


# ---------------------------------------------------------------- running
class Suite:
    def __init__(self, args):
        self.args = args
        self.deadline = time.monotonic() + args.budget_seconds
        self.work = pathlib.Path(args.work or tempfile.mkdtemp(prefix="pump-gpu-suite-"))
        self.work.mkdir(parents=True, exist_ok=True)
        self.cache = {}

    def left(self) -> float:
        return self.deadline - time.monotonic()

    @staticmethod
    def say(text: str) -> None:
        print(text, flush=True)

    def run(self, argv, env_extra=None, reserve: float = 0.0, cap: float = RUN_CAP_S) -> dict:
        """One program run of at most `cap` seconds (a successful one is cached by its command line
        and environment): rc (None: timed out), step records, final record, every JSON object,
        seconds, stderr's tail."""
        key = (tuple(argv), tuple(sorted((env_extra or {}).items())))
        if key in self.cache:
            return self.cache[key]
        timeout = min(cap, self.left() - reserve)
        if timeout < MIN_RUN_S:
            raise OutOfTime(f"not run: {max(0.0, self.left()):.0f} s left of the suite's budget")
        shown = " ".join(f"{k}={v}" for k, v in (env_extra or {}).items())
        self.say(f"$ {shown + ' ' if shown else ''}{' '.join(argv)}")
        t0 = time.monotonic()
        try:
            proc = subprocess.run(argv, env=dict(os.environ, PYTHONUNBUFFERED="1", **(env_extra or {})),
                                  capture_output=True, text=True, timeout=timeout, cwd=REPO)
            rc, out, err = proc.returncode, proc.stdout, proc.stderr
        except subprocess.TimeoutExpired as exc:
            text = [s.decode(errors="replace") if isinstance(s, bytes) else (s or "") for s in (exc.stdout, exc.stderr)]
            rc, out, err = None, text[0], text[1] + f"\n(killed: over its {timeout:.0f} s)"
        seconds = time.monotonic() - t0
        steps, final, docs = parse_output(out)
        tail = "\n".join(err.strip().splitlines()[-12:])
        self.say(f"  rc {rc}, {seconds:.1f} s, {len(steps)} steps" + (f"\n  stderr: {tail}" if tail else ""))
        result = {"rc": rc, "steps": steps, "final": final, "docs": docs, "seconds": seconds, "stderr_tail": tail}
        if rc == 0:
            self.cache[key] = result
        return result

    def guard(self, case: Case, what: str, request: int, ratio: float = filler.RATIO):
        """Refuse (membudget.Refused) unless the card has room for a managed run asking `request`
        right now; under a filler (case f) the filler for `ratio` sized from the free memory now
        (filler.size), else None."""
        free, total = membudget.nvml_memory(0)
        if not case.filler_working_set:
            return membudget.check(what, request, free, total)
        return filler.size(what, case.filler_working_set, request, ratio, free, filler.host_ram())

    @staticmethod
    def cap(case: Case) -> float:
        return FILLER_RUN_CAP_S if case.filler_working_set else RUN_CAP_S

    def probe(self, case: Case, request: int) -> dict:
        """Case f's first run (../shared GPU.md): naive, the driver alone, under a filler leaving a
        working set PROBE_RATIO times its room, 1 warm-up and 1 step, within PROBE_CAP_S.  Its
        record; raises ProbeTimedOut, or RuntimeError when it failed: then no run of the case is made."""
        naive = next(v for v in case.variants if v.name == "naive")
        sized = self.guard(case, f"case {case.key}, its probe", request, filler.PROBE_RATIO)
        argv = command(case, naive, 1, 1, filler_bytes=sized["filler_bytes"])
        r = self.run(argv, reserve=self.args.budget_seconds * UNTIMED_SHARE, cap=PROBE_CAP_S)
        what = (f"case {case.key}'s probe (naive under a filler of {sized['filler_bytes'] / GiB:.2f} GiB, a working "
                f"set {filler.PROBE_RATIO:g}x its room) {ended(r)}")
        if r["rc"] is None:
            raise ProbeTimedOut(f"{what}: none of the case's runs is made")
        if r["rc"] != 0 or r["final"] is None:
            raise RuntimeError(f"{what}: {(r['stderr_tail'].splitlines() or ['no final record'])[-1]}")
        return {"command": argv, "seconds": r["seconds"], "filler": sized}

    def microbenchmark(self, script: str, what: str, buffers: int) -> dict:
        """One of the link's microbenchmarks (a program printing one JSON object), its buffers of
        BANDWIDTH_MIB x --scale MiB each, fewer where the card has less room."""
        free, total = membudget.nvml_memory(0)
        mib = max(1, min(round(BANDWIDTH_MIB * self.args.scale), membudget.allowed(free, total) // 4 // buffers // MiB))
        membudget.check(f"the {what} run ({buffers} x {mib} MiB)", buffers * mib * MiB, free, total)
        r = self.run([sys.executable, str(HERE / script), "--mib", str(mib)])
        if r["rc"] != 0 or not r["docs"]:
            raise RuntimeError(f"{script} failed (rc {r['rc']}): {r['stderr_tail']}")
        return r["docs"][-1]

    def bandwidth(self) -> dict:
        return self.microbenchmark("prefetch_bw.py", "prefetch bandwidth", 1)

    def discard(self) -> dict:
        return self.microbenchmark("discard.py", "discard", 2)

    def timed(self, case: Case, request: int) -> None:
        """Every variant's timed run; step times, identity with ideal, pump's counters."""
        warmup, count = TIMED[case.workload]
        out = case.result.setdefault("variants", {})
        for v in case.variants:
            rec = out.setdefault(v.name, {})
            try:
                sized = self.guard(case, f"case {case.key}, {v.name}", request) if v.memory == "managed" else None
                stats = self.work / f"{case.key}-{v.name}-stats.json" if v.pump is not None else None
                argv = command(case, v, warmup, count, stats=stats, filler_bytes=(sized or {}).get("filler_bytes", 0))
                r = self.run(argv, reserve=self.args.budget_seconds * UNTIMED_SHARE, cap=self.cap(case))
            except (membudget.Refused, OutOfTime) as exc:
                rec["refused" if isinstance(exc, membudget.Refused) else "skipped"] = str(exc)
                self.say(str(exc))
                continue
            rec.update(command=argv, rc=r["rc"], seconds=r["seconds"], **({"filler": sized} if sized else {}))
            if r["rc"] is None and case.filler_working_set:
                rec["timed_out"] = f"{ended(r)}, {len(r['steps'])} of {count} timed steps done after {warmup} warm-up"
                rec["done_ms"] = [s["ms"] for s in r["steps"]]
                continue
            if r["rc"] != 0 or r["final"] is None:
                last = (r["stderr_tail"].splitlines() or ["no final record"])[-1]
                rec.update(error=f"{ended(r)}: {last}", stderr_tail=r["stderr_tail"])
                continue
            rec["run"] = r
            rec["step_ms"] = table.summarize(timed_ms(r["steps"], warmup, count))
            if case.workload == "chain":
                for field in ("host_ms", "kernel_ms"):
                    rec[field] = table.summarize(timed_ms(r["steps"], warmup, count, field))
            rec["checksum_hex"] = r["final"]["checksum_hex"]
            if stats:
                rec["pump"] = pump_totals(stats)
                if case.emulated and outside_emulation(rec["pump"]):
                    rec["not_a_result"] = outside_emulation(rec["pump"])
        # The reference: ideal, else the first other variant without pump that ran.
        plain = [v.name for v in case.variants if v.pump is None and "run" in out[v.name]]
        case.result["reference"] = plain[0] if plain else None
        for name, rec in out.items():
            if name != case.result["reference"] and "run" in rec:
                rec["identical"], rec["mismatch"] = (compare(out[plain[0]]["run"], rec["run"]) if plain
                                                     else (None, "no run without pump to compare with"))

    def untimed(self, case: Case, request: int, library) -> None:
        """CUPTI's counters per variant, and the traced variant's trace for the lower bound, first:
        the evidence a replay needs is what a short budget must not leave out (the H200's case c
        ran out of time after ideal's and naive's counter runs, and kept no trace)."""
        for v in sorted(case.variants, key=lambda v: v.name != case.traced):
            rec = case.result["variants"][v.name]
            report = self.work / f"{case.key}-{v.name}-cupti.json"
            trace = self.work / f"{case.key}.trace" if v.name == case.traced else None
            if "timed_out" in rec:   # its counter run would be stopped too, and its report with it
                rec["cupti"] = {"error": f"not run: the timed run {rec['timed_out']}"}
                continue
            try:
                sized = (self.guard(case, f"case {case.key}, {v.name} (counters)", request) if v.memory == "managed"
                         else None)
                r = self.run(command(case, v, 0, UNTIMED_STEPS, trace=trace,
                                     filler_bytes=(sized or {}).get("filler_bytes", 0)),
                             cupti.env(library, str(report)) if isinstance(library, str) else None, cap=self.cap(case))
            except (membudget.Refused, OutOfTime) as exc:
                rec["cupti"] = {"error": str(exc)}
                continue
            if not isinstance(library, str):
                rec["cupti"] = {"error": library["error"]}
            elif r["rc"] != 0:
                rec["cupti"] = {"error": f"the counter run failed ({ended(r)}): {r['stderr_tail']}"}
            else:
                rec["cupti"] = cupti.read(str(report))
            if trace is not None and r["rc"] == 0:
                case.result["trace_run"] = r
                # Whether the job's launch keys repeat from step to step, which lookahead needs.
                case.result["iteration"] = pump_trace.stats(str(trace))["iteration"]
                self.say(f"  iteration: {pump_trace.iteration_text(case.result['iteration'])}")

    def bound(self, case: Case, bandwidth: dict) -> dict:
        """The case's lower bound (table.lower_bound) or {"error": why}."""
        ideal = case.result["variants"].get("ideal", {})
        if "step_ms" not in ideal:
            return {"error": "no ideal run to take compute time from"}
        # The work no variant avoids, one part after the other: the chain's host writes, then its
        # kernels (ideal's, as fast as they go); the transformer's whole ideal step.
        compute = (ideal["host_ms"]["median"] + ideal["kernel_ms"]["median"] if case.workload == "chain"
                   else ideal["step_ms"]["median"]) / 1e3
        if "h2d_bytes_per_s" not in bandwidth:
            return {"error": f"no measured prefetch bandwidth: {bandwidth.get('error')}"}
        if case.traced is None:
            doc = table.lower_bound(compute, 0, bandwidth["h2d_bytes_per_s"])
            doc["source"] = "the job fits and the host writes no managed memory: nothing must move"
            return doc
        run = case.result.get("trace_run")
        if case.traced not in [v.name for v in case.variants]:
            return {"error": f"not computed: --variants left out {case.traced}, whose trace the bound reads"}
        if run is None:
            return {"error": f"no trace: the {case.traced} variant's untimed run did not finish"}
        written = [(b["address"], b["bytes"]) for b in (run["final"] or {}).get("buffers", []) if b.get("host_written")]
        try:
            must = lowerbound.must_move(str(self.work / f"{case.key}.trace"), case.capacity, written)
        except (lowerbound.NoIteration, lowerbound.workload.WorkloadError) as exc:
            return {"error": str(exc)}
        doc = table.lower_bound(compute, must["must_move_bytes"], bandwidth["h2d_bytes_per_s"])
        doc.update(must, source=f"Belady's MIN on the {case.traced} run's pump trace at "
                                f"{case.capacity / GiB:.2f} GiB (bench/gpu/lowerbound.py)")
        return doc


EMULATED = ("Cases marked emulated hold the job's managed footprint above a budget of GPU-resident "
            "bytes that pump enforces by evicting to the host; the card itself is never oversubscribed "
            "(../shared GPU.md). Their naive variant is pump's evict-only mode (--policy off --budget B). "
            "Judge them by their ratio to the lower bound.")


REAL = ("Case f is real oversubscription: the job first takes plain device memory that Unified Memory cannot "
        "evict (train_gpt.py --filler-bytes), so that its managed memory has about half its working set of the "
        "card; its naive is the driver's own Unified Memory (pump-run --policy off: managed_all on, nothing "
        "prefetched). A run there that reaches its cap is reported as timed out: a lower bound on its time.")


def parse_args(argv=None):
    ap = argparse.ArgumentParser(prog="suite.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", default=CASES, help=f"which cases, in order (default {CASES}; also {OPT_IN})")
    ap.add_argument("--scale", type=float, default=1.0, help="size factor for every case (default 1)")
    ap.add_argument("--budget-seconds", type=float, default=420.0, help="stop starting runs after this (default 420)")
    ap.add_argument("--json", metavar="FILE", help="write every figure as one JSON document")
    ap.add_argument("--train-script", default=str(REPO / "examples" / "train_gpt.py"),
                    help="the PyTorch job of cases c-e (default examples/train_gpt.py)")
    ap.add_argument("--work", metavar="DIR", help="where traces and counter reports go (default a temp dir)")
    ap.add_argument("--variants", metavar="NAMES",
                    help="only these of each case's variants with pump, comma-separated, beside those without "
                         "(the reference); a short device call's open question, e.g. launch,launch-no-discards")
    ap.add_argument("--quick", action="store_true",
                    help="the dry run's sizes (scripts/gpu-check-dry-run, on fakecuda): a chain of 2 pairs, "
                         "1 warm-up and 2 timed steps per run, 3 untimed; no figure of it means anything")
    args = ap.parse_args(argv)
    bad = sorted(set(args.cases) - set(CASES + OPT_IN))
    if bad or not args.cases:
        ap.error(f"--cases {args.cases!r}: allowed letters {CASES + OPT_IN}")
    if not 0 < args.scale <= 64:
        ap.error(f"--scale {args.scale}: allowed above 0, at most 64")
    if args.budget_seconds < MIN_RUN_S:
        ap.error(f"--budget-seconds {args.budget_seconds}: at least {MIN_RUN_S}")
    args.variants = [name for name in (args.variants or "").split(",") if name] or None
    return args


def only_variants(case: Case, names) -> None:
    """Keeps the case's variants without pump and those of `names` (None: all); raises RuntimeError
    for a name the case has not."""
    if names is None:
        return
    known = [v.name for v in case.variants if v.pump is not None]
    unknown = [name for name in names if name not in known]
    if unknown:
        raise RuntimeError(f"--variants: case {case.key} has no {', '.join(unknown)}; its variants with pump: "
                           f"{', '.join(known)}")
    case.variants = [v for v in case.variants if v.pump is None or v.name in names]


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.quick:
        global CHAIN_PAIRS, CHAIN_REPEAT, TIMED, UNTIMED_STEPS
        CHAIN_PAIRS, CHAIN_REPEAT, TIMED, UNTIMED_STEPS = 2, 1, {"chain": (1, 2), "gpt": (1, 3)}, 3
    suite = Suite(args)
    try:
        device = device_info()
    except Exception as exc:  # NVML missing or no GPU: nothing may run without the memory check
        print(f"suite: cannot read the GPU through NVML, so no case may run: {exc}", file=sys.stderr)
        return 2
    doc = {"suite": "bench/gpu/suite.py", "started": datetime.datetime.now(datetime.timezone.utc).isoformat(),
           "device": device, "versions": versions(), "scale": args.scale, "emulated_note": EMULATED,
           "real_note": REAL, "timed_steps": TIMED, "untimed_steps": UNTIMED_STEPS}
    suite.say(f"GPU: {device['name']}, driver {device['driver']} (CUDA {device['cuda_driver_version']}), "
              f"{device['memory_free_at_start_bytes'] / GiB:.1f} of {device['memory_total_bytes'] / GiB:.1f} GiB free")
    for part in ("bandwidth", "discard"):
        try:
            doc[part] = getattr(suite, part)()
        except (membudget.Refused, OutOfTime, RuntimeError) as exc:
            doc[part] = {"error": str(exc)}
            suite.say(str(exc))
    try:
        library = cupti.build(suite.work)
    except cupti.Unavailable as exc:
        library = {"error": str(exc)}
        suite.say(f"CUPTI counters unavailable: {exc}")

    cases, gpt_ideal = [], None
    for key in args.cases:
        suite.say(f"== case {key}")
        try:
            if key in "ab":
                case = plan_chain(key, args.scale, *membudget.nvml_memory(0))
                request = chain_sizes(args.scale)["working_set"]
            else:
                program = gpt_args(args.scale, args.train_script)
                if gpt_ideal is None:
                    warmup, count = TIMED["gpt"]
                    gpt_ideal = suite.run(program + ["--warmup", str(warmup), "--steps", str(count)])
                peak = (gpt_ideal["final"] or {}).get("peak_bytes")
                if gpt_ideal["rc"] != 0 or not peak:
                    raise RuntimeError(f"train_gpt.py's ideal run gave no peak_bytes (exit status {gpt_ideal['rc']}): "
                                       f"{gpt_ideal['stderr_tail']}")
                free, total = membudget.nvml_memory(0)
                case = (plan_filler(program, int(peak), free, filler.host_ram()) if key == "f"
                        else plan_gpt(key, program, int(peak), free, total))
                request = int(int(peak) * TORCH_SLACK)
            only_variants(case, args.variants)
            suite.say(f"  {case.title}")
            probe = suite.probe(case, request) if case.filler_working_set else None
        except (membudget.Refused, OutOfTime, ProbeTimedOut, RuntimeError) as exc:
            suite.say(str(exc))
            what = ("refused" if isinstance(exc, membudget.Refused) else "error" if isinstance(exc, RuntimeError)
                    else "skipped")
            cases.append(({"case": key, what: str(exc)}, None, 0))
            continue
        case.result = {"case": key, "title": case.title, "emulated": case.emulated, "capacity_bytes": case.capacity,
                       "request_bytes": request, "variants": {},
                       **({"real_oversubscription": True, "probe": probe} if probe else {})}
        suite.timed(case, request)
        cases.append((case.result, case, request))

    suite.say("== untimed runs: CUPTI counters and traces")
    for result, case, request in cases:
        if case is not None:
            suite.untimed(case, request, library)
            result["lower_bound"] = suite.bound(case, doc["bandwidth"])
            table.add_ratios(result)
            result.pop("trace_run", None)
            for rec in result["variants"].values():
                rec.pop("run", None)
    doc["cases"] = [result for result, _, _ in cases]
    doc["table"] = table.render(doc["cases"])
    doc["seconds"] = args.budget_seconds - suite.left()
    suite.say("\n" + doc["table"])
    # The counter cells of a variant whose CUPTI report has an error read "refused" or "-", never
    # 0: say why beside the table (CUPTI being unavailable here says it once, above).
    doc["counter_errors"] = table.counter_errors(doc["cases"])
    if doc["counter_errors"] and isinstance(library, str):
        suite.say(f"CUPTI counters missing for {len(doc['counter_errors'])} variant(s):")
        for line in doc["counter_errors"]:
            suite.say(f"  {line.splitlines()[0]}")
    failures = [f"case {c['case']}, {name}: {v.get('error') or v.get('mismatch')}" for c in doc["cases"]
                for name, v in c.get("variants", {}).items() if v.get("error") or v.get("identical") is False]
    failures = [f"{part}: {doc[part]['error']}" for part in ("bandwidth", "discard") if "error" in doc[part]] + \
        [f"case {c['case']}: {c['error']}" for c in doc["cases"] if "error" in c] + failures
    doc["failures"] = failures
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(doc, indent=2, default=str) + "\n")
        suite.say(f"wrote {args.json}")
    for line in failures:
        suite.say(f"FAILED {line}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
