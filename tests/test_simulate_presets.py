"""pump simulate's GPU presets (--gpu, --link-gbps), kernel times at achieved fractions of peak,
the range of the unmeasured constants, capacity planning (--sweep), and the bound compared
with the mean step: pump/simulate/constants.py, engine.py, workload.py, report.py, sweep.py."""

import json
import re
import subprocess
import sys

import numpy as np
import pytest

from pump.simulate import constants as K
from pump.simulate import bound, engine, report, sweep, workload
from synthetic_trace import MIB, training_trace

# The host link each preset's datasheet states: PCIe generation, and GB/s each way of x16.
LINKS = {"h100-pcie": (5, 63.0), "h100-sxm": (5, 63.0), "h200": (5, 63.0), "a100-40gb": (4, 31.5),
         "a100-80gb": (4, 31.5), "l4": (4, 31.5), "v100": (3, 15.75)}


def _pump(*args):
    return subprocess.run([sys.executable, "-m", "pump.cli", "simulate", *args], capture_output=True, text=True)


@pytest.fixture(scope="module")
def trace_path(tmp_path_factory):
    t, _, _ = training_trace(steps=6, layers=6)
    return t.write(str(tmp_path_factory.mktemp("presets") / "t.trace"))


@pytest.fixture(scope="module")
def small(trace_path):
    return workload.load(trace_path, batch_launches=5)


def test_the_presets_are_the_ones_named_and_h100_pcie_is_the_default():
    assert tuple(K.GPU_PRESETS) == tuple(LINKS) and K.DEFAULT_GPU == "h100-pcie"
    assert engine.h100().gpu is K.GPU_PRESETS["h100-pcie"]


@pytest.mark.parametrize("name", sorted(LINKS))
def test_each_preset_is_sane_and_sourced(name):
    g = K.GPU_PRESETS[name]
    assert g.name == name
    # Dense figures: the tensor cores beat the FP32 units, and nothing is at sparse rates.
    assert 10e12 <= g.fp32_flops <= 70e12 and g.fp32_flops < g.bf16_flops <= 1000e12
    assert g.tf32_flops == 0 if name == "v100" else g.fp32_flops < g.tf32_flops < g.bf16_flops
    assert g.conv_flops() == (g.fp32_flops if name == "v100" else g.tf32_flops)
    assert 16e9 <= g.memory_bytes <= 150e9 and 250e9 <= g.memory_bytes_per_s <= 5e12
    assert (g.memory_kind == "GDDR6") == (name == "l4")
    generation, gbps = LINKS[name]
    assert g.pcie_generation == generation and g.pcie_lanes == 16
    assert g.link_bytes_per_s == pytest.approx(gbps * 1e9, rel=1e-3)
    # Its source is one the module's docstring cites, with the document's edition or version.
    tag = re.match(r"\[[\w-]+\]", g.source).group(0)
    entry = K.__doc__[K.__doc__.index(f"  {tag}"):]
    assert re.search(r"20\d\d", entry.split("\n  [")[0])
    # The fault path no datasheet gives: one, shared, and said why in constants.py.
    assert g.fault_path is K.FAULT_PATH


def test_achieved_fractions_are_below_peak_and_sourced():
    assert set(K.ACHIEVED) == set(workload.KINDS)
    for kind, a in K.ACHIEVED.items():
        assert 0 < a.compute < 1 and 0 < a.memory < 1 and a.source.startswith("["), kind


def test_op_kinds_follow_the_aten_names():
    assert workload.op_kind("aten.convolution_backward.default") == "conv"
    assert workload.op_kind("aten.addmm.default") == workload.op_kind("aten.bmm.default") == "matmul"
    assert workload.op_kind("aten.native_layer_norm_backward.default") == "normalization"
    assert workload.op_kind("aten._foreach_addcdiv_.ScalarList") == "elementwise"
    assert workload.op_kind("") == "elementwise"


def test_kernel_seconds_on_a_preset():
    a100, v100 = K.GPU_PRESETS["a100-40gb"], K.GPU_PRESETS["v100"]
    flops = 1e12
    conv = workload.kernel_seconds(flops, 0, "conv", a100)
    assert conv == pytest.approx(flops / (a100.tf32_flops * K.ACHIEVED["conv"].compute))
    # No TF32 on a V100: its convolutions run on the FP32 units.
    assert workload.kernel_seconds(flops, 0, "conv", v100) == pytest.approx(
        flops / (v100.fp32_flops * K.ACHIEVED["conv"].compute))
    mm = workload.kernel_seconds(flops, 0, "matmul", a100)
    assert mm > flops / a100.fp32_flops and mm > conv      # below peak; fp32 matmuls skip TF32
    memory = workload.kernel_seconds(0, 1e9, "elementwise", a100)
    assert memory == pytest.approx(1e9 / (a100.memory_bytes_per_s * K.ACHIEVED["elementwise"].memory))


def test_an_override_table_replaces_the_model_per_launch(small):
    gpu = K.GPU_PRESETS["a100-40gb"]
    modelled = small.kernel_seconds(gpu)
    table = np.full(small.launches, np.nan)
    table[3] = 0.25
    small.override_seconds = table
    try:
        seconds = small.kernel_seconds(gpu)
    finally:
        small.override_seconds = None
    assert seconds[3] == 0.25 and np.array_equal(np.delete(seconds, 3), np.delete(modelled, 3))


def test_a_slower_card_is_slower(small):
    cap = small.peak_footprint // 2
    t = {g: engine.run(small, "lookahead", cap, engine.gpu_model(g)).step_mean_seconds for g in ("h100-sxm", "v100")}
    assert t["h100-sxm"] < t["v100"]


def test_the_range_is_line_rate_full_duplex_down_to_the_measured_rate_half_duplex(small):
    cases = dict(engine.range_models("a100-40gb"))
    best, worst = cases["best"], cases["worst"]
    line = K.GPU_PRESETS["a100-40gb"].link_bytes_per_s
    assert best.bandwidth == best.link_bytes_per_s == line and best.full_duplex       # the ceiling
    assert worst.bandwidth == pytest.approx(line * K.H2D_WORST_FRACTION) and not worst.full_duplex
    assert worst.d2h_rate == pytest.approx(line * K.D2H_WORST_FRACTION) and best.d2h_rate == line
    assert worst.link_bytes_per_s == line                  # the driver's evictions: the line rate
    assert engine.gpu_model("a100-40gb", prefetch=2 * line).bandwidth == line    # never above the line
    cap = small.peak_footprint // 2
    for policy in ("launch", "lookahead"):
        b, w = (engine.run(small, policy, cap, m).step_mean_seconds for m in (best, worst))
        assert b <= w, policy
    # Half duplex alone never helps.
    full = engine.gpu_model("a100-40gb", prefetch=line / 2)
    half = engine.gpu_model("a100-40gb", prefetch=line / 2, full_duplex=False)
    assert engine.run(small, "launch", cap, full).step_mean_seconds <= engine.run(small, "launch", cap, half).step_mean_seconds


def test_cli_reports_both_cases(trace_path):
    p = _pump(trace_path, "--capacity", "50%", "--gpu", "l4", "--json")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["gpu"] == "l4" and set(doc["cases"]) == {"best", "worst"}
    best, worst = doc["cases"]["best"], doc["cases"]["worst"]
    assert best["bandwidth_bytes_per_s"] == doc["bandwidth_bytes_per_s"] == doc["link_bytes_per_s"]
    assert worst["bandwidth_bytes_per_s"] < best["bandwidth_bytes_per_s"]
    assert best["lower_bound_seconds"] <= worst["lower_bound_seconds"]
    assert best["policies"]["lookahead"]["step_mean_seconds"] <= worst["policies"]["lookahead"]["step_mean_seconds"]
    text = _pump(trace_path, "--capacity", "50%", "--gpu", "l4")
    assert "  best: 31.5 GB/s in, 31.5 out, full duplex" in text.stdout
    assert "  worst: 17.5 GB/s in, 5.6 out, half duplex" in text.stdout


@pytest.mark.parametrize("option", ["--link-gbps", "--bandwidth"])
def test_link_gbps_overrides_the_line_rate(trace_path, option):
    p = _pump(trace_path, "--capacity", "50%", "--gpu", "v100", option, "8", "--json", "--policy", "launch")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["link_bytes_per_s"] == doc["cases"]["best"]["bandwidth_bytes_per_s"] == 8e9
    assert doc["cases"]["worst"]["bandwidth_bytes_per_s"] == pytest.approx(8e9 * K.H2D_WORST_FRACTION)


@pytest.mark.parametrize("args, message", [
    (["--capacity", "1G", "--gpu", "b200"],
     "argument --gpu: invalid choice: 'b200' (choose from " + ", ".join(f"'{g}'" for g in [*LINKS, "fakecuda"]) + ")"),
    (["--capacity", "1G", "--gpu", "l4", "--model", "fakecuda"], "--model fakecuda is --gpu fakecuda, not --gpu l4"),
    (["--capacity", "1G", "--gpu", "l4", "--model", "h100"], "--model h100 is --gpu h100-pcie, not --gpu l4"),
    ([], "give --capacity SIZE (or --sweep, which tries every capacity)"),
    (["--sweep", "--gpu", "fakecuda"], "--sweep plans for a GPU's memory; --gpu fakecuda has none"),
    (["--sweep", "--model", "fakecuda"], "--model fakecuda is spelt --gpu fakecuda now"),
    (["--capacity", "1G", "--reserve", "1G"], "--reserve is --sweep's: give both"),
    (["--sweep", "--reserve", "lots"], "allowed: bytes, or a size like 8GiB"),
    (["--capacity", "1G", "--link-gbps", "0"], "GB/s as a number > 0"),
    (["--capacity", "50GB", "--gpu", "l4"],
     "--capacity 50GB is 50.0 GB, more than the l4's 24 GB: the capacity is the GPU memory the job may use"),
])
def test_bad_combinations_say_what_is_wrong(trace_path, args, message):
    p = _pump(trace_path, *args)
    assert p.returncode == 2 and message in p.stderr and p.stdout == ""


def test_model_h100_is_the_h100_pcie_preset(trace_path):
    docs = [json.loads(_pump(trace_path, "--capacity", "50%", "--json", "--policy", "launch", *extra).stdout)
            for extra in ((), ("--model", "h100"), ("--gpu", "h100-pcie"))]
    assert docs[0]["policies"] == docs[1]["policies"] == docs[2]["policies"] and docs[0]["gpu"] == "h100-pcie"


@pytest.mark.parametrize("share", [0.375, 0.5, 0.75])
def test_the_bound_holds_for_the_mean_step_and_is_compared_with_it(small, share):
    cap = int(small.peak_footprint * share)
    for case, model in engine.range_models("a100-40gb"):
        doc = report.simulate(small, cap, model)
        lb = doc["lower_bound_seconds"]
        assert lb == bound.lower_bound(small, cap, model)["lower_bound_seconds"]
        for policy, d in doc["policies"].items():
            assert d["ratio_to_lower_bound"] == pytest.approx(d["step_mean_seconds"] / lb)
            if policy != "ideal":
                assert d["step_mean_seconds"] >= lb * (1 - 1e-9), (case, policy)
        # Without the bound (scripts/sim-vs-gpu): the same steps, no bound's keys, no ratio to it.
        alone = report.simulate(small, cap, model, bound=False)
        assert "lower_bound_seconds" not in alone
        assert {p: d["step_mean_seconds"] for p, d in alone["policies"].items()} == \
            {p: d["step_mean_seconds"] for p, d in doc["policies"].items()}
        assert all(d["ratio_to_lower_bound"] is None for d in alone["policies"].values())


def test_sweep_answers_the_planning_question_in_one_line(small, trace_path):
    cases = engine.range_models("l4")
    doc = sweep.sweep(small, cases)
    best = doc["cases"]["best"]
    within = best["smallest_capacity_bytes"]
    # pump's own calls cost the launching thread (pump/simulate/host.py): on this small trace's 2 ms
    # steps, read 5 launches at a time, lookahead stays 14% above the unlimited-memory step even
    # where everything fits (its plan keeps room for transfers in flight, so it still evicts).
    assert set(within) == {"10%", "25%"} and within["25%"] is not None
    for tolerance, capacity in within.items():
        limit = best["ideal_seconds"] * (1 + float(tolerance[:-1]) / 100)
        if capacity is None:
            assert engine.run(small, "lookahead", small.peak_footprint, cases[0][1]).step_mean_seconds > limit
            continue
        assert engine.run(small, "lookahead", capacity, cases[0][1]).step_mean_seconds <= limit
        lower = max(1, capacity - int(sweep.REFINE_SHARE * small.peak_footprint) - 2 * MIB)
        assert engine.run(small, "lookahead", lower, cases[0][1]).step_mean_seconds > limit, tolerance
    assert doc["card_capacity_bytes"] == K.GPU_PRESETS["l4"].memory_bytes - K.RESERVE_BYTES
    p = _pump(trace_path, "--sweep", "--gpu", "l4", "--reserve", "512M")
    assert p.returncode == 0, p.stderr
    answer = [line for line in p.stdout.splitlines() if line.startswith("lookahead's step (")]
    assert len(answer) == 1 and "within 10% from " in answer[0] and "within 25% from " in answer[0]
    assert "on the l4's 22.4 GiB less a 512.0 MiB reserve" in answer[0]
    assert "the footprint fits: no oversubscription" in answer[0]
    # It leads with the answer a user acts on: one amount, then the worst case's, then the card.
    cli_doc = json.loads(_pump(trace_path, "--sweep", "--gpu", "l4", "--reserve", "512M", "--json").stdout)
    best, worst = (cli_doc["cases"][c]["smallest_capacity_bytes"]["10%"] for c in ("best", "worst"))
    first = p.stdout.splitlines()[0]
    assert first.startswith(f"synthetic needs at least {report._size(best)} of GPU memory "
                            "(a step within 10% of its step with unlimited memory, under lookahead); "
                            f"{report._size(worst)} if the link is as slow as the worst case. "), first
    assert first.endswith("The l4 has 21.9 GiB for it (512.0 MiB reserved): enough. " + sweep.likely_case()), first


def test_which_end_of_the_range_the_measured_machines_are_near():
    """The answer names the end of the range the machines measured so far are near (issue 46
    item 4), from pump's own GPU runs: constants.MEASURED_LINKS holds each run's probes as its
    preflight.json has them (overlap under 0.5: the two directions take turns)."""
    import pathlib
    results = pathlib.Path(__file__).resolve().parents[1] / "bench" / "results"
    for machine, folder, h2d, d2h, full_duplex in K.MEASURED_LINKS:
        probes = json.loads((results / folder / "preflight.json").read_text())["probes"]
        rates = probes["prefetch_bandwidth"]["result"]
        assert rates["device"] == machine
        assert (round(rates["h2d_bytes_per_s"] / 1e7), round(rates["d2h_bytes_per_s"] / 1e7)) == \
            (round(h2d / 1e7), round(d2h / 1e7))
        moves = probes.get("concurrent_moves")
        assert full_duplex == (None if moves is None else moves["result"]["overlap"] >= 0.5)
    assert [K.nearer_worst(*m[2:]) for m in K.MEASURED_LINKS] == [True] * 4
    line = K.PCIE5_X16_BYTES_PER_S
    assert not K.nearer_worst(0.95 * line, 0.9 * line, True) and K.nearer_worst(0.95 * line, 0.9 * line, False)
    assert sweep.likely_case().endswith("the two directions taking turns: nearer the worst case (4 of 4 runs).")


def test_ideal_is_not_compared_with_the_bound(trace_path):
    """The bound is on a step within the capacity; ideal's memory is unlimited, so "0.09x bound"
    would read as beating a bound."""
    p = _pump(trace_path, "--capacity", "40%", "--gpu", "l4")
    assert p.returncode == 0, p.stderr
    ideal_row = [line for line in p.stdout.splitlines() if line.startswith("ideal ")]
    assert len(ideal_row) == 1 and ideal_row[0].split()[4] == "-", ideal_row
    cases = [line for line in p.stdout.splitlines() if line.startswith(("  best:", "  worst:"))]
    assert len(cases) == 2 and all(" ms (unlimited memory), naive " in line for line in cases), cases


def test_sweep_json_and_plot(trace_path, tmp_path):
    png = tmp_path / "s.png"
    p = _pump(trace_path, "--sweep", "--gpu", "v100", "--json", "--plot", str(png), "--capacity", "50%")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert set(doc["sweep"]["step_ms"]) == set(engine.POLICIES) and len(doc["sweep"]["capacities"]) == 7
    assert png.stat().st_size > 1000 and doc["plot"] == str(png)


def test_the_docs_table_of_presets_is_the_constants():
    import pathlib
    doc = (pathlib.Path(__file__).parent.parent / "docs" / "simulate.md").read_text()
    doc = doc[doc.index("## GPU presets"):doc.index("**Kernel times.**")]
    rows = {m.group(1): m.group(2) for m in re.finditer(r"^\| `([\w-]+)` \| (.*) \|$", doc, re.M)}
    del rows["--gpu"]                   # the header
    assert set(rows) == set(K.GPU_PRESETS)
    for name, row in rows.items():
        g = K.GPU_PRESETS[name]
        card, fp32, tf32, memory, link = row.split(" | ")
        assert fp32 == f"{g.fp32_flops / 1e12:g} TFLOPS"
        assert tf32 == ("none" if not g.tf32_flops else f"{g.tf32_flops / 1e12:g} TFLOPS")
        assert memory.startswith(f"{g.memory_bytes / 1e9:g} GB {g.memory_kind}, ")
        gen, lanes, gbps = re.fullmatch(r"PCIe Gen(\d) x(\d+), ([\d.]+) GB/s", link).groups()
        assert (int(gen), int(lanes)) == (g.pcie_generation, g.pcie_lanes)
        assert float(gbps) == pytest.approx(g.link_bytes_per_s / 1e9, rel=2e-3)


def test_bench_sim_runs_each_preset_named_and_prints_means_and_medians(trace_path, tmp_path):
    import pathlib
    script = pathlib.Path(__file__).parent.parent / "scripts" / "bench-sim"
    p = subprocess.run([sys.executable, str(script), "--no-plot", "--gpu", "v100", "--gpu", "l4",
                        "--results", str(tmp_path), trace_path], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert "NVIDIA V100 PCIe 32 GB" in p.stdout and "NVIDIA L4 24 GB" in p.stdout and "lookahead median ms" in p.stdout
    summary = json.loads((tmp_path / "sim-summary.json").read_text())
    assert set(summary["gpus"]) == {"v100", "l4"} and (tmp_path / "sim-l4-t.json").exists()
    row = summary["gpus"]["v100"]["traces"]["t"]
    for case in ("best", "worst"):
        c = row[case]
        assert c["lookahead_over_lower_bound"] == pytest.approx(c["step_mean_seconds"]["lookahead"]
                                                                / c["lower_bound_seconds"])
        assert set(c["step_median_seconds"]) == set(c["step_mean_seconds"]) == set(engine.POLICIES)


def test_the_docs_every_preset_table_is_the_committed_bench_sim_summary():
    """docs/benchmarks.md's table over every preset is bench/results/sim-summary.json's spans:
    launch's speed-up over naive and lookahead's mean over the bound, over the four traces and
    both cases."""
    import pathlib

    from helpers import markdown_table
    root = pathlib.Path(__file__).parent.parent
    summary = json.loads((root / "bench" / "results" / "sim-summary.json").read_text())["gpus"]
    table = markdown_table(root / "docs" / "benchmarks.md", "| preset | naive / launch | lookahead / bound |")
    assert [row[0] for row in table] == [f"`{gpu}`" for gpu in summary]
    for (_, speedup, over_bound), traces in zip(table, summary.values()):
        cases = [case for t in traces["traces"].values() for case in (t["best"], t["worst"])]

        def span(key):
            return f"{min(c[key] for c in cases):.2f}–{max(c[key] for c in cases):.2f}x"
        assert (speedup, over_bound) == (span("launch_speedup_over_naive"), span("lookahead_over_lower_bound"))


@pytest.mark.parametrize("nth, gpu", [(0, "h100-pcie"), (1, "a100-40gb")])
def test_the_docs_per_model_tables_are_the_committed_bench_sim_summary(nth, gpu):
    """docs/benchmarks.md's tables for the H100 PCIe and the A100 40 GB are
    bench/results/sim-summary.json's figures: mean steps best-worst, bound, ideal, ratios."""
    import pathlib

    from helpers import markdown_table
    root = pathlib.Path(__file__).parent.parent
    traces = json.loads((root / "bench" / "results" / "sim-summary.json").read_text())["gpus"][gpu]["traces"]
    header = ("| model | footprint | naive | launch | lookahead | lower bound | ideal | naive / launch "
              "| lookahead / bound | lookahead median |")
    table = markdown_table(root / "docs" / "benchmarks.md", header, nth)

    def span(best, worst, fmt, unit):
        lo, hi = sorted((best, worst))
        return f"{lo:{fmt}}–{hi:{fmt}}{unit}"
    assert [row[0] for row in table] == list(traces)
    for row, t in zip(table, traces.values()):
        b, w = t["best"], t["worst"]
        ms = [span(b["step_mean_seconds"][p] * 1e3, w["step_mean_seconds"][p] * 1e3, ".0f", " ms")
              for p in ("launch", "lookahead")]
        assert row[1:] == [f"{t['footprint_bytes'] / 2**30:.2f} GiB", f"{b['step_mean_seconds']['naive'] * 1e3:.0f} ms",
                           *ms, span(b["lower_bound_seconds"] * 1e3, w["lower_bound_seconds"] * 1e3, ".0f", " ms"),
                           f"{b['ideal_seconds'] * 1e3:.0f} ms",
                           span(b["launch_speedup_over_naive"], w["launch_speedup_over_naive"], ".2f", "x"),
                           span(b["lookahead_over_lower_bound"], w["lookahead_over_lower_bound"], ".2f", "x"),
                           span(b["step_median_seconds"]["lookahead"] * 1e3,
                                w["step_median_seconds"]["lookahead"] * 1e3, ".0f", " ms")]
