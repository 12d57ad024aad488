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

from pump.simulate import constants as K
from pump.simulate import engine, report

REFINE_SHARE = 0.01


def _mean_step(workload, policy, capacity, model) -> float:
    return engine.run(workload, policy, capacity, model).step_mean_seconds


def smallest_capacity(workload, model, limit: float, grid):
    """The smallest capacity (bytes) at which lookahead's mean step is at most `limit`
    seconds, to within REFINE_SHARE of the footprint; grid: [(capacity, step)] ascending,
    lookahead's.  None if no capacity up to the footprint meets it."""
    missed = 0
    for capacity, step in grid:
        if step <= limit:
            break
        missed = capacity
    else:
        return None
    met = capacity
    while met - missed > REFINE_SHARE * workload.peak_footprint:
        middle = (met + missed) // 2
        if _mean_step(workload, "lookahead", middle, model) <= limit:
            met = middle
        else:
            missed = middle
    return met


def sweep(workload, cases, reserve: int = K.RESERVE_BYTES, progress=None, fractions=report.PLOT_FRACTIONS) -> dict:
    """The sweep over `cases` (engine.range_models: the first, the best case, for every policy;
    each case for lookahead's answer) and the card's own memory less `reserve`; progress(what):
    called as each of the series' runs (report.plot_runs()) begins."""
    best = cases[0][1]
    data = report.series(workload, best, fractions, progress)
    card = best.gpu.memory_bytes - reserve
    doc = {"trace": workload.path, "name": workload.name, "gpu": best.gpu.name, "model": best.name,
           "peak_footprint_bytes": workload.peak_footprint, "sweep": data, "reserve_bytes": reserve,
           "card_capacity_bytes": card, "cases": {}}
    for case, model in cases:
        ideal = _mean_step(workload, "ideal", workload.peak_footprint, model)
        if model is best:
            grid = list(zip(data["capacities"], [ms / 1e3 for ms in data["step_ms"]["lookahead"]]))
        else:
            grid = [(c, _mean_step(workload, "lookahead", c, model)) for c in data["capacities"]]
        smallest = {f"{t:.0%}": smallest_capacity(workload, model, ideal * (1 + t), grid)
                    for t in K.SWEEP_TOLERANCES}
        at_card = min(card, workload.peak_footprint)
        doc["cases"][case] = {"bandwidth_bytes_per_s": model.bandwidth, "full_duplex": model.full_duplex,
                              "ideal_seconds": ideal, "smallest_capacity_bytes": smallest,
                              "card_step_mean_seconds": {p: _mean_step(workload, p, at_card, model)
                                                         for p in ("naive", "launch", "lookahead")}}
    return doc


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
            f"The {doc['gpu']} has {report._size(card)} for it ({report._size(doc['reserve_bytes'])} reserved): {has}.")


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
