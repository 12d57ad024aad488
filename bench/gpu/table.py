"""The GPU suite's arithmetic and table: step-time summaries, the lower bound, each variant's
ratios within its case (to ideal, to the bound, speedup over naive), and the Markdown table
bench/README.md explains column by column."""

import statistics

import cupti

GB = 1e9


def summarize(values) -> dict:
    """Median and spread of step times (ms): quartiles, min, max, n, and the interquartile range
    as a percentage of the median."""
    values = sorted(float(v) for v in values)
    if not values:
        raise ValueError("no step times to summarize")
    median = statistics.median(values)
    q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive") if len(values) > 1 else (values[0],) * 3
    return {"median": median, "q1": q1, "q3": q3, "min": values[0], "max": values[-1], "n": len(values),
            "iqr_pct": 100.0 * (q3 - q1) / median if median > 0 else 0.0}


def lower_bound(compute_s: float, must_move_bytes: float, bandwidth: float) -> dict:
    """max(compute time, bytes that must move / measured prefetch bandwidth), with its parts."""
    if bandwidth <= 0:
        raise ValueError(f"a prefetch bandwidth of {bandwidth} bytes/s")
    transfer_s = must_move_bytes / bandwidth
    return {"compute_s": compute_s, "must_move_bytes": int(must_move_bytes), "bandwidth_bytes_per_s": bandwidth,
            "transfer_s": transfer_s, "seconds": max(compute_s, transfer_s),
            "limited_by": "transfer" if transfer_s > compute_s else "compute"}


def add_ratios(case: dict) -> None:
    """Per measured variant of a case: ratio_to_ideal, ratio_to_bound, speedup_over_naive (each
    where its reference was measured)."""
    variants = case["variants"]

    def median_s(name):
        v = variants.get(name) or {}
        return v["step_ms"]["median"] / 1e3 if v.get("step_ms") else None

    ideal, naive = median_s("ideal"), median_s("naive")
    bound_s = (case.get("lower_bound") or {}).get("seconds")
    for name in variants:
        t = median_s(name)
        if t is None or variants[name].get("not_a_result"):
            continue
        v = variants[name]
        v["ratio_to_ideal"] = t / ideal if ideal else None
        v["ratio_to_bound"] = t / bound_s if bound_s else None
        v["speedup_over_naive"] = naive / t if naive else None


def _fmt(x, spec, suffix=""):
    return "-" if x is None else f"{x:{spec}}{suffix}"


def _identical(v):
    if v.get("identical") is None:
        return "-"
    return "yes" if v["identical"] else "NO"


COLUMNS = ("case", "variant", "step ms", "IQR", "vs ideal", "vs bound", "over naive", "bit-identical",
           "H2D GB", "D2H GB", "GPU faults", "H2D by cause (GB)")


def counter_cells(report) -> list:
    """The H2D GB, D2H GB, GPU faults and H2D-by-cause cells of a variant's CUPTI report: "-"
    where nothing was counted (no report, or no such counter), "refused" in each where CUPTI
    refused the counters.  A report with an "error" shows no figure: its zeros were never
    counted (the H100's first run showed CUPTI_ERROR_NOT_READY's zeros as measured)."""
    report = report or {}
    if not report or report.get("error"):
        return ["refused" if cupti.refused(report) else "-"] * 4
    counters = report.get("counters") or {}
    causes = report.get("bytes_h2d_by_cause") or {}

    def gb(key):
        return None if counters.get(key) is None else counters[key] / GB
    return [_fmt(gb("bytes_h2d"), ".2f"), _fmt(gb("bytes_d2h"), ".2f"), _fmt(counters.get("gpu_page_faults"), "d"),
            ", ".join(f"{k} {n / GB:.2f}" for k, n in causes.items() if n) or "-"]


def counter_errors(cases) -> list:
    """"case X, variant: why" for every variant whose CUPTI counters are missing, for the suite's
    log beside the table."""
    return [f"case {c['case']}, {name}: {v['cupti']['error']}" for c in cases
            for name, v in (c.get("variants") or {}).items() if (v.get("cupti") or {}).get("error")]


def rows(cases) -> list:
    out = []
    for case in cases:
        label = case["case"] + (" (emulated)" if case.get("emulated") else
                                " (real oversubscription)" if case.get("real_oversubscription") else "")
        stopped = ("ERROR: " + case["error"]) if case.get("error") else case.get("refused") or case.get("skipped")
        if stopped:
            out.append([label, "-", stopped.splitlines()[0]] + ["-"] * (len(COLUMNS) - 3))
            continue
        for name, v in case["variants"].items():
            s = v.get("step_ms")
            stopped = (("ERROR: " + v["error"]) if v.get("error") else
                       v.get("refused") or v.get("skipped") or v.get("timed_out") or v.get("not_a_result"))
            if stopped:
                out.append([label, name, stopped.splitlines()[0]] + ["-"] * (len(COLUMNS) - 3))
                continue
            out.append([label, name, _fmt(s and s["median"], ".2f"), _fmt(s and s["iqr_pct"], ".1f", "%"),
                        _fmt(v.get("ratio_to_ideal"), ".3f", "x"), _fmt(v.get("ratio_to_bound"), ".3f", "x"),
                        _fmt(v.get("speedup_over_naive"), ".2f", "x"), _identical(v), *counter_cells(v.get("cupti"))])
    return out


def render(cases) -> str:
    """The Markdown table of every case and variant."""
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + " --- |" * len(COLUMNS)]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows(cases)]
    return "\n".join(lines)
