"""The GPU benchmark suite's logic without a GPU: the free-memory refusal, sizes and variants,
output parsing and the bit-identity check, the table's arithmetic, the lower bound's bytes that
must move (against pump's own bound), scripts/gpu-check's
refusals (the CUPTI injection library: test_bench_gpu_cupti.py), and the suite's cuda-python programs and the whole suite on fakecuda."""

import json
import os
import pathlib
import subprocess
import sys
import types

import pytest

from helpers import PUMP_RUN, clean_env
from synthetic_trace import TraceBuilder

ROOT = pathlib.Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench" / "gpu"
sys.path.insert(0, str(BENCH))
import cupti  # noqa: E402
import lowerbound  # noqa: E402
import membudget  # noqa: E402
import suite  # noqa: E402
import table  # noqa: E402
from pump.simulate import bound, engine, workload  # noqa: E402

GiB, MiB = membudget.GiB, membudget.MiB


# ---------------------------------------------------------------- the free-memory rule
def test_margin_is_the_larger_of_2_GiB_and_5_percent():
    assert membudget.margin(16 * GiB) == 2 * GiB
    assert membudget.margin(140 * GiB) == 7 * GiB
    assert membudget.allowed(10 * GiB, 16 * GiB) == 8 * GiB
    assert membudget.allowed(1 * GiB, 16 * GiB) == 0


def test_check_refuses_loudly_past_free_memory_less_the_margin():
    membudget.check("a case", 8 * GiB, 10 * GiB, 16 * GiB)  # exactly the limit: allowed
    with pytest.raises(membudget.Refused) as exc:
        membudget.check("case b", 8 * GiB + 1, 10 * GiB, 16 * GiB)
    text = str(exc.value)
    assert text.startswith("REFUSED case b") and "10.00 GiB free" in text and "at most 8.00 GiB" in text
    with pytest.raises(ValueError):
        membudget.check("x", -1, 10 * GiB, 16 * GiB)


def test_plan_chain_refuses_a_working_set_the_card_cannot_hold():
    with pytest.raises(membudget.Refused, match="REFUSED case a"):
        suite.plan_chain("a", 1.0, 2 * GiB + 512 * MiB, 16 * GiB)      # 1 GiB asked, 0.5 GiB allowed
    case = suite.plan_chain("b", 1.0, 40 * GiB, 80 * GiB)
    assert case.emulated and case.capacity == 512 * MiB                  # half of 8 x 128 MiB
    assert [v.name for v in case.variants] == ["ideal", "naive", "launch", "lookahead"]
    naive = case.variants[1].pump
    assert naive[:2] == ["--policy", "off"] and naive[naive.index("--budget") + 1] == str(512 * MiB)
    assert naive[naive.index("--capacity") + 1] == str(membudget.allowed(40 * GiB, 80 * GiB))
    assert case.variants[0].pump is None and case.variants[0].memory == "device"
    fits = suite.plan_chain("a", 0.5, 40 * GiB, 80 * GiB)
    assert not fits.emulated and fits.variants[1].pump is None and "--mib" in fits.program
    assert fits.program[fits.program.index("--mib") + 1] == "64"


def test_variants_keep_the_reference_and_name_what_a_case_lacks():
    """--variants: a short device call's open question (docs/gpu-check.md), with the reference."""
    program = suite.gpt_args(1.0, "train.py")
    c = suite.plan_gpt("c", program, 10 * GiB, 40 * GiB, 80 * GiB)
    args = suite.parse_args(["--cases", "c", "--variants", "launch-no-discards,launch-poison"])
    suite.only_variants(c, args.variants)
    assert [v.name for v in c.variants] == ["ideal", "launch-no-discards", "launch-poison"]
    c.result = {"variants": {v.name: {"step_ms": {"median": 90.0}} for v in c.variants}}
    assert "left out launch" in suite.Suite.bound(None, c, {"h2d_bytes_per_s": 5e10})["error"]
    with pytest.raises(RuntimeError, match="case c has no launch-poisson; its variants with pump: naive, launch"):
        suite.only_variants(suite.plan_gpt("c", program, 10 * GiB, 40 * GiB, 80 * GiB), ["launch-poisson"])
    unchanged = suite.plan_gpt("c", program, 10 * GiB, 40 * GiB, 80 * GiB)
    names = [v.name for v in unchanged.variants]
    suite.only_variants(unchanged, suite.parse_args(["--cases", "c"]).variants)
    assert [v.name for v in unchanged.variants] == names


def test_plan_gpt_sizes_the_budget_from_the_peak_and_refuses_past_free():
    program = suite.gpt_args(1.0, "train.py")
    c = suite.plan_gpt("c", program, 10 * GiB + 3, 40 * GiB, 80 * GiB)
    assert c.capacity == 5 * GiB and c.capacity % suite.BLOCK == 0
    last = c.variants[-1]   # lookahead discarding the dead tensors placement keeps, with a config pump-run accepts
    assert last.name == "lookahead-held-discards" and last.pump[:2] == ["--policy", "lookahead"]
    config = last.pump[last.pump.index("--config") + 1]
    assert "held_discards = true" in pathlib.Path(config).read_text()
    assert subprocess.run([sys.executable, "-m", "pump.cli", "config", "check", config], capture_output=True,
                          text=True).returncode == 0
    names = c.variants[-2]   # lookahead on PyTorch's caching allocator's named tensors
    assert names.name == "lookahead-names" and names.pump[:2] == ["--policy", "lookahead"]
    config = names.pump[names.pump.index("--config") + 1]
    assert "torch_names = true" in pathlib.Path(config).read_text()
    assert subprocess.run([sys.executable, "-m", "pump.cli", "config", "check", config], capture_output=True,
                          text=True).returncode == 0
    no_ahead = c.variants[-3]   # the launch rule making its own room, beside launch's room made ahead
    assert no_ahead.name == "launch-no-ahead" and no_ahead.pump[:2] == ["--policy", "launch"]
    config = no_ahead.pump[no_ahead.pump.index("--config") + 1]
    assert "evict_ahead = false" in pathlib.Path(config).read_text()
    assert subprocess.run([sys.executable, "-m", "pump.cli", "config", "check", config], capture_output=True,
                          text=True).returncode == 0
    # the launch rule keeping dead tensors (it discards them by default), and poisoning them instead
    for variant, setting in zip(c.variants[-5:-3], ("torch_discards = false", 'torch_discards = "poison"')):
        assert variant.name in ("launch-no-discards", "launch-poison") and variant.pump[:2] == ["--policy", "launch"]
        config = variant.pump[variant.pump.index("--config") + 1]
        assert setting in pathlib.Path(config).read_text()
        assert subprocess.run([sys.executable, "-m", "pump.cli", "config", "check", config], capture_output=True,
                              text=True).returncode == 0
    assert [v.name for v in c.variants[-5:-3]] == ["launch-no-discards", "launch-poison"]
    assert suite.plan_gpt("d", program, GiB, 40 * GiB, 80 * GiB).variants[1].pump == []
    assert suite.plan_gpt("e", program, GiB, 40 * GiB, 80 * GiB).variants[1].pump == ["--no-managed-all"]
    with pytest.raises(membudget.Refused, match=r"REFUSED case c .*x 1.5"):
        suite.plan_gpt("c", program, 30 * GiB, 40 * GiB, 80 * GiB)       # 45 GiB asked, 36 allowed


def test_commands_put_pump_run_options_before_the_program():
    case = suite.plan_chain("b", 0.01, 40 * GiB, 80 * GiB)
    argv = suite.command(case, case.variants[2], 2, 10, stats="s.json", trace="t.trace")
    sep = argv.index("--")
    assert argv[0].endswith("pump-run") and argv[1:3] == ["--policy", "launch"]
    assert argv[sep - 4:sep] == ["--stats", "s.json", "--trace", "t.trace"]
    assert argv[sep + 1:][-6:] == ["--warmup", "2", "--steps", "10", "--memory", "managed"]
    assert suite.command(case, case.variants[0], 0, 3)[-2:] == ["--memory", "device"]


def test_suite_arguments_are_checked():
    for bad in (["--cases", "ax"], ["--cases", ""], ["--scale", "0"], ["--budget-seconds", "5"]):
        with pytest.raises(SystemExit):
            suite.parse_args(bad)
    assert suite.parse_args(["--cases", "ca"]).cases == "ca"


# ---------------------------------------------------------------- outputs and identity
def test_parse_output_and_timed_steps():
    out = "noise\n" + "\n".join(json.dumps({"step": i, "ms": 10.0 + i, "loss_hex": f"{i:x}"}) for i in range(5))
    out += "\n{bad json\n" + json.dumps({"steps": 3, "checksum_hex": "aa"}) + "\n"
    steps, final, docs = suite.parse_output(out)
    assert len(steps) == 5 and final == {"steps": 3, "checksum_hex": "aa"} and len(docs) == 6
    assert suite.timed_ms(steps, 2, 3) == [12.0, 13.0, 14.0]        # the warm-up steps were printed
    assert suite.timed_ms(steps[:3], 2, 3) == [10.0, 11.0, 12.0]    # they were not
    marked = [dict(s, warmup=s["step"] < 1) for s in steps]
    assert suite.timed_ms(marked, 1, 10) == [11.0, 12.0, 13.0, 14.0]


def test_compare_finds_the_first_differing_loss_and_the_checksum():
    ref = {"steps": [{"loss_hex": "a"}, {"loss_hex": "b"}], "final": {"checksum_hex": "c" * 64}}
    assert suite.compare(ref, ref) == (True, None)
    other = {"steps": [{"loss_hex": "a"}, {"loss_hex": "x"}], "final": {"checksum_hex": "c" * 64}}
    assert suite.compare(ref, other) == (False, "step 1: loss x where the reference has b")
    short = {"steps": ref["steps"][:1], "final": ref["final"]}
    assert suite.compare(ref, short)[0] is False
    bad_sum = {"steps": ref["steps"], "final": {"checksum_hex": "d" * 64}}
    assert suite.compare(ref, bad_sum)[0] is False
    assert suite.compare(ref, {"steps": [], "final": None}) == (None, "no checksum to compare")


# ---------------------------------------------------------------- the table
def test_summarize_gives_median_and_quartiles():
    s = table.summarize([4, 1, 3, 2, 100])
    assert (s["median"], s["q1"], s["q3"], s["min"], s["max"], s["n"]) == (3, 2, 4, 1, 100, 5)
    assert s["iqr_pct"] == pytest.approx(200 / 3)
    assert table.summarize([7])["iqr_pct"] == 0.0
    with pytest.raises(ValueError):
        table.summarize([])


def test_lower_bound_is_the_larger_of_compute_and_transfer():
    b = table.lower_bound(0.010, 2e9, 50e9)
    assert b["seconds"] == pytest.approx(0.040) and b["limited_by"] == "transfer"
    assert table.lower_bound(0.1, 2e9, 50e9)["limited_by"] == "compute"
    with pytest.raises(ValueError):
        table.lower_bound(0.1, 1, 0)


def test_ratios_and_rendered_rows():
    case = {"case": "b", "emulated": True, "lower_bound": {"seconds": 0.05},
            "variants": {"ideal": {"step_ms": table.summarize([40])}, "naive": {"step_ms": table.summarize([400])},
                         "launch": {"step_ms": table.summarize([100]), "identical": True,
                                    "cupti": {"counters": {"bytes_h2d": 3e9, "gpu_page_faults": 12},
                                              "bytes_h2d_by_cause": {"prefetch": 2e9, "user": 0}}},
                         "lookahead": {"error": "exit status 1: boom"},
                         "late": {"skipped": "not run: 3 s left of the suite's budget"}}}
    table.add_ratios(case)
    launch = case["variants"]["launch"]
    assert launch["ratio_to_ideal"] == pytest.approx(2.5) and launch["ratio_to_bound"] == pytest.approx(2.0)
    assert launch["speedup_over_naive"] == pytest.approx(4.0)
    text = table.render([case, {"case": "c", "refused": "REFUSED case c: too big"}])
    assert "| b (emulated) | launch | 100.00 | 0.0% | 2.500x | 2.000x | 4.00x | yes | 3.00 | - | 12 | prefetch 2.00 |" in text
    assert "| b (emulated) | lookahead | ERROR: exit status 1: boom |" in text
    assert "| c | - | REFUSED case c: too big |" in text
    assert "| b (emulated) | late | not run: 3 s left of the suite's budget |" in text


def test_an_emulated_run_with_memory_pump_could_not_move_is_not_a_result():
    """The H200's lookahead in case c ran at ideal's speed under a 3.6 GiB emulated capacity
    because 151 allocations the driver would not prefetch stayed on the GPU beside pump's share:
    such a run shows no time, ratio or speed-up, and says why."""
    assert suite.outside_emulation({"prefetch_refusals": 0}) is None and suite.outside_emulation({}) is None
    why = suite.outside_emulation({"prefetch_refusals": 151})
    assert why.startswith("not a result: 151 allocation(s)")
    case = {"case": "c", "emulated": True,
            "variants": {"ideal": {"step_ms": table.summarize([92])}, "naive": {"step_ms": table.summarize([2370])},
                         "lookahead": {"step_ms": table.summarize([93]), "not_a_result": why}}}
    table.add_ratios(case)
    assert "speedup_over_naive" not in case["variants"]["lookahead"]
    assert f"| c (emulated) | lookahead | {why} |" in table.render([case])


# ---------------------------------------------------------------- bytes that must move
def chain_trace(path, pairs=2, block_bytes=2 * MiB, steps=8):
    """A chain like chain.py's --repeat 1: per step, per pair, saxpy(x, y) then scale(y)."""
    t = TraceBuilder()
    xs = [t.alloc(block_bytes) for _ in range(pairs)]
    ys = [t.alloc(block_bytes) for _ in range(pairs)]
    for s in range(steps):
        t.step(s)
        for x, y in zip(xs, ys):
            t.launch(1, [x, y])
            t.launch(2, [y])
    t.write(path)
    return xs, ys


def test_must_move_without_host_writes_is_pumps_bound(tmp_path):
    from synthetic_trace import training_trace
    path = tmp_path / "train.trace"
    training_trace(steps=6)[0].write(path)
    w = workload.load(str(path))
    for capacity in (16 * MiB, 48 * MiB, 96 * MiB):
        expected = bound.lower_bound(w, capacity, engine.h100())["must_move_bytes"]
        assert lowerbound.must_move(str(path), capacity)["must_move_bytes"] == pytest.approx(expected, abs=1)


def test_host_written_blocks_come_over_every_step(tmp_path):
    path = tmp_path / "chain.trace"
    xs, _ = chain_trace(path)
    written = [(x, 2 * MiB) for x in xs]
    everything = lowerbound.must_move(str(path), 64 * MiB, written)
    assert everything["host_written_blocks"] == 2 and everything["must_move_bytes"] == 4 * MiB
    assert lowerbound.must_move(str(path), 64 * MiB)["must_move_bytes"] == 0
    # Half the working set (2 of 4 blocks): per step both x and one y come over (worked by hand:
    # MIN keeps the y used first next step beside the fresh x it is paired with), less at most one
    # block over the CYCLES played, for what the GPU may hold before them.
    half = lowerbound.must_move(str(path), 4 * MiB, written)["must_move_bytes"]
    assert 6 * MiB - 2 * MiB / bound.CYCLES <= half <= 6 * MiB


def test_suite_bound_takes_compute_from_ideal_and_bytes_from_the_trace(tmp_path):
    xs, ys = chain_trace(tmp_path / "b.trace")
    runner = suite.Suite(suite.parse_args(["--work", str(tmp_path)]))
    case = suite.plan_chain("b", 0.01, 40 * GiB, 80 * GiB)
    case.capacity = 4 * MiB
    case.result = {"variants": {"ideal": {"step_ms": table.summarize([30]), "host_ms": table.summarize([8]),
                                          "kernel_ms": table.summarize([2])}},
                   "trace_run": {"final": {"buffers": [{"address": a, "bytes": 2 * MiB, "host_written": a in xs}
                                                       for a in xs + ys]}}}
    b = runner.bound(case, {"h2d_bytes_per_s": 1e8})      # about 60 ms of transfer against 10 of compute
    assert b["compute_s"] == pytest.approx(0.010) and b["host_written_blocks"] == 2
    assert 6 * MiB - 2 * MiB / bound.CYCLES <= b["must_move_bytes"] <= 6 * MiB
    assert b["seconds"] == pytest.approx(b["must_move_bytes"] / 1e8) and b["limited_by"] == "transfer"
    assert "no measured prefetch bandwidth" in runner.bound(case, {"error": "x"})["error"]
    del case.result["trace_run"]
    assert "did not finish" in runner.bound(case, {"h2d_bytes_per_s": 1e9})["error"]
    fits = suite.plan_gpt("d", suite.gpt_args(1, "t.py"), GiB, 40 * GiB, 80 * GiB)
    fits.result = {"variants": {"ideal": {"step_ms": table.summarize([30])}}}
    d = runner.bound(fits, {"h2d_bytes_per_s": 1e9})
    assert d["seconds"] == pytest.approx(0.030) and d["must_move_bytes"] == 0 and d["limited_by"] == "compute"


def test_a_trace_without_an_iteration_is_refused(tmp_path):
    t = TraceBuilder()
    t.launch(1, [t.alloc(2 * MiB)])
    t.write(tmp_path / "one.trace")
    with pytest.raises(lowerbound.NoIteration, match="no iteration"):
        lowerbound.must_move(str(tmp_path / "one.trace"), 64 * MiB)


# ---------------------------------------------------------------- scripts/gpu-check
sys.path.insert(0, str(BENCH / "check"))
import common as check_common  # noqa: E402
import replaces  # noqa: E402
import stages  # noqa: E402


def test_gpu_check_without_a_gpu_refuses_and_writes_its_json(tmp_path):
    env = dict(clean_env("OUT"), PYTHONPATH=str(tmp_path))  # a pynvml that sees no GPU
    (tmp_path / "pynvml.py").write_text("def nvmlInit(): pass\ndef nvmlShutdown(): pass\n"
                                        "def nvmlDeviceGetCount(): return 0\n")
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu-check"), "preflight", "--out",
                           str(tmp_path / "out")], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    doc = json.loads((tmp_path / "out" / "preflight.json").read_text())
    assert doc["error"] == "NVML sees no GPU" and doc["passed"] is False
    assert "no GPU to check" in (tmp_path / "out" / "preflight.log").read_text()


def test_gpu_check_names_the_wheels_it_lacks(tmp_path, monkeypatch):
    monkeypatch.setattr(stages, "RUNTIME_WHEELS", {"json": "json", "no_such_module_for_pump": "no_such_wheel"})
    stage = check_common.Stage("preflight", tmp_path, 60)
    result = stages.install_wheels(stage, tmp_path)
    assert result["rc"] == 1 and "no_such_module_for_pump" in result["output"] and "json," not in result["output"]
    assert "scripts/make-wheels" in result["output"]


def test_gpu_check_reads_pytests_summary():
    tail = "sss\n=== short test summary ===\nSKIPPED [1] x\n3 passed, 2 skipped, 700 deselected in 9.1s"
    assert stages.pytest_summary(tail) == "3 passed, 2 skipped, 700 deselected in 9.1s"


def test_gpu_check_collects_only_files_with_gpu_tests():
    files = stages.gpu_test_files()
    assert "tests/test_gpu.py" in files and "tests/test_example.py" in files
    assert not any("hypothesis" in (ROOT / f).read_text() for f in files)   # the GPU machine has none


def test_replaces_lines_name_the_constant_and_the_measurement():
    probes = {"prefetch_cost": {"result": {"cases": {"resident": {"fixed_us": 31.5, "per_block_pass_us": 2.25},
                                                     "from host": {"per_moved_block_us": 12.5}}}},
              "prefetch_bandwidth": {"result": {"h2d_bytes_per_s": 50e9, "d2h_bytes_per_s": 40e9,
                                                "d2h_fault_bytes_per_s": 8e9}},
              "software": {"result": {"nvml": {"pcie_link_generation_max": 5, "pcie_link_width_max": 16}}},
              "managed": {"result": {"pool_prefetchable": False}},
              "driver_evict": {"result": {"driver_evict_bytes_per_s": 30e9, "driver_over_prefetch": 2.5}},
              "concurrent_moves": {"result": {"overlap": 0.123, "bytes_each": 512 << 20}},
              "host_calls": {"result": {"ns_per_call": {"cuEventRecord": {"median": 812.4, "min": 700.0},
                                                        "cuThreadExchangeStreamCaptureMode": {"median": 40.2},
                                                        "cuStreamIsCapturing": {"refused": 801}}}}}
    got = {r["replaces"].split()[0]: r for r in replaces.lines(probes) if "driver_evict" not in r["how"]}
    record = got["FAKECUDA_EVENT_RECORD_HOST_NS"]
    assert record["measured"] == 812 and record["now"] == 1500
    exchange = [r["measured"] for r in replaces.lines(probes) if "cuThreadExchangeStreamCaptureMode" in r["replaces"]]
    assert exchange == [40]
    assert "FAKECUDA_CAPTURE_QUERY_HOST_NS" not in got   # refused: nothing measured
    assert got["FAKECUDA_IOCTL_NS"]["measured"] == 31500 and got["FAKECUDA_IOCTL_NS"]["now"] == 4835
    assert got["FAKECUDA_BLOCK_PASS_NS"]["measured"] == 2250 and got["FAKECUDA_BLOCK_PASS_NS"]["now"] == 583
    assert got["FAKECUDA_MIGRATE_BLOCK_NS"]["measured"] == 12500 and got["FAKECUDA_MIGRATE_BLOCK_NS"]["now"] == 19575
    assert got["H2D_WORST_FRACTION"]["measured"] == pytest.approx(50e9 / 63.015e9, abs=1e-3)
    assert got["D2H_WORST_FRACTION"]["measured"] == pytest.approx(40e9 / 63.015e9, abs=1e-3)
    assert got["FAKECUDA_D2H_BYTES_PER_US"]["measured"] == 8000 and got["FAKECUDA_D2H_BYTES_PER_US"]["now"] == 25000
    assert got["fakecuda's"]["measured"] is False
    assert [(r["replaces"].split()[0], r["measured"], r["now"]) for r in replaces.lines(probes)
            if "driver_evict" in r["how"]] == [("FAKECUDA_EVICT_D2H_BYTES_PER_US", 30000, 11280)]
    assert got["pump's"]["measured"] == 0.12 and got["pump's"]["now"] == 0 and "512 MiB" in got["pump's"]["how"]
    assert replaces.lines({}) == []


def run_probe(fake_gpu, name, *args):
    env = dict(fake_gpu, PYTHONPATH=str(check_common.FAKE_NVML))   # gpu-check's dry-run NVML
    proc = subprocess.run([sys.executable, str(BENCH / "probes" / name), *map(str, args)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    (line,) = proc.stdout.splitlines()          # one line per probe
    return json.loads(line)


def test_managed_probe_on_fakecuda_records_every_call(fake_gpu):
    doc = run_probe(fake_gpu, "managed.py", "--mib", "4")
    assert doc["concurrent_managed_access"] == 1
    for memory in ("cuMemAllocManaged", "managed pool"):
        assert set(doc["results"][memory]) >= {"alloc", "prefetch to gpu", "batch prefetch to host", "discard"}
    assert doc["pool_prefetchable"] == all(v == "ok" for k, v in doc["results"]["managed pool"].items()
                                           if "prefetch" in k or k == "discard")


def prefetch_charge(f, size: int, to_host: bool) -> float:
    """Seconds fakecuda charges the calling thread for one cuMemPrefetchAsync of `size` bytes of
    whole blocks (fakecuda/cost.c): the ioctl and two passes per block, then the CPU time of
    moving the pages, or for a move to the host the longer of that and its copies' wait."""
    blocks = size // f["FAKECUDA_VA_BLOCK"]
    move = size * f["FAKECUDA_MIGRATE_BLOCK_NS"] / f["FAKECUDA_VA_BLOCK"]
    copies = size * 1e3 / f["FAKECUDA_PREFETCH_D2H_BYTES_PER_US"]
    return (f["FAKECUDA_IOCTL_NS"] + 2 * blocks * f["FAKECUDA_BLOCK_PASS_NS"] + (max(move, copies) if to_host else move)) * 1e-9


def test_prefetch_bandwidth_probe_meets_fakecuda_rates_once(fake_gpu):
    """A prefetch to the host waits for its copies inside the call, and its stream then has
    nothing left to copy: before, fakecuda took the copy's time twice (the ioctl's wait, then
    the stream's move), half its own rate. Checked on the model's own clock, exactly: the time
    charged to the probe's thread, events and synchronize included (a loaded machine moves the
    events' wall-clock readings either way: a late wake-up, or the credit for one carried into
    the next sleep). A move to the GPU charges the call alone, its copy on the stream: the events
    around it are no closer than that copy at the line rate."""
    from pump.simulate import constants
    f = constants.fakecuda_constants()
    doc = run_probe(fake_gpu, "../prefetch_bw.py", "--mib", "64", "--rounds", "2")
    size = 64 * MiB
    around = (2 * f["FAKECUDA_EVENT_RECORD_HOST_NS"] + f["FAKECUDA_SYNC_HOST_NS"]) * 1e-9
    charged = doc["fakecuda_charged_seconds"]
    assert charged["d2h"] == pytest.approx([around + prefetch_charge(f, size, True)] * 2, rel=1e-6), charged
    assert charged["h2d"] == pytest.approx([around + prefetch_charge(f, size, False)] * 2, rel=1e-6), charged
    line_in = f["FAKECUDA_H2D_BYTES_PER_US"] * 1e6
    assert all(rate <= line_in * 1.001 for rate in doc["h2d_samples"]), (doc["h2d_samples"], line_in)


def test_prefetch_cost_probe_fits_a_line_per_case(fake_gpu):
    """The probe's lines, read on the model's own clock (the time charged to the calling thread:
    on the wall clock a loaded machine's late wake-ups, and the credit for them carried into the
    next sleep, move a 1.3 ms call either way), are fakecuda's constants exactly: the ioctl and a
    pass per block, 19.6 us of CPU a block moved in, and a move to the host waits for its copies
    at the prefetch-to-host rate (fakecuda/cost.c)."""
    from pump.simulate import constants
    f = constants.fakecuda_constants()
    doc = run_probe(fake_gpu, "prefetch_cost.py", "--blocks", "1,64", "--rounds", "5")
    resident, moved_in, moved_out = (doc["cases"][c] for c in ("resident", "from host", "to host"))
    assert "per_block_pass_us" in resident and set(resident["per_size"]) == {"1", "64"}
    assert resident["fakecuda_charged"]["fixed_us"] == pytest.approx(f["FAKECUDA_IOCTL_NS"] / 1e3)
    assert resident["fakecuda_charged"]["per_block_pass_us"] == pytest.approx(f["FAKECUDA_BLOCK_PASS_NS"] / 1e3)
    assert moved_in["fakecuda_charged"]["per_moved_block_us"] == pytest.approx(f["FAKECUDA_MIGRATE_BLOCK_NS"] / 1e3)
    copy_us = f["FAKECUDA_VA_BLOCK"] / f["FAKECUDA_PREFETCH_D2H_BYTES_PER_US"]
    assert moved_out["fakecuda_charged"]["per_moved_block_us"] == pytest.approx(copy_us, rel=1e-4)
    assert resident["spent_by"] in ("calling thread on CPU", "calling thread waiting", "other threads")


def test_host_calls_probe_times_every_call(fake_gpu, tmp_path):
    doc = run_probe(fake_gpu, "host_calls.py", "--work", tmp_path, "--rounds", "3", "--per-round", "8")
    assert doc["fakecuda"] is True and doc["rounds"] == 3
    assert set(doc["ns_per_call"]) == set(replaces.HOST_CALLS) | {"cuStreamQuery"}
    for call, figure in doc["ns_per_call"].items():
        assert 0 < figure["min"] <= figure["median"], (call, figure)


def test_driver_evict_probe_reads_both_paths_back(fake_gpu):
    """fakecuda's two rates, read back through the probe on the model's own clock (the time
    charged to the probe's thread: the wall clock is a loaded machine's, either way): the driver's
    evictions copy at FAKECUDA_EVICT_D2H_BYTES_PER_US with nothing else charged, pump's prefetch
    to the host at FAKECUDA_PREFETCH_D2H_BYTES_PER_US beside the call's fixed costs: the two
    about alike, as the H100 measured them (0.96x)."""
    from pump.simulate import constants
    f = constants.fakecuda_constants()
    doc = run_probe(fake_gpu, "driver_evict.py", "--mib", "64", "--rounds", "3")
    half = 32 * MiB
    assert doc["evicted_bytes_per_round"] == [half] * 3, doc
    charged = doc["fakecuda_charged"]
    page_ns = f["FAKECUDA_PAGE"] * 1000 // f["FAKECUDA_EVICT_D2H_BYTES_PER_US"]   # migrate.c's xfer_ns, a page at a time
    driver = half / (half // f["FAKECUDA_PAGE"] * page_ns * 1e-9)
    assert charged["driver_evict_samples"] == pytest.approx([driver] * 3, rel=1e-6), (charged, driver)
    prefetch = half / (prefetch_charge(f, half, True) + f["FAKECUDA_SYNC_HOST_NS"] * 1e-9)
    assert charged["prefetch_to_host_samples"] == pytest.approx([prefetch] * 3, rel=1e-6), (charged, prefetch)
    assert 0.9 < charged["driver_over_prefetch"] < 1.1, charged
    assert all(rate > 0 for rate in doc["driver_evict_samples"] + doc["prefetch_to_host_samples"]), doc


def test_concurrent_moves_probe_reads_fakecudas_overlap_back(fake_gpu):
    """fakecuda books every prefetch's copies on one timeline, as the GPU runs measured (they
    take turns: overlap 0.05 to -0.13), so a prefetch to the GPU and one to the host made at once
    hardly overlap: only their calls' fixed costs do (0.12 here; a wide band: a loaded machine's
    late wake-ups); each alone takes at least its bytes at fakecuda's rate that way. 128 MiB
    each, 5 rounds: at 32 MiB the move in took 0.7 ms, so a millisecond's late wake-up in a
    clean-clone CI run under load made the overlap -1.57."""
    from pump.simulate import constants
    f = constants.fakecuda_constants()
    doc = run_probe(fake_gpu, "concurrent_moves.py", "--mib", "128", "--rounds", "5")
    assert len(doc["samples_seconds"]["together"]) == 5 and doc["bytes_each"] == 128 * MiB
    assert doc["out_seconds"] >= 128 * MiB / (f["FAKECUDA_PREFETCH_D2H_BYTES_PER_US"] * 1e6) * 0.95, doc
    assert doc["in_seconds"] >= 128 * MiB / (f["FAKECUDA_H2D_BYTES_PER_US"] * 1e6) * 0.95, doc
    assert doc["overlap"] < 0.4, doc


def test_host_writes_probe_times_each_state(fake_gpu):
    """Every state the probe leaves the memory in before a host write is reported (its figures
    are for a GPU: on fakecuda they are the model's)."""
    doc = run_probe(fake_gpu, "host_writes.py", "--mib", "8", "--rounds", "2")
    assert "finding" not in doc and doc["fakecuda"] is True, doc
    assert set(doc["states"]) == {"host", "gpu", "read_mostly", "discarded"}
    for state, figure in doc["states"].items():
        assert len(figure["samples_seconds"]) == 2 and figure["seconds"] > 0, (state, figure)
    assert doc["states"]["host"]["over_host"] == 1


def test_uvm_counters_probe_on_fakecuda_is_a_finding(fake_gpu, tmp_path):
    """The dry run: fakecuda loads no injection library, so there is no report; that, or no
    CUPTI to build against, is a finding there, not a failure."""
    doc = run_probe(fake_gpu, "uvm_counters.py", "--work", tmp_path)
    assert "failure" not in doc
    assert doc["finding"].startswith(("on fakecuda", "CUPTI unavailable")), doc


def test_handle_kind_probe_tells_the_origins_apart(fake_gpu, tmp_path):
    doc = run_probe(fake_gpu, "handle_kind.py", "--work", tmp_path, "--", sys.executable,
                    BENCH / "probes" / "launch_kinds.py")
    assert doc["launches_by_origin"]["cuLibraryGetKernel"] == 1 and doc["launches_by_origin"]["cuModuleGetFunction"] >= 1
    kernel = doc["by_origin"]["cuLibraryGetKernel"]
    # fakecuda follows cuda.h: a CUkernel is asked with cuKernelGetParamInfo.
    assert kernel["cuKernelGetParamInfo_ok"] == 1 and doc["cuFuncGetParamInfo_accepted_a_CUkernel"] == []
    assert doc["forwarding"]["missing_count"] == doc["forwarding"]["elsewhere_count"] == 0, doc["forwarding"]
    assert doc["forwarding"]["taken_over"] == [], doc["forwarding"]


# ---------------------------------------------------------------- handle_kind's stand-in libcuda
REAL_LIBCUDA = ROOT / "build" / "libcuda"   # scripts/fetch-libcuda's drivers (tests/test_real_libcuda.py)
REAL_CLIENT_PYTHON = os.environ.get("PUMP_REAL_CLIENT_PYTHON")   # read before fake_gpu drops PUMP_*


def handle_kind_probe():
    pytest.importorskip("cuda.bindings", reason="the probes import cuda-python (pip install cuda-bindings)")
    if str(BENCH / "probes") not in sys.path:
        sys.path.append(str(BENCH / "probes"))
    import handle_kind
    return handle_kind


def wrapped_driver(c_build, which) -> str:
    driver = c_build / "plain" / "libcuda.so.1" if which == "fakecuda" else REAL_LIBCUDA / which / "libcuda.so.1"
    if not driver.exists():
        pytest.skip(f"{driver} missing: run scripts/fetch-libcuda")
    return str(driver.resolve())


@pytest.mark.parametrize("which", ["bookworm", "trixie"])
def test_host_calls_finds_every_call_in_a_real_driver(tmp_path, which):
    """Debian's 535 and 550 drivers answer cuGetProcAddress before cuInit: every call
    host_calls.c times is looked up in them (the forms of the older of the headers and the
    driver), and cuInit then fails on this machine without a GPU: a finding, not a crash."""
    handle_kind_probe()   # the probes on the import path (they import cuda-python)
    driver = REAL_LIBCUDA / which / "libcuda.so.1"
    if not driver.exists():
        pytest.skip(f"{driver} missing: run scripts/fetch-libcuda")
    import host_calls
    program = host_calls.build(tmp_path)
    proc = subprocess.run([str(program), "1", "1"], env=dict(clean_env(), LD_LIBRARY_PATH=str(driver.parent)),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and json.loads(proc.stdout) == {
        "probe": "host_calls", "finding": "cu.cuInit(0) failed: CUresult 100"}, (proc.stdout, proc.stderr)


@pytest.mark.parametrize("which", ["fakecuda", "bookworm", "trixie"])
def test_handle_kind_stand_in_answers_every_export_of_the_driver(c_build, tmp_path, which):
    """PyTorch's own driver calls dlopen libcuda.so.1 and dlsym names such as
    cuDevicePrimaryCtxGetState: the stand-in must answer each export of the driver it wraps,
    with its own wrappers for the calls it counts. The first H100 run's stand-in exported only
    the lookups, and PyTorch's CUDA start failed under it."""
    hk = handle_kind_probe()
    driver = wrapped_driver(c_build, which)
    names = hk.exported_symbols(driver)
    assert len(names) > 250 and {"cuDevicePrimaryCtxGetState", "cuLaunchKernel", "cuGetProcAddress_v2"} <= set(names)
    wrapper = hk.build(tmp_path, driver)
    env = dict(clean_env(), LD_LIBRARY_PATH=str(tmp_path), HANDLE_PROBE_DRIVER=driver)
    check = hk.forwarding(wrapper, driver, env)
    assert check["driver_exports"] == len(names)
    assert check["missing_count"] == check["elsewhere_count"] == 0 and check["taken_over"] == [], check
    assert {"cuGetProcAddress", "cuGetProcAddress_v2", "cuDriverGetVersion", "cuLaunchKernel",
            "cuModuleGetFunction"} <= set(check["wrapped"])


def test_handle_kind_forwarding_check_fails_a_stand_in_without_the_driver(c_build, tmp_path):
    """The check the probe makes before its program runs fails the first H100 run's stand-in:
    handle_kind.c built alone, without the driver beneath it."""
    hk = handle_kind_probe()
    driver = wrapped_driver(c_build, "fakecuda")
    alone = tmp_path / "libcuda.so.1"
    hk.probe.compile_c("-shared", "-fPIC", "-fvisibility=hidden", BENCH / "probes" / "handle_kind.c",
                       "-Wl,-soname,libcuda.so.1", "-o", alone, "-ldl", "-lpthread")
    env = dict(clean_env(), LD_LIBRARY_PATH=str(tmp_path), HANDLE_PROBE_DRIVER=driver)
    check = hk.forwarding(alone, driver, env)
    assert check["missing_count"] == check["driver_exports"] - len(check["wrapped"]) > 200
    assert hk.resolve(["cuDevicePrimaryCtxGetState"], env) == {"cuDevicePrimaryCtxGetState": None}


def test_handle_kind_probe_runs_pytorchs_cuda_build(fake_gpu, tmp_path):
    """The probe's own workload on fakecuda: PyTorch's CUDA build (PUMP_REAL_CLIENT_PYTHON, as in
    tests/test_real_client.py) starts under the stand-in and its launches are counted."""
    if not REAL_CLIENT_PYTHON:
        pytest.skip("PUMP_REAL_CLIENT_PYTHON names no interpreter with torch's CUDA build")
    program = ("import torch; x = torch.ones(8, 8, device='cuda'); (x @ x + 1).sum().item(); "
               "torch.cuda.synchronize()")
    doc = run_probe(dict(fake_gpu, FAKECUDA_PERSONA="h100-sxm-80gb"), "handle_kind.py", "--work", tmp_path, "--",
                    REAL_CLIENT_PYTHON, "-c", program)
    assert doc["program_rc"] == 0 and "finding" not in doc, doc
    assert doc["launches_by_origin"]["cuLibraryGetKernel"] >= 1, doc


# ---------------------------------------------------------------- on fakecuda
@pytest.fixture
def fake_gpu(c_build, monkeypatch):
    """The environment that runs the suite's cuda-python programs on fakecuda."""
    pytest.importorskip("cuda.bindings", reason="cuda-python (pip install cuda-bindings) runs the suite's programs")
    env = dict(clean_env(), LD_LIBRARY_PATH=str(c_build / "plain"))
    for key in [k for k in __import__("os").environ if k.startswith(("PUMP_", "FAKECUDA_"))] + ["LD_PRELOAD"]:
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("LD_LIBRARY_PATH", env["LD_LIBRARY_PATH"])
    return env


CHAIN = [sys.executable, str(BENCH / "chain.py"), "--memory", "managed", "--pairs", "2", "--mib", "1",
         "--repeat", "1", "--warmup", "1", "--steps", "2"]


def final_of(proc):
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return suite.parse_output(proc.stdout)[1]


def test_chain_on_fakecuda_pump_prefetches_and_results_stay_identical(fake_gpu, tmp_path):
    plain = final_of(subprocess.run(CHAIN, env=fake_gpu, capture_output=True, text=True, timeout=300))
    trace = tmp_path / "chain.trace"
    pumped = final_of(subprocess.run([PUMP_RUN, "--trace", str(trace), "--", *CHAIN], env=fake_gpu,
                                     capture_output=True, text=True, timeout=300))
    graph = final_of(subprocess.run(CHAIN + ["--graph"], env=fake_gpu, capture_output=True, text=True, timeout=300))
    assert plain["checksum_hex"] == pumped["checksum_hex"] == graph["checksum_hex"]
    assert plain["fakecuda"]["gpu_faults"] > 0 and plain["fakecuda"]["bytes_prefetched_h2d"] == 0
    assert pumped["fakecuda"]["gpu_faults"] == 0 and pumped["fakecuda"]["bytes_prefetched_h2d"] > 0
    assert plain["host_written_bytes_per_step"] == 2 * MiB and plain["working_set_bytes"] == 4 * MiB
    written = [(b["address"], b["bytes"]) for b in pumped["buffers"] if b["host_written"]]
    # The shim's own trace of the run: every step the two host-written inputs must come over.
    assert lowerbound.must_move(str(trace), 64 * MiB, written)["must_move_bytes"] == 2 * MiB


def test_chain_refuses_a_working_set_past_free_memory(fake_gpu):
    proc = subprocess.run(CHAIN[:-6] + ["--mib", str(64 * 1024)], env=fake_gpu, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 3 and proc.stderr.startswith("REFUSED chain.py (2 pairs of 65536 MiB, managed)")
    assert proc.stdout == ""


def fake_nvml(free, total):
    module = types.ModuleType("pynvml")
    module.NVMLError = type("NVMLError", (Exception,), {})
    memory = types.SimpleNamespace(free=free, total=total)
    module.__dict__.update(nvmlInit=lambda: None, nvmlShutdown=lambda: None, nvmlDeviceGetHandleByIndex=lambda i: i,
                           nvmlDeviceGetMemoryInfo=lambda h: memory, nvmlDeviceGetName=lambda h: "fake GPU",
                           nvmlSystemGetDriverVersion=lambda: "0.0", nvmlSystemGetCudaDriverVersion=lambda: 13000)
    return module


FAKE_TRAIN = """
import argparse, json, struct
ap = argparse.ArgumentParser()
for name in ("--preset", "--batch", "--seq", "--steps", "--warmup", "--device"):
    ap.add_argument(name)
ap.add_argument("--json", action="store_true")
a = ap.parse_args()
loss = 10.0
for step in range(int(a.steps) + int(a.warmup)):
    loss *= 0.9
    print(json.dumps({"step": step, "loss": loss, "loss_hex": struct.pack(">d", loss).hex(), "ms": 1.0 + step % 3}))
print(json.dumps({"steps": int(a.steps), "checksum_hex": "ab" * 32, "params": 1, "device": "cuda",
                  "peak_bytes": 64 << 20}))
"""


@pytest.fixture
def small_suite(fake_gpu, monkeypatch, tmp_path):
    monkeypatch.setattr(suite, "CHAIN_PAIRS", 2)
    monkeypatch.setattr(suite, "CHAIN_REPEAT", 1)
    monkeypatch.setattr(suite, "TIMED", {"chain": (1, 2), "gpt": (1, 3)})
    monkeypatch.setattr(suite, "UNTIMED_STEPS", 3)
    monkeypatch.setattr(suite, "versions", lambda: {"python": "test"})
    (tmp_path / "train.py").write_text(FAKE_TRAIN)

    def run(cases, free, total, status, script="train.py"):
        monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(free, total))
        out = tmp_path / f"suite-{cases}.json"
        assert suite.main(["--cases", cases, "--scale", "0.01", "--json", str(out), "--work", str(tmp_path / "w"),
                           "--train-script", str(tmp_path / script)]) == status
        return json.loads(out.read_text())
    return run


def test_suite_on_fakecuda(small_suite):
    doc = small_suite("acd", 20 * GiB, 24 * GiB, status=0)
    cases = {c["case"]: c for c in doc["cases"]}
    # fakecuda has page-locked host memory (host_memory.c), so the ideal chain runs there too.
    assert doc["failures"] == []
    assert doc["device"]["name"] == "fake GPU" and doc["bandwidth"]["h2d_bytes_per_s"] > 0
    # Discarded memory on fakecuda: evicted, or brought to the GPU from the host, nothing moves;
    # but the eviction is a prefetch, which ends the discard: brought back after it, it moves.
    moved = {move: doc["discard"][move]["fakecuda_discarded_bytes_moved"] for move in
             ("gpu_to_host", "host_to_gpu", "host_to_gpu_after_eviction")}
    size, rounds = doc["discard"]["bytes"], doc["discard"]["rounds"]
    assert moved == {"gpu_to_host": 0, "host_to_gpu": 0, "host_to_gpu_after_eviction": size * rounds}
    a = cases["a"]["variants"]
    assert "error" not in a["ideal"] and a["ideal"]["step_ms"]["n"] == 2, a["ideal"]
    for name in ("launch", "lookahead"):
        assert a[name]["identical"] is True and a[name]["step_ms"]["n"] == 2, a[name]
        assert a[name]["pump"]["prefetch_bytes"] > 0 and "error" in a[name]["cupti"]
    assert a["launch"]["speedup_over_naive"] > 0
    c = cases["c"]
    assert c["emulated"] and c["capacity_bytes"] == 32 * MiB and c["request_bytes"] == 96 * MiB
    for name in ("naive", "launch", "lookahead"):
        assert c["variants"][name]["identical"] is True and c["variants"][name]["ratio_to_ideal"] == 1.0
    assert c["variants"]["naive"]["command"][1:3] == ["--policy", "off"]
    d = cases["d"]
    assert d["lower_bound"]["must_move_bytes"] == 0 and d["variants"]["pump"]["ratio_to_bound"] == 1.0
    assert "| c (emulated) | launch | 2.00 |" in doc["table"]


def test_suite_refuses_cases_past_free_memory_and_runs_none_of_them(small_suite, capsys):
    doc = small_suite("ab", 2 * GiB + 2 * MiB, 3 * GiB, status=0)    # 2 MiB allowed; --scale 0.01 asks 4 MiB
    assert all(c["refused"].startswith(f"REFUSED case {c['case']}") for c in doc["cases"])
    assert "| a | - | REFUSED case a" in doc["table"]
    assert "chain.py" not in capsys.readouterr().out      # nothing was started


def test_suite_fails_when_the_training_job_cannot_run(small_suite):
    doc = small_suite("ce", 20 * GiB, 24 * GiB, status=1, script="missing.py")
    assert [c["case"] for c in doc["cases"]] == ["c", "e"]
    assert all("train_gpt.py's ideal run gave no peak_bytes (exit status 2)" in c["error"] for c in doc["cases"])
    assert [f.split(":")[0] for f in doc["failures"]] == ["case c", "case e"]
    assert "| c | - | ERROR: train_gpt.py's ideal run gave no peak_bytes" in doc["table"]


def test_dry_run_nvml_answers_for_fakecuda_only(c_build):
    """The dry run's stand-in NVML must never stand in for a real driver's free memory."""
    code = "import pynvml; pynvml.nvmlInit(); h = pynvml.nvmlDeviceGetHandleByIndex(0); " \
           "m = pynvml.nvmlDeviceGetMemoryInfo(h); print(pynvml.nvmlDeviceGetCount(), m.free <= m.total)"
    env = dict(clean_env(), PYTHONPATH=str(check_common.FAKE_NVML), LD_LIBRARY_PATH=str(c_build / "plain"))
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.split() == ["1", "True"], proc.stderr
    real = ROOT / "build" / "libcuda" / "bookworm"
    if not (real / "libcuda.so.1").exists():
        pytest.skip("no real libcuda here (scripts/fetch-libcuda)")
    proc = subprocess.run([sys.executable, "-c", code], env=dict(env, LD_LIBRARY_PATH=str(real)),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and "answers only for fakecuda" in proc.stderr


def test_managed_probe_records_a_refused_managed_memory_as_a_finding(fake_gpu):
    """Under gVisor (the H200 kind) the driver may refuse managed memory and cuMemAdvise
    (google/gvisor#9593, #12034): the probe says so in its line and exits 0, not a crash."""
    fake_gpu = dict(fake_gpu, FAKECUDA_FAIL="cuMemAllocManaged=CUDA_ERROR_NOT_SUPPORTED,"
                                            "cuMemAdvise_v2=CUDA_ERROR_NOT_SUPPORTED")
    doc = run_probe(fake_gpu, "managed.py", "--mib", "4")
    assert doc["results"]["cuMemAllocManaged"]["alloc"].startswith("refused")
    assert any(str(v).startswith("refused") and "advise" in k
               for k, v in doc["results"]["managed pool"].items())


def test_the_benchmarks_evidence_keeps_traces_and_reports_within_its_cap(tmp_path, monkeypatch):
    """What the simulator needs to replay a GPU run comes back in one file: the traces, the
    suite's JSON, CUPTI's reports; not the CUPTI library built there; past the cap, named."""
    import tarfile
    work, out = tmp_path / "work", tmp_path / "out"
    (work / "cupti").mkdir(parents=True)
    out.mkdir()
    t = TraceBuilder()
    t.launch(1, [t.alloc(2 << 20)])
    t.write(str(work / "a.trace"))
    (work / "suite.json").write_text("{}")
    (work / "cupti" / "a-launch-cupti.json").write_text('{"records": 0}')
    (work / "libum_counters.so").write_bytes(b"\x7fELF")
    (work / "z.trace").write_bytes(os.urandom(300_000))           # incompressible, past a small cap
    monkeypatch.setattr(stages, "EVIDENCE_MAX", 200_000)
    kept = stages.keep_evidence(work, out)
    assert kept["kept"] == ["a.trace", "cupti/a-launch-cupti.json", "suite.json"], kept
    assert kept["left_out"] == ["z.trace (300000 bytes)"] and kept["bytes"] == (out / stages.EVIDENCE).stat().st_size
    with tarfile.open(out / stages.EVIDENCE) as tar:
        assert sorted(tar.getnames()) == sorted(kept["kept"])
        tar.extract("a.trace", tmp_path / "back", filter="data")
    assert (tmp_path / "back" / "a.trace").read_bytes() == (work / "a.trace").read_bytes()


def test_discard_order_probe_finds_every_way_in_order_on_fakecuda(fake_gpu):
    """bench/gpu/probes/discard_order.py: fakecuda keeps each discard in the order asked for
    (the legacy stream's implicit synchronisation included), so no way leaves the kernel
    indeterminate data; on a GPU the figures say whether the driver does."""
    doc = run_probe(fake_gpu, "discard_order.py", "--mib", "2", "--busy", "2", "--rounds", "1")
    assert doc["fakecuda"] and set(doc["ways"]) == {"peer_implicit", "peer_events", "passed_events",
                                                             "same_stream"}, doc
    assert all(way["wrong"] == 0 and way["written_wrong"] == 0 and way["call_seconds"] >= 0
               for way in doc["ways"].values()), doc


def test_discard_late_probe_loses_the_writes_behind_a_busy_discard_on_fakecuda(fake_gpu):
    """bench/gpu/probes/discard_late.py: as on the H200, a discard asked for on a busy stream
    loses what the same stream writes after it at the memory's next move, and not what another
    stream writes once it has waited for an event recorded after the discard and prefetched the
    memory; the half the first stream writes later is lost too (fakecuda/discard_races.c, harsher
    than the H200, which lost none of it). The probe exits 1 only on a loss in `event`, pump's
    own order."""
    doc = run_probe(fake_gpu, "discard_late.py", "--mib", "2", "--busy", "2", "--rounds", "1")
    assert doc["fakecuda"], doc
    ways = doc["ways"]
    assert ways["same_stream"]["lost"] == (2 << 20) // 4 and ways["event"]["lost"] == 0, doc
    assert ways["event_half"]["lost"] == (1 << 20) // 4, doc


def test_discard_writes_probe_keeps_every_write_on_fakecuda(fake_gpu):
    """bench/gpu/probes/discard_writes.py: data written into discarded memory (a kernel, a memset,
    a copy, after a prefetch of all of it, of half or none, into a block split between host and
    device or not) survives its next move to the host on fakecuda, as the H200
    showed (bench/results/gpu-20261126-nvidia-h200); a write the model dropped would show."""
    doc = run_probe(fake_gpu, "discard_writes.py", "--mib", "2", "--rounds", "1")
    assert doc["fakecuda"] and set(doc["ways"]) == {"kernel", "memset", "copy", "prefetched", "half_prefetched",
                                                    "split", "mapped"}, doc
    assert all(moves == {"evict": 0, "fault": 0} for moves in doc["ways"].values()), doc
