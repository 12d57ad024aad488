"""What `pump simulate` and scripts/bench-sim print: per policy the steady-state step time
(mean and median of the steady steps), faults and bytes each way, the mean's ratio to the ideal
(unlimited memory) and to the lower bound, over the range of the unmeasured constants (a best
and a worst case: engine.range_models), and the plot of step time against capacity.

The lower bound, max(compute time, bytes that must move / bandwidth) with the bytes Belady's MIN
fetches per steady step, is defined, and shown to be one, in bound.py.  It bounds the long-run
mean step, so each policy's mean is compared with it, never its median.
"""

import json


from pump.simulate import engine
from pump.simulate.bound import lower_bound
from pump.simulate.runs import RATE_FREE, Runs, _size  # noqa: F401 (RATE_FREE: report's name for it too)


def table_plan(capacity: int, models, policies=engine.POLICIES) -> list:
    """The runs simulate_range() asks for: [(policy, capacity, model)] (ideal always: the
    others' ratio); Runs.to_make() says how many of them are made."""
    every = ("ideal",) + tuple(p for p in policies if p != "ideal")
    return [(p, capacity, model) for _case, model in models for p in every]


def simulate(workload, capacity: int, model: engine.Model, policies=engine.POLICIES, recorder_for=None,
             progress=None, runs=None, bound: bool = True) -> dict:
    """One JSON-able document: the trace, the model, the bound and per policy its results.
    recorder_for(policy): engine.run's recorder for that policy (a timeline), or None;
    progress(what): called as each run begins; runs: the command's Runs (made here if None),
    whose runs are not made again; bound False: the policies' results alone, without the lower
    bound (a third of the time on a GPU run's traces; its keys absent, the ratios to it None)."""
    runs = runs or Runs(workload, progress)
    doc = {"trace": workload.path, "name": workload.name, "model": model.name, "gpu": model.gpu.name,
           "bandwidth_bytes_per_s": model.bandwidth, "d2h_bandwidth_bytes_per_s": model.d2h_rate,
           "link_bytes_per_s": model.link_bytes_per_s,
           "full_duplex": model.full_duplex, "capacity_bytes": int(capacity),
           "peak_footprint_bytes": int(workload.peak_footprint), "launches": workload.launches,
           "period": workload.period, "learned_at_launch": workload.learned_at,
           "steady_steps": engine.steady_steps(workload)}
    if workload.segments:   # only where the trace has them: other documents are as they were
        doc["segments_kept"] = workload.segments
    if bound:
        doc.update(lower_bound(workload, capacity, model))
    doc["policies"] = {}
    ideal = None
    for policy in ("ideal",) + tuple(p for p in policies if p != "ideal"):
        r = runs.run(policy, capacity, model, recorder_for(policy) if recorder_for else None)
        if policy == "ideal":
            ideal = r.step_mean_seconds
            if "ideal" not in policies:
                continue
        doc["policies"][policy] = {
            "step_seconds": r.step_seconds,
            "step_mean_seconds": r.step_mean_seconds,
            "ratio_to_ideal": r.step_mean_seconds / ideal if ideal else None,
            "ratio_to_lower_bound": (r.step_mean_seconds / doc["lower_bound_seconds"]
                                     if doc.get("lower_bound_seconds") else None),
            "per_step": {"faults": r.steady_mean("faults"), "bytes_h2d": r.steady_mean("h2d"),
                         "bytes_d2h": r.steady_mean("d2h"), "data_wait_seconds": r.steady_mean("data_wait"),
                         "prefetch_wait_seconds": r.steady_mean("prefetch_wait"),
                         "pump_host_seconds": r.steady_mean("host")},
            "total": {"gpu_faults": r.faults, "fault_batches": r.fault_batches,
                      "bytes_prefetched_h2d": r.bytes_prefetched_h2d, "bytes_faulted_h2d": r.bytes_faulted_h2d,
                      "bytes_d2h": r.bytes_d2h, "bytes_discarded": r.bytes_discarded,
                      "unsafe_discards": r.unsafe_discards, "prefetch_calls": r.prefetch_calls,
                      "evictions": r.evictions, "driver_evictions": r.driver_evictions,
                      "prefetch_wait_seconds": r.prefetch_wait_seconds, "data_wait_seconds": r.data_wait_seconds,
                      "max_believed_bytes": r.max_believed, "max_resident_bytes": r.max_resident,
                      "pump_host_seconds": r.host_seconds, "pump_driver_ranges": r.driver_ranges},
        }
    doc["ideal_seconds"] = ideal
    return doc


def simulate_range(workload, capacity: int, models, policies=engine.POLICIES, recorder_for=None,
                   progress=None, runs=None) -> dict:
    """simulate() for each (case, model) of `models` (engine.range_models; the first case's
    document is the whole, the others' under doc["cases"] too); recorder_for: the first only."""
    doc, cases = None, {}
    runs = runs or Runs(workload, progress)
    for i, (case, model) in enumerate(models):
        one = simulate(workload, capacity, model, policies, recorder_for if i == 0 else None, runs=runs)
        doc = doc or one
        cases[case] = {k: one[k] for k in ("model", "bandwidth_bytes_per_s", "d2h_bandwidth_bytes_per_s", "full_duplex",
                                           "lower_bound_seconds", "ideal_seconds", "policies")}
    doc["cases"] = cases
    return doc


def _ratio(r) -> str:
    """A ratio, or "-" where its denominator was 0 (a trace whose kernels take no time)."""
    return "-" if r is None else f"{r:.2f}"


def _to_bound(policy, ratio) -> str:
    """A policy's mean step against the bound, in words; ideal has unlimited memory, so the
    bound (on a step within the capacity) is not its own."""
    return "unlimited memory" if policy == "ideal" else f"{_ratio(ratio)}x bound"


def _case_line(case, c) -> str:
    steps = ", ".join(f"{p} {d['step_mean_seconds'] * 1e3:.3f} ms ({_to_bound(p, d['ratio_to_lower_bound'])})"
                      for p, d in c["policies"].items())
    return (f"  {case}: {c['bandwidth_bytes_per_s'] / 1e9:.1f} GB/s in, {c['d2h_bandwidth_bytes_per_s'] / 1e9:.1f} out, "
            f"{'full' if c['full_duplex'] else 'half'} "
            f"duplex: bound {c['lower_bound_seconds'] * 1e3:.3f} ms; {steps}")


def _segments(doc) -> str:
    n = doc.get("segments_kept")
    return (f", {n} caching-allocator segments kept whole (a dead tensor's memory stays in its segment; "
            "--no-segments frees it)") if n else ""


def text(doc: dict) -> str:
    lines = [f"{doc['name']} ({doc['trace']}): {doc['launches']} launches, period {doc['period']}, "
             f"peak footprint {_size(doc['peak_footprint_bytes'])}" + _segments(doc),
             f"model {doc['model']}, capacity {_size(doc['capacity_bytes'])}, "
             f"bandwidth {doc['bandwidth_bytes_per_s'] / 1e9:.1f} GB/s host->GPU, "
             f"{doc['d2h_bandwidth_bytes_per_s'] / 1e9:.1f} GB/s GPU->host, steady steps {doc['steady_steps']}",
             f"lower bound {doc['lower_bound_seconds'] * 1e3:.3f} ms per step (compute "
             f"{doc['compute_seconds'] * 1e3:.3f} ms; MIN moves {_size(doc['must_move_bytes'])} host->GPU); "
             f"ideal {doc['ideal_seconds'] * 1e3:.3f} ms",
             f"weaker bound {doc['weak_lower_bound_seconds'] * 1e3:.3f} ms (touched {_size(doc['touched_bytes'])}, "
             f"{_size(doc['touched_beyond_capacity_bytes'])} beyond capacity)",
             f"with each launch's blocks resident while it runs (launch, lookahead): MIN moves "
             f"{_size(doc['whole_launch_must_move_bytes'])}, "
             f"chain bound {doc['whole_launch_chain_seconds'] * 1e3:.3f} ms",
             "step times over the steady steps: mean (compared with the bound; ideal, with unlimited memory, "
             "is not held to it) and median",
             f"{'policy':<10} {'mean ms':>10} {'median ms':>10} {'x ideal':>8} {'x bound':>8} {'faults':>10} "
             f"{'H2D/step':>11} {'D2H/step':>11} {'data wait':>10}"]
    for policy, p in doc["policies"].items():
        s = p["per_step"]
        to_bound = "-" if policy == "ideal" else _ratio(p["ratio_to_lower_bound"])
        lines.append(f"{policy:<10} {p['step_mean_seconds'] * 1e3:>10.3f} {p['step_seconds'] * 1e3:>10.3f} "
                     f"{_ratio(p['ratio_to_ideal']):>8} "
                     f"{to_bound:>8} {s['faults']:>10.0f} {_size(s['bytes_h2d']):>11} "
                     f"{_size(s['bytes_d2h']):>11} {s['data_wait_seconds'] * 1e3:>8.1f}ms")
    if len(doc.get("cases", ())) > 1:
        lines.append("over the range of explicit-migration rates (constants.py: line rate and full duplex, "
                     "to the measured fraction and half duplex), mean steps:")
        lines.extend(_case_line(case, c) for case, c in doc["cases"].items())
        lines.extend(_slower_than_the_driver(doc))
    return "\n".join(lines)


def _slower_than_the_driver(doc: dict) -> list:
    """A line for each case of the range where a pump policy's mean step is longer than the
    driver's alone (naive), and why: pump's moves go at that case's explicit-migration rates,
    the driver's faults and evictions at the link's line rate."""
    out = []
    for case, c in doc["cases"].items():
        naive = c["policies"].get("naive")
        slower = [p for p in ("launch", "lookahead") if naive and p in c["policies"]
                  and c["policies"][p]["step_mean_seconds"] > naive["step_mean_seconds"]]
        if slower:
            steps = " and ".join(f"{p} {c['policies'][p]['step_mean_seconds'] * 1e3:.3f} ms" for p in slower)
            out.append(f"  in the {case} case pump is slower than the driver alone ({steps} against naive "
                       f"{naive['step_mean_seconds'] * 1e3:.3f} ms): its moves go at that case's rates "
                       f"({c['bandwidth_bytes_per_s'] / 1e9:.1f} GB/s in, {c['d2h_bandwidth_bytes_per_s'] / 1e9:.1f} "
                       f"out), the driver's faults and evictions at the link's {doc['link_bytes_per_s'] / 1e9:.1f} GB/s; "
                       "which case a machine is in, gpu-check's prefetch_bandwidth probe measures")
    return out


def fakecuda_counts(doc: dict) -> dict:
    """What fakecuda's stats would say for each policy over the whole replay (its names)."""
    return {p: {"gpu_fault_batches": v["fault_batches"],
                **{k: v[k] for k in ("gpu_faults", "bytes_prefetched_h2d", "bytes_faulted_h2d", "bytes_d2h")}}
            for p, v in ((p, d["total"]) for p, d in doc["policies"].items())}


PLOT_FRACTIONS = (0.25, 0.375, 0.5, 0.625, 0.75, 0.875, 1.0)


def capacities(workload, fractions=PLOT_FRACTIONS) -> list:
    return [max(1, int(workload.peak_footprint * f)) for f in fractions]


def plot_plan(workload, model: engine.Model, fractions=PLOT_FRACTIONS) -> list:
    """The runs series() asks for: [(policy, capacity, model)]."""
    return [(p, c, model) for c in capacities(workload, fractions) for p in engine.POLICIES]


def series(workload, model: engine.Model, fractions=PLOT_FRACTIONS, progress=None, runs=None) -> dict:
    """Each policy's mean step (ms) and the lower bound at each capacity, as shares of the
    peak footprint; runs: the command's Runs (made here if None)."""
    runs = runs or Runs(workload, progress)
    caps = capacities(workload, fractions)
    steps = {p: [] for p in engine.POLICIES}
    for c in caps:
        for p in engine.POLICIES:
            steps[p].append(runs.run(p, c, model, note=" (plot)").step_mean_seconds * 1e3)
    bound = [lower_bound(workload, c, model)["lower_bound_seconds"] * 1e3 for c in caps]
    return {"fractions": list(fractions), "capacities": caps, "step_ms": steps, "lower_bound_ms": bound}


def draw(workload, model: engine.Model, data: dict, out, marks=()):
    """Draw series() as a PNG into `out` (a path or a binary file); marks: (capacity, label)
    lines.  Captioned as what it is: a model's prediction."""
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib import pyplot
    xs = [100 * c / workload.peak_footprint for c in data["capacities"]]
    fig, ax = pyplot.subplots(figsize=(7, 4.5))
    for p, ys in data["step_ms"].items():
        ax.plot(xs, ys, marker="o", label=p)
    ax.plot(xs, data["lower_bound_ms"], linestyle="--", color="gray", label="lower bound")
    ax.set_xlabel("capacity, % of peak footprint")
    ax.set_ylabel("mean step time, ms")
    ax.set_yscale("log")
    for capacity, label in marks:
        ax.axvline(100 * capacity / workload.peak_footprint, color="black", linewidth=0.8, linestyle=":", label=label)
    ax.set_title(f"{workload.name}: {model.name}, {model.bandwidth / 1e9:.0f} GB/s (modelled, not measured)", fontsize=9)
    ax.legend()
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, format="png")
    pyplot.close(fig)


def plot(workload, model: engine.Model, out, capacity=None, progress=None, fractions=PLOT_FRACTIONS, runs=None):
    """Step time against capacity for every policy (series()), drawn into `out`; `capacity`,
    the one asked for, is marked."""
    data = series(workload, model, fractions, progress, runs)
    draw(workload, model, data, out, [(capacity, f"--capacity {_size(capacity)}")] if capacity else ())
    return data


def dumps(doc) -> str:
    return json.dumps(doc, indent=2, default=float)
