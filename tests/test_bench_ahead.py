"""scripts/bench-ahead, short: room made ahead under a budget against none, in the same run
(docs/benchmarks.md quotes its full run). What it must show, not how fast: the same losses and
no fault either way, room made ahead only where it is on, the launching thread charged less."""

import json
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_bench_ahead_compares_room_made_ahead_with_none(c_build, tmp_path):
    out = tmp_path / "ahead.json"
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench-ahead"), "--budget", "200", "--rounds", "1",
                           "--steps", "3", "--json", str(out)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "thread us" in proc.stdout
    off, on = json.loads(out.read_text())["rows"]
    assert (off["evict_ahead"], on["evict_ahead"]) == (0, 1)
    assert off["same_losses"] and on["same_losses"] and off["gpu_faults_per_step"] == on["gpu_faults_per_step"] == 0
    assert off["ahead_decisions"] == 0 < on["ahead_decisions"]
    assert on["launching_thread_us_per_launch"] < off["launching_thread_us_per_launch"]


def test_bench_ahead_refuses_bad_arguments():
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench-ahead"), "--rounds", "0"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--rounds at least 1" in proc.stderr
