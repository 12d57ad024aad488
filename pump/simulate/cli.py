"""`pump simulate`: its arguments (added to pump's parser) and what it runs."""

import argparse
import contextlib
import re
import sys
from fractions import Fraction

from pump import config, outfile, timeline_cli
from pump.cli_common import die
from pump.simulate import constants as K
from pump.simulate import engine, profile, report, sweep, workload
from pump.simulate.progress import Progress
from pump.simulate.runs import Runs
from pump.simulate.timeline import StepTimeline

BOUND_HELP = """\
lower bound of a steady step: max(compute time, B / bandwidth in, W / line
rate), on a half-duplex link max(compute time, B / bandwidth in + W / line
rate); W is the GPU->host bytes that must be copied back: pages written in a
step and read later beyond what fits (dead data needs none).  B is the
host->GPU bytes Belady's MIN moves per step on the learned iteration repeated
for ever, in 2 MiB blocks of what kernels touch (EXTENT ranges), with room for
capacity / 2 MiB blocks: (MIN's bytes over 16 iterations from empty - capacity)
/ 16.  MIN fetches the fewest blocks of any policy (Belady 1966; Mattson et al.
1970), and a prefetching policy can be turned into a demand-paging one with no
more fetches, so no policy moves less.  Also shown: the weaker bound from the
touched bytes beyond capacity, and MIN with each launch's blocks resident
together (what a policy that prefetches before each kernel can reach).
Details: pump/simulate/bound.py."""

CAPACITY_ALLOWED = (config.SIZE_ALLOWED + "; or a percentage of the trace's peak footprint, more than 0% and "
                    "at most 100%, decimals allowed (50%, 53.74%)")
_PERCENT = re.compile(r"([0-9]+(?:\.[0-9]+)?)%")


def _percent(text: str):
    """The percentage ``text`` gives (a Fraction in (0, 100]), or None if it gives none."""
    m = _PERCENT.fullmatch(text)
    share = Fraction(m.group(1)) if m else None
    return share if share is not None and 0 < share <= 100 else None


def _capacity(text: str) -> str:
    if _percent(text) is not None:
        return text
    config.parse_size(text)
    return text


def _capacity_type(text):
    try:
        return _capacity(text)
    except ValueError:
        raise config.BadValueError(f"bad value {text!r}; allowed: {CAPACITY_ALLOWED}") from None


def _size_type(text):
    try:
        return config.parse_size(text)
    except ValueError:
        raise config.BadValueError(f"bad value {text!r}; allowed: {config.SIZE_ALLOWED}") from None


def _bandwidth(text):
    """--link-gbps IN[,OUT]: (GB/s host->GPU, GB/s GPU->host or None)."""
    values = []
    for part in text.split(",") if text.count(",") <= 1 else ():
        try:
            values.append(float(part))
        except ValueError:
            values.append(0.0)
    if not values or not all(0 < v < 1e6 for v in values):
        raise config.BadValueError(f"bad value {text!r}; allowed: GB/s as a number > 0, or two (host to GPU, "
                                   "GPU to host), e.g. 63 or 49.8,11.2")
    return values[0], values[1] if len(values) == 2 else None


def add_parser(sub, handler):
    p = sub.add_parser("simulate", allow_abbrev=False, help="model a trace under each prefetch policy",
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       description="Replay TRACE in a discrete-event model of Unified Memory: step time, "
                                   "faults and bytes each way per policy, against the ideal (unlimited memory) "
                                   "and the lower bound. Every constant: pump/simulate/constants.py.",
                       epilog=BOUND_HELP)
    p.add_argument("trace", metavar="TRACE", help="a trace file (pump-run --trace, pump trace generate)")
    p.add_argument("--capacity", metavar="SIZE", type=_capacity_type,
                   help=f"GPU memory the job may use: {CAPACITY_ALLOWED} (needed unless --sweep)".replace("%", "%%"))
    p.add_argument("--sweep", action="store_true",
                   help="capacity planning: every policy's step against capacity, and the smallest capacity at "
                        "which lookahead stays within 10%% (25%%) of the unlimited-memory step, and its step at the "
                        "card's memory less --reserve")
    p.add_argument("--reserve", metavar="SIZE", type=_size_type,
                   help=f"with --sweep: the card's memory a job cannot use (default {K.RESERVE_BYTES >> 20} MiB: "
                        "CUDA context, library workspaces, communication buffers; constants.py)")
    p.add_argument("--gpu", choices=tuple(K.GPU_PRESETS) + ("fakecuda",),
                   help=f"the GPU preset (default {K.DEFAULT_GPU}; each figure's datasheet: pump/simulate/constants.py), "
                        "or fakecuda: predict fakecuda's counts for a replay under pump-run --budget SIZE")
    p.add_argument("--link-gbps", "--bandwidth", dest="link_gbps", metavar="IN[,OUT]", type=_bandwidth,
                   help="the host link's line rate in GB/s, host to GPU and GPU to host (one figure: both), "
                        "instead of the preset's PCIe generation and lanes")
    p.add_argument("--policy", choices=engine.POLICIES, action="append",
                   help="a policy to run (repeatable; default: all)")
    p.add_argument("--model", choices=tuple(engine.MODELS), help=argparse.SUPPRESS)  # the old spelling of --gpu
    p.add_argument("--profile", metavar="FILE",
                   help="kernel times measured on a GPU: a PyTorch profiler trace (JSON, gzipped or not) or an "
                        "Nsight Systems SQLite export of the same model, matched per operator and scaled to --gpu "
                        "(docs/simulate.md)")
    p.add_argument("--profile-gpu", metavar="PRESET", help="the GPU the profile was taken on (default: the "
                                                           "profile's device name)")
    p.add_argument("--plot", metavar="FILE.png", help="also plot step time against capacity for every policy")
    p.add_argument("--timeline", metavar="OUT.json",
                   help="also write one simulated step per policy as Chrome Trace Event JSON (ui.perfetto.dev, "
                        "chrome://tracing; gzip-compressed if the name ends in .gz)")
    p.add_argument("--timeline-png", metavar="OUT.png", help="also draw that timeline as a PNG (needs matplotlib)")
    timeline_cli.add_max_events(p)
    p.add_argument("--no-segments", dest="segments", action="store_false",
                   help="free each dead tensor's memory, as if every dead tensor were discarded; by default a "
                        "caching allocator's segments the trace shows carved stay whole, a dead tensor's memory "
                        "staying in its segment until a new tensor there takes it (pump/simulate/segments.py)")
    p.add_argument("--json", action="store_true", help="one JSON document instead of a table")
    p.set_defaults(handler=handler)


def _open_plot(path):
    """(the --plot file opened for writing, or None without --plot; why it cannot be, or "")."""
    if not path:
        return None, ""
    missing = timeline_cli.matplotlib_missing()
    if missing:
        return None, f"simulate: --plot {path}: {missing}"
    try:
        return outfile.open_output(path), ""
    except OSError as exc:
        return None, f"simulate: cannot write {path}: {exc.strerror}"


def _abandon_plot(plot, path):
    if plot is not None:
        plot.discard()


def capacity_bytes(text: str, peak: int) -> int:
    share = _percent(text)
    if share is not None:
        return max(1, int(peak * share / 100))
    return config.parse_size(text)


def _fold_model(args) -> str:
    """--model, the old spelling of --gpu (one name for one idea: `pump trace generate --model` is
    MODULE:CALLABLE): h100 is --gpu h100-pcie, fakecuda --gpu fakecuda; said once. Why it
    contradicts --gpu, or ""."""
    if not args.model:
        return ""
    gpu = K.DEFAULT_GPU if args.model == "h100" else "fakecuda"
    if args.gpu not in (None, gpu):
        return f"--model {args.model} is --gpu {gpu}, not --gpu {args.gpu}: give --gpu alone"
    args.gpu = gpu
    print(f"pump: simulate: --model {args.model} is spelt --gpu {gpu} now", file=sys.stderr)
    return ""


def _bad_combination(args) -> str:
    """Why the options contradict each other, or ""."""
    if not args.capacity and not args.sweep:
        return "give --capacity SIZE (or --sweep, which tries every capacity)"
    if args.sweep and args.gpu == "fakecuda":
        return "--sweep plans for a GPU's memory; --gpu fakecuda has none: give a GPU preset"
    if args.sweep and args.timeline:
        return "--timeline draws one capacity's step; --sweep tries many: give one of them"
    if args.reserve is not None and not args.sweep:
        return "--reserve is --sweep's: give both"
    return ""


def models(args) -> list:
    """[(case, engine.Model)]: fakecuda's one, or the preset's over the range (engine.range_models)."""
    link, out = (v * 1e9 if v else None for v in (args.link_gbps or (None, None)))
    if args.gpu == "fakecuda":
        return [("fakecuda", engine.fakecuda(link, out))]
    return engine.range_models(args.gpu or K.DEFAULT_GPU, link, out)


@workload.collector_paused   # the trace's tuples, each run's heap and recorded moves: millions, no cycles
def main(args) -> int:
    if args.timeline_png and not args.timeline:
        print("pump: simulate: --timeline-png draws the --timeline; give both", file=sys.stderr)
        return 2
    why = _fold_model(args) or _bad_combination(args)
    if why:
        print(f"pump: simulate: {why}", file=sys.stderr)
        return 2
    # Every output is opened before the work: a path that cannot be written fails now.
    out = timeline_cli.Outputs("simulate", args.timeline, args.timeline_png, args.max_events) \
        if args.timeline else None
    plot, why = _open_plot(args.plot)
    if why:
        if out:
            out.abandon()
        die("pump", why)
    try:
        cases = models(args)
        model = cases[0][1]
        w = workload.load(args.trace, daemon_reads_steps=model.daemon_reads_steps, segments=args.segments)
        measured = profile.apply(w, args.profile, model.gpu, args.profile_gpu) if args.profile else None
    except (workload.WorkloadError, ValueError) as exc:
        if out:
            out.abandon()
        _abandon_plot(plot, args.plot)
        print(f"pump: {exc}", file=sys.stderr)
        return 1
    if not (w.flops.any() or w.traffic.any() or w.measured_ns.any()):
        print(f"pump: warning: {args.trace} has no kernel costs (no FLOPs, bytes or measured times): every "
              "kernel takes no time in the model, so step times are launches, transfers and faults alone "
              "(pump trace generate writes costs)", file=sys.stderr)
    if args.sweep:
        return _sweep(args, w, cases, plot)
    capacity, policies = capacity_bytes(args.capacity, w.peak_footprint), tuple(args.policy or engine.POLICIES)
    if model.gpu_limits_memory and capacity > model.gpu.memory_bytes:
        print(f"pump: simulate: --capacity {args.capacity} is {capacity / 1e9:.1f} GB, more than the "
              f"{model.gpu.name}'s {model.gpu.memory_bytes / 1e9:.0f} GB: the capacity is the GPU memory the job "
              "may use (give less, or a larger --gpu)", file=sys.stderr)
        return 2
    steps = StepTimeline(out.timeline, w, capacity, model, policies) if out else None
    progress = Progress(0, eta=True)
    runs = Runs(w, progress.step)
    table = report.table_plan(capacity, cases, policies)
    progress.expect(runs.to_make(table + (report.plot_plan(w, model) if plot else [])))
    progress.say(_plan_line(runs, table, w, model, plot, len(cases)))
    try:
        doc = report.simulate_range(w, capacity, cases, policies, steps.recorder if steps else None, runs=runs)
        if plot:
            with plot:
                doc["plot"] = dict(report.plot(w, model, plot, capacity, runs=runs), file=args.plot)
    finally:
        progress.close()
    if measured:
        doc["profile"] = measured
    if args.gpu == "fakecuda":
        doc["fakecuda_counts"] = report.fakecuda_counts(doc)
    if args.json:
        print(report.dumps(doc))
    else:
        if measured:
            print(profile.text(measured))
        print(report.text(doc))
        if args.plot:
            print(f"plot: {args.plot}")
    if out:
        notes = steps.finish()
        # With --json stdout holds one JSON document: the timeline's lines go to stderr.
        with contextlib.redirect_stdout(sys.stderr) if args.json else contextlib.nullcontext():
            out.finish(notes, f"{w.name}: step {steps.step} per policy, modelled")
    return 0


def _plan_line(runs, table, w, model, plot, cases) -> str:
    """What the command will run, said before it starts: the table's runs, the plot's."""
    made = runs.to_make(table)
    line = (f"simulate: {made} runs for the table ({len(table) // cases} policies at {report._size(table[0][1])}"
            f"{' in each of ' + str(cases) + ' cases, ideal and naive once' if cases > 1 else ''})")
    if plot:
        extra = runs.to_make(table + report.plot_plan(w, model)) - made
        line += (f", then {extra} for --plot ({', '.join(engine.POLICIES)} at {len(report.PLOT_FRACTIONS)} "
                 "capacities, best case; the table's runs and ideal not repeated)")
    return line


def _sweep(args, w, cases, plot) -> int:
    """--sweep: the table and the one-line answer (or --json), the plot with the card marked.
    The first answer, from the plot's capacities, is said on stderr as soon as it is known."""
    reserve = K.RESERVE_BYTES if args.reserve is None else args.reserve
    progress = Progress(sweep.sweep_runs(w, cases), eta=True)
    progress.say(f"simulate: --sweep: first lookahead at {len(report.PLOT_FRACTIONS)} capacities in each of "
                 f"{len(cases)} cases ({progress.total} runs) for a first answer; then that answer refined to "
                 f"{sweep.REFINE_SHARE:.0%} of the footprint, the steps at the card's memory and the table's "
                 "other runs")
    progress.goal = " to the first answer"

    def first_answer(text):
        progress.say("simulate: " + text)
        progress.goal = ""

    try:
        doc = sweep.sweep(w, cases, reserve, progress.step, first_answer=first_answer, expect=progress.expect)
    finally:
        progress.close()
    if plot:
        marks = [(doc["card_capacity_bytes"], f"{doc['gpu']} less reserve")]
        if args.capacity:
            capacity = capacity_bytes(args.capacity, w.peak_footprint)
            marks.append((capacity, f"--capacity {report._size(capacity)}"))
        with plot:
            report.draw(w, cases[0][1], doc["sweep"], plot, [m for m in marks if m[0] <= w.peak_footprint])
        doc["plot"] = args.plot
    print(report.dumps(doc) if args.json else sweep.text(doc) + (f"\nplot: {args.plot}" if plot else ""))
    return 0
