"""scripts/bench-steady's real-client row (--real-client-only, bench/steady_real_client.py): PyTorch's
CUDA build training on fakecuda, bare and under pump-run, fitting and at half of its resident
bytes. Checks the result's structure and that its figures agree with what each run counted, that
it is skipped, saying why, without torch's CUDA build, and that docs/benchmarks.md's table is the
committed result's (issue 26 item 4)."""

import json
import os
import subprocess
import sys

import pytest

from helpers import clean_env, markdown_table
from test_real_client import ROOT, cuda_torch  # noqa: F401 (the fixture that skips without torch's CUDA build)

BENCH = ROOT / "scripts" / "bench-steady"
RESULT = ROOT / "bench" / "results" / "steady-real-client.json"


def bench_steady(*args, python=None):
    env = clean_env()
    if python is not None:
        env["PUMP_REAL_CLIENT_PYTHON"] = python
    return subprocess.run([sys.executable, str(BENCH), "--real-client-only", *args], env=env, capture_output=True,
                          text=True, timeout=1800)


@pytest.fixture(scope="module")
def bench(cuda_torch, c_build):  # noqa: F811
    proc = bench_steady("--short", "--json", "--check", python=cuda_torch)
    assert proc.returncode in (0, 1), proc.stderr[-3000:]  # 2: it could not measure
    result = json.loads(proc.stdout)
    assert proc.returncode == (0 if result["targets_met"] else 1)
    return result


def test_skipped_saying_why_without_torchs_cuda_build(c_build):
    proc = bench_steady("--short", python=os.devnull)
    assert proc.returncode == 0 and proc.stdout == ""
    assert "bench-steady: real-client row skipped:" in proc.stderr and os.devnull in proc.stderr


def test_structure(bench):
    assert set(bench["scenarios"]) == {"fitting", "budget50"}
    assert bench["steps"] == 7 and bench["warmup"] == 3 and bench["launches_per_step"] > 100
    for name, row in bench["scenarios"].items():
        assert set(bench["runs"][name]) == {"bare", "pump", "pump_ioctls_on_worker"} | (
            {"driver_at_budget"} if name == "budget50" else set())
        for key in ("added_driver_calls_per_step", "added_cpu_ns_per_launch", "launch_thread_us_per_launch",
                    "launch_thread_us_per_launch_ioctls_on_worker", "launch_thread_us_per_launch_without_pump",
                    "wall_us_per_launch", "wall_us_per_launch_without_pump", "scan_words_per_launch"):
            assert key in row, (name, key)
    assert {row[0] for row in bench["target_rows"]} == {"real_client fitting", "real_client budget50"}
    assert bench["targets_met"] == all(row[3] for row in bench["target_rows"])


def test_figures_agree_with_the_runs(bench):
    for name, row in bench["scenarios"].items():
        runs = bench["runs"][name]
        bare, pump = runs["bare"]["steady"], runs["pump"]["steady"]
        # Every launch fakecuda ran reached pump's hooks, and pump adds none.
        assert pump["pump"]["launches"] == pump["launches"] == bare["launches"] == bench["launches_per_step"]
        assert pump["pump"]["errors"] == 0 and bare["pump"] is None
        # The launching threads read are PyTorch's two, and they paid every call the bare run made.
        assert bare["thread_host_ns"] == pytest.approx(sum(e["caller_ns"] for e in bare["entries"].values()))
        by_entry = row["added_driver_by_entry"]
        assert row["added_driver_calls_per_step"] == pytest.approx(sum(e["calls"] for e in by_entry.values()))
        assert row["prefetch_calls_per_step"] == pump["pump"]["prefetch_calls"]
    assert bench["scenarios"]["fitting"]["gpu_faults_per_step"] == 0
    # The budget held, and it was half of what fitting made resident.
    budget50 = bench["scenarios"]["budget50"]
    resident = bench["runs"]["fitting"]["pump"]["steady"]["device_resident_bytes"]
    assert budget50["budget_bytes"] == resident // 2 // (2 << 20) * (2 << 20) > 0
    assert 0 < bench["runs"]["budget50"]["pump"]["steady"]["pump"]["resident_bytes"] <= budget50["budget_bytes"]


def test_a_fitting_steady_step_prefetches_nothing(bench):
    """Once resident, a job that fits is not prefetched again (the imitation's fitting row: 0 calls).
    Before tensors carved over freed ones of other extents took over their residency, PyTorch's
    allocator made pump prefetch 58 tensors a step, all of them resident (232 driver calls)."""
    fitting = bench["scenarios"]["fitting"]
    assert fitting["prefetch_calls_per_step"] == 0 and fitting["added_driver_calls_per_step"] == 0


def test_the_docs_targets_are_the_committed_results():
    """docs/benchmarks.md's real-client table is bench/results/steady-real-client.json's target_rows."""
    committed = json.loads(RESULT.read_text())
    table = markdown_table(ROOT / "docs" / "benchmarks.md", "| real client | target | result | |")
    assert table == [[name, target, value, "met" if met else "MISSED"]
                     for name, target, value, met in committed["target_rows"]]
