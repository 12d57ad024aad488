"""CUDA graphs on fakecuda: each instantiation's kernel nodes are scanned, and
each replay's working set is prefetched before it runs (tests/c/graphs.c:
four kernels over four 16 MiB managed buffers the host rewrites between
replays), or left to faults when it exceeds the budget; results stay
bit-identical to runs without pump."""

import pytest

REPLAYS = 4
PAGES_16_MIB = 16 * 1024 // 64  # fakecuda faults per 64 KiB page
EXPECTED_FAULTS = 4 * PAGES_16_MIB + (REPLAYS - 1) * 2 * PAGES_16_MIB


def bare(run_program, *args):
    run = run_program("graphs", REPLAYS, *args, pump=False)
    assert run.result["gpu_faults"] == run.result["expected_faults"] == EXPECTED_FAULTS
    return run.result["checksum"]


@pytest.mark.parametrize("build", ["capture", "hand", "child"])
def test_replays_are_prefetched(run_program, build):
    off = run_program("graphs", REPLAYS, f"--build={build}", env={"PUMP_POLICY": "off"})
    assert off.result["gpu_faults"] == EXPECTED_FAULTS
    run = run_program("graphs", REPLAYS, f"--build={build}")
    assert run.result["gpu_faults"] == 0
    assert run.result["checksum"] == off.result["checksum"] == bare(run_program, f"--build={build}")
    totals = run.totals
    assert totals["graph_launches"] == totals["graph_launches_prefetched"] == REPLAYS
    assert totals["graph_execs_scanned"] == 1
    assert totals["graph_launches_over_budget"] == totals["graph_launches_unknown"] == 0
    # a replay is not a kernel launch: the kernel counters stay out of it
    assert totals["launches_prefetched"] == 0
    assert totals["errors"] == 0


@pytest.mark.parametrize("how", ["flags", "params", "v10000", "v11000", "v12000"])
def test_every_instantiation_entry_point_is_seen(run_program, how):
    """cuGraphInstantiateWithFlags, ...WithParams, and what cuGetProcAddress
    answers for "cuGraphInstantiate" at 10.0, 11.0 and 12.0 (the 5-argument
    forms: NVIDIA's drivers answer _v2 at 12.0, tests/test_real_libcuda.py)."""
    run = run_program("graphs", REPLAYS, f"--instantiate={how}")
    assert run.result["gpu_faults"] == 0
    assert run.result["checksum"] == bare(run_program)
    assert run.totals["graph_execs_scanned"] == 1


def test_destroy_and_reinstantiate(run_program):
    run = run_program("graphs", REPLAYS, "--reinstantiate", "--instantiate=params")
    assert run.result["gpu_faults"] == 0
    assert run.result["checksum"] == bare(run_program)
    assert run.totals["graph_execs_scanned"] == REPLAYS
    assert run.totals["graph_launches_prefetched"] == REPLAYS


@pytest.mark.parametrize("update", ["exec", "node"])
def test_updated_exec_is_scanned_again(run_program, update):
    """After the first replay the last kernel moves to a fifth buffer (an
    exec update, or new parameters for that node): pump must prefetch that
    buffer, not the old one."""
    args = (f"--update={update}",)
    off = run_program("graphs", REPLAYS, *args, env={"PUMP_POLICY": "off"})
    assert off.result["gpu_faults"] == EXPECTED_FAULTS
    run = run_program("graphs", REPLAYS, *args)
    assert run.result["gpu_faults"] == 0
    assert run.result["checksum"] == off.result["checksum"] == bare(run_program, *args)
    assert run.totals["graph_exec_updates"] == 1
    assert run.totals["graph_launches_prefetched"] == REPLAYS


def test_replay_into_a_capture_adds_nothing(run_program):
    """A replay made while its stream is captured becomes nodes of the outer
    graph: pump adds nothing there (fakecuda would invalidate the capture),
    and the outer graph's replays are prefetched."""
    run = run_program("graphs", REPLAYS, "--nested")
    assert run.result["gpu_faults"] == 0
    assert run.result["checksum"] == bare(run_program)
    assert run.totals["graph_launches"] == REPLAYS + 1
    assert run.totals["graph_launches_prefetched"] == REPLAYS
    assert run.totals["graph_execs_scanned"] == 2


def test_working_set_over_the_budget_is_left_to_faults(run_program):
    run = run_program("graphs", REPLAYS, env={"PUMP_BUDGET": "48M"})
    assert run.result["gpu_faults"] == EXPECTED_FAULTS
    assert run.result["checksum"] == bare(run_program)
    notices = [line for line in run.proc.stderr.splitlines() if "graph" in line]
    assert len(notices) == 1, run.proc.stderr
    assert "64 MiB" in notices[0] and "48 MiB" in notices[0]
    totals = run.totals
    assert totals["graph_launches_over_budget"] == REPLAYS
    assert totals["graph_launches_prefetched"] == 0
    assert totals["prefetch_bytes"] == 0


def test_working_set_that_fits_the_budget_is_prefetched(run_program):
    run = run_program("graphs", REPLAYS, env={"PUMP_BUDGET": "64M"})
    assert run.result["gpu_faults"] == 0
    assert run.result["checksum"] == bare(run_program)
    assert run.proc.stderr == ""
    assert run.totals["graph_launches_prefetched"] == REPLAYS
    assert run.totals["resident_bytes_peak"] <= 64 << 20


def test_unreadable_graph_passes_through(run_program):
    """A graph whose nodes pump cannot list is replayed untouched, counted."""
    run = run_program("graphs", REPLAYS, env={"FAKECUDA_FAIL": "cuGraphGetNodes=CUDA_ERROR_INVALID_VALUE"})
    assert run.result["gpu_faults"] == EXPECTED_FAULTS
    assert run.result["checksum"] == bare(run_program)
    assert run.totals["graph_launches_unknown"] == REPLAYS
    assert run.totals["graph_execs_scanned"] == 0


@pytest.mark.parametrize("variant", ["asan", "tsan"])
@pytest.mark.parametrize("args", [["--update=node"], ["--build=child", "--reinstantiate"]])
def test_under_sanitizers(run_program, variant, args):
    env = {"ASAN_OPTIONS": "detect_leaks=1:abort_on_error=0", "UBSAN_OPTIONS": "print_stacktrace=1",
           "TSAN_OPTIONS": "halt_on_error=1:second_deadlock_stack=1"}
    run = run_program("graphs", 3, *args, variant=variant, env=env, timeout=600)
    assert run.proc.returncode == 0, run.proc.stderr[-4000:]
    assert "Sanitizer" not in run.proc.stderr and "runtime error" not in run.proc.stderr, run.proc.stderr[-4000:]
    assert run.result["gpu_faults"] == 0
