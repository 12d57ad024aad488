"""examples/managed_saxpy.py, the README's example, run as a user would: bare, under
pump-run, and under pump-run --policy off.

The environment is clean (no LD_PRELOAD, LD_LIBRARY_PATH, PUMP_* or FAKECUDA_*), so the
example finds no libcuda.so.1 and takes its own way to fakecuda: it re-executes itself
with build/tests/plain on the library path. That build comes from the c_build fixture,
which also keeps it current with the sources."""

import json
import pathlib
import re
import subprocess
import sys

import pytest

from helpers import PUMP_RUN, clean_env

ROOT = pathlib.Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "managed_saxpy.py"
STEPS, MIB = 3, 4
ARGS = [sys.executable, str(EXAMPLE), "--mib", str(MIB), "--steps", str(STEPS)]
FAKECUDA_NOTE = "no CUDA driver here: running on pump's CPU model of the driver (tests/fakecuda)"


@pytest.fixture(scope="module")
def example_env(c_build):
    return clean_env("LD_LIBRARY_PATH")


def run(args, env):
    proc = subprocess.run(args, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"rc={proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    out = proc.stdout
    assert out.splitlines()[0] == FAKECUDA_NOTE, out
    assert len(re.findall(r"^step \d+: ", out, re.M)) == STEPS, out
    checksum = re.search(r"^checksum (\S+) \(\d+ samples match the host\)", out, re.M)
    faults = re.search(r"^fakecuda: (\d+) GPU faults", out, re.M)
    assert checksum and faults, out
    return proc, checksum.group(1), int(faults.group(1))


@pytest.fixture(scope="module")
def bare(example_env):
    return run(ARGS, example_env)


def test_bare(bare):
    proc, checksum, faults = bare
    assert float(checksum) > 0
    # Plain Unified Memory: one GPU fault per 64 KiB page of the four buffers.
    assert faults == 4 * MIB * 16, proc.stdout
    assert "pump:" not in proc.stderr  # not under pump


def test_pump_run(bare, example_env, tmp_path):
    stats_file = tmp_path / "stats.json"
    proc, checksum, faults = run([PUMP_RUN, "--stats", str(stats_file), *ARGS], example_env)
    assert checksum == bare[1]
    assert faults == 0, proc.stdout  # every page was prefetched before its kernel ran
    summary = [l for l in proc.stderr.splitlines() if l.startswith("pump: ")]
    assert len(summary) == 1, proc.stderr
    assert f"{2 * STEPS} launches" in summary[0] and "prefetch" in summary[0], summary
    totals = json.loads(stats_file.read_text())["totals"]
    assert totals["launches"] == 2 * STEPS
    assert totals["launches_managed"] == 2 * STEPS
    assert totals["prefetch_bytes"] > 0
    assert totals["processes"] == 1  # the re-executed process keeps its pid and its record


def test_pump_run_policy_off(bare, example_env):
    proc, checksum, faults = run([PUMP_RUN, "--policy", "off", *ARGS], example_env)
    assert checksum == bare[1]
    assert faults == bare[2] > 0, proc.stdout  # pump counted launches and moved nothing
    assert re.search(rf"^pump: {2 * STEPS} launches .* 0 B prefetched", proc.stderr, re.M), proc.stderr
