"""`pump trace stats`: what a trace holds as a table in human units (and as JSON with
--json, tested with the daemon's traces in test_daemon.py)."""

import subprocess
import sys

from helpers import clean_env
from synthetic_trace import MIB, TraceBuilder


def stats_text(path):
    proc = subprocess.run([sys.executable, "-m", "pump.cli", "trace", "stats", str(path)], capture_output=True,
                          text=True, env=clean_env(), timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.splitlines()


def test_stats_is_a_table_in_human_units(tmp_path):
    t = TraceBuilder()
    weights, acts = t.alloc(96 * MIB), t.alloc(1536 * MIB)
    for s in range(3):
        t.step(s)
        for i in range(700):
            t.launch(0x100 + i % 2, [weights, acts], flops=2e9)
    lines = stats_text(t.write(str(tmp_path / "job.trace"), per_block=100000))
    table = dict(line.split(None, 1) if not line.startswith("managed") else ("managed peak", line[14:])
                 for line in lines[:8])
    assert table["launches"] == "2,100 of 2 functions"
    assert table["managed peak"] == "1.6 GiB"
    assert table["steps"] == "3"
    assert table["FLOPs"] == "4.20 TFLOP"
    assert table["records"] == "4,205 (cost 2,100, launch 2,100, step 3, alloc 2)"
    assert table["ends"] == "whole"   # (a trace cut short says where it ends: test_trace_safety.py)
    assert lines[9].split() == ["launches", "function", "(the", "busiest)"]
    assert [line.split()[0] for line in lines[10:12]] == ["1,050", "1,050"]


def test_stats_without_costs_or_steps_says_so(tmp_path):
    t = TraceBuilder()
    buf = t.alloc(MIB)
    t.launch(0x100, [buf])
    lines = stats_text(t.write(str(tmp_path / "bare.trace")))
    assert "FLOPs         none recorded (a trace from pump-run has none)" in lines
    assert "steps         none marked" in lines
