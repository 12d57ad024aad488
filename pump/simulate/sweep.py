"""Capacity planning, `pump simulate TRACE --gpu G --sweep`: each policy's mean step against the
capacity the job may use, and the planning question answered in one line: the smallest
capacity at which lookahead stays within 10% (and 25%) of the unlimited-memory (ideal) step,
and the step predicted at the card's own memory less a stated reserve (constants.RESERVE_BYTES).

The capacities are the plot's shares of the peak footprint; the smallest capacity for each
tolerance is then narrowed by bisection between the last share that missed it and the first
that met it, to within REFINE_SHARE of the footprint, in the best case and in the worst
(engine.range_models): a capacity is an answer only where lookahead's step, falling as
capacity grows, first comes within the tolerance.
"""

import math

from pump.simulate import constants as K
from pump.simulate import report
from pump.simulate.runs import Runs

REFINE_SHARE = 0.01


def smallest_capacity(workload, model, limit: float, grid, runs=None, case="best"):
    """The smallest capacity (bytes) at which lookahead's mean step is at most `limit`
    seconds, to within REFINE_SHARE of the footprint; grid: [(capacity, step)] ascending,
    lookahead's.  None if no capacity up to the footprint meets it."""
    runs = runs or Runs(workload)
    missed, met = bracket(grid, limit)
    if met is None:
        return None
    while met - missed > REFINE_SHARE * workload.peak_footprint:
        middle = (met + missed) // 2
        if runs.run("lookahead", middle, model, note=f" (refining, {case} case)").step_mean_seconds <= limit:
            met = middle
        else:
            missed = middle
    return met


def bracket(grid, limit: float):
    """(the last capacity of the grid that missed `limit` (0: none), the first that met it
    (None: none))."""
    missed = 0
    for capacity, step in grid:
        if step <= limit:
            return missed, capacity
        missed = capacity
    return missed, None


def _halvings(missed, met, footprint) -> int:
    """How many runs smallest_capacity() makes between the two (about: each halves the gap)."""
    if met is None:  # lookahead met no limit up to the footprint: nothing to bisect
        return 0
    gap = met - missed
    return 0 if gap <= REFINE_SHARE * footprint else math.ceil(math.log2(gap / (REFINE_SHARE * footprint)))


def sweep(workload, cases, reserve: int = K.RESERVE_BYTES, progress=None, fractions=report.PLOT_FRACTIONS,
          first_answer=None, expect=None) -> dict:
    """The sweep over `cases` (engine.range_models: the first, the best case, for every policy;
    each case for lookahead's answer) and the card's own memory less `reserve`.  The answer's
    runs come first: lookahead at the plot's capacities in every case, and first_answer(text)
    is told the answer they give (to the capacities' spacing); then the bisections refine it and
    the table's other runs are made.  progress(what): called as each run begins; expect(n):
    told the runs to make in all, as it becomes known (sweep_runs() before the start)."""
    runs = Runs(workload, progress)
    best = cases[0][1]
    fp = workload.peak_footprint
    caps = report.capacities(workload, fractions)
    card = best.gpu.memory_bytes - reserve
    at_card = min(card, fp)
    ideal = runs.step("ideal", fp, best)
    # Each capacity in every case in turn: a case after the first times the first's moves (runs.py).
    steps = {(case, c): runs.run("lookahead", c, model, note=f" ({case} case)").step_mean_seconds
             for c in caps for case, model in cases}
    grids = {case: [(c, steps[case, c]) for c in caps] for case, _model in cases}
    limits = {f"{t:.0%}": ideal * (1 + t) for t in K.SWEEP_TOLERANCES}
    if first_answer:
        first_answer(rough(workload, best.gpu.name, grids, limits, card, reserve))
    later = [(p, at_card, model) for _case, model in cases for p in ("naive", "launch", "lookahead")]
    later += report.plot_plan(workload, best, fractions)
    if expect:
        expect(len(runs.done) + sum(_halvings(*bracket(grids[case], limit), fp) for case in grids
                                    for limit in limits.values()) + runs.to_make(later))
    doc = {"trace": workload.path, "name": workload.name, "gpu": best.gpu.name, "model": best.name,
           "peak_footprint_bytes": fp, "sweep": None, "reserve_bytes": reserve,
           "card_capacity_bytes": card, "cases": {}}
    for case, model in cases:
        smallest = {t: smallest_capacity(workload, model, limit, grids[case], runs, case) for t, limit in limits.items()}
        doc["cases"][case] = {"bandwidth_bytes_per_s": model.bandwidth, "full_duplex": model.full_duplex,
                              "ideal_seconds": ideal, "smallest_capacity_bytes": smallest,
                              "card_step_mean_seconds": {p: runs.run(p, at_card, model, note=f" (the card, {case} case)")
                                                         .step_mean_seconds for p in ("naive", "launch", "lookahead")}}
    if expect:
        expect(len(runs.done) + runs.to_make(later))
    doc["sweep"] = report.series(workload, best, fractions, runs=runs)
    return doc


def sweep_runs(workload, cases, fractions=report.PLOT_FRACTIONS) -> int:
    """The runs the first answer takes: ideal, and lookahead at the plot's capacities in each case."""
    return 1 + len(report.capacities(workload, fractions)) * len(cases)


def rough(workload, gpu: str, grids, limits, card: int, reserve: int) -> str:
    """The first answer: per case, between which two of the plot's capacities lookahead first
    comes within the first tolerance of its unlimited-memory step; and whether the card has it."""
    fp = workload.peak_footprint
    tolerance, limit = next(iter(limits.items()))
    spans = {case: bracket(grid, limit) for case, grid in grids.items()}

    def between(missed, met):
        if met is None:
            return f"more than its {report._size(fp)} footprint allows: all of it"
        return f"between {report._size(missed)} and {report._size(met)}" if missed else f"at most {report._size(met)}"

    best, worst = (spans[c] for c in ("best", "worst"))
    need = [met or fp for _missed, met in (best, worst)]
    has = "enough" if card >= need[1] else "enough in the best case only" if card >= need[0] else \
        "not enough" if card < best[0] else "not known yet"
    return (f"first answer, from the plot's capacities ({100 * (grids['best'][1][0] - grids['best'][0][0]) / fp:.1f}% "
            f"of the footprint apart; refined to {REFINE_SHARE:.0%} next): {workload.name} needs {between(*best)} "
            f"of GPU memory (a step within {tolerance} of its step with unlimited memory, under lookahead); "
            f"{between(*worst)} if the link is as slow as the worst case. The {gpu} has {report._size(card)} for "
            f"it ({report._size(reserve)} reserved): {has}.")


def _capacity(n, footprint) -> str:
    return "none up to the footprint" if n is None else f"{report._size(n)} ({100 * n / footprint:.0f}%)"


def plain(doc: dict) -> str:
    """The answer a user acts on, first: the memory lookahead needs to stay within the first
    tolerance of its unlimited-memory step, in the best case and if the link is as slow as the
    worst; and whether the card, less its reserve, has it."""
    fp, best, worst = doc["peak_footprint_bytes"], doc["cases"]["best"], doc["cases"]["worst"]
    tolerance = next(iter(best["smallest_capacity_bytes"]))
    need = [c["smallest_capacity_bytes"][tolerance] for c in (best, worst)]
    amount = ["all of its " + report._size(fp) + " footprint" if n is None else report._size(n) for n in need]
    card = doc["card_capacity_bytes"]
    has = "enough" if card >= (need[1] or fp) else "enough in the best case only" if card >= (need[0] or fp) \
        else "not enough"
    return (f"{doc['name']} needs at least {amount[0]} of GPU memory (a step within {tolerance} of its step with "
            f"unlimited memory, under lookahead); {amount[1]} if the link is as slow as the worst case. "
            f"The {doc['gpu']} has {report._size(card)} for it ({report._size(doc['reserve_bytes'])} reserved): {has}. "
            + likely_case())


def likely_case() -> str:
    """Which end of the range the machines measured so far are near (constants.MEASURED_LINKS),
    and what measures a user's own."""
    runs = K.MEASURED_LINKS
    machines = " and ".join(dict.fromkeys(f"an {m[0]}" for m in runs))
    near = sum(K.nearer_worst(*m[2:]) for m in runs)
    probed = [m[4] for m in runs if m[4] is not None]  # full duplex, where the run probed it
    turns = bool(probed) and not any(probed)
    return (f"Which end a machine is near, gpu-check's prefetch_bandwidth and concurrent_moves probes measure: "
            f"pump's runs on {machines} moved {min(m[2] for m in runs) / 1e9:.1f} to {max(m[2] for m in runs) / 1e9:.1f} "
            f"GB/s in and {min(m[3] for m in runs) / 1e9:.1f} to {max(m[3] for m in runs) / 1e9:.1f} out"
            f"{', the two directions taking turns' if turns else ''}: nearer the "
            f"{'worst' if 2 * near > len(runs) else 'best'} case ({near} of {len(runs)} runs).")


def answer(doc: dict) -> str:
    """The planning question in one line, each tolerance in the best and the worst case."""
    fp, best, worst = doc["peak_footprint_bytes"], doc["cases"]["best"], doc["cases"]["worst"]
    within = ", ".join(f"within {t} from {_capacity(best['smallest_capacity_bytes'][t], fp)} "
                       f"(worst case {_capacity(worst['smallest_capacity_bytes'][t], fp)})"
                       for t in best["smallest_capacity_bytes"])
    card = doc["card_capacity_bytes"]
    fits = "the footprint fits: no oversubscription" if card >= fp else f"{100 * card / fp:.0f}% of the footprint"
    steps = lambda c: c["card_step_mean_seconds"]["lookahead"] * 1e3  # noqa: E731
    return (f"lookahead's step ({best['ideal_seconds'] * 1e3:.1f} ms with unlimited memory) stays {within}; "
            f"on the {doc['gpu']}'s {report._size(card + doc['reserve_bytes'])} less a {report._size(doc['reserve_bytes'])} "
            f"reserve ({report._size(card)}, {fits}) lookahead's step is {steps(best):.1f}..{steps(worst):.1f} ms")


def text(doc: dict) -> str:
    d = doc["sweep"]
    lines = [plain(doc),
             f"{doc['name']} ({doc['trace']}): {doc['model']}, peak footprint {report._size(doc['peak_footprint_bytes'])}; "
             "mean step (ms) against capacity, best case (line rate, full duplex)",
             f"{'capacity':>18} " + " ".join(f"{p:>10}" for p in d["step_ms"]) + f" {'bound':>10}"]
    for i, c in enumerate(d["capacities"]):
        lines.append(f"{report._size(c):>10} ({100 * d['fractions'][i]:>4.1f}%) "
                     + " ".join(f"{d['step_ms'][p][i]:>10.1f}" for p in d["step_ms"]) + f" {d['lower_bound_ms'][i]:>10.1f}")
    lines.append(answer(doc))
    return "\n".join(lines)
