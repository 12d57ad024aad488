"""Tests that need a real NVIDIA GPU (marked `gpu`; skipped where there is none, which includes
fakecuda): pump on real hardware keeps results bit-identical and does its job.  scripts/gpu-check
runs them with `pytest -m gpu`, with the other files' gpu tests (examples/train_gpt.py's
bit-identity under pump-run is tests/test_example.py's).  Every test checks the card's free memory first and fails loudly
rather than ask for more managed memory than is free (../shared GPU.md)."""

import json
import pathlib
import subprocess
import sys

import pytest

from helpers import PUMP_RUN, clean_env, has_gpu, no_gpu_reason

ROOT = pathlib.Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench" / "gpu"
sys.path.insert(0, str(BENCH))
import membudget  # noqa: E402
import suite  # noqa: E402  (its output parsing)

MiB = membudget.MiB

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not has_gpu(), reason=f"needs an NVIDIA GPU: {no_gpu_reason()}")]


def require_free(what: str, request_bytes: int) -> None:
    """Fail loudly, before anything is allocated, when the card cannot hold request_bytes."""
    try:
        membudget.check(what, request_bytes, *membudget.nvml_memory(0))
    except (membudget.Refused, RuntimeError) as exc:
        pytest.fail(str(exc))


def run(argv, timeout=300):
    proc = subprocess.run([str(a) for a in argv], capture_output=True, text=True, env=clean_env(), cwd=ROOT,
                          timeout=timeout)
    assert proc.returncode == 0, f"{argv} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


def under_pump(tmp_path, argv, *options):
    """(process, pump's totals) of argv under pump-run with options."""
    stats = tmp_path / "stats.json"
    proc = run([PUMP_RUN, *options, "--stats", stats, "--", *argv])
    return proc, json.loads(stats.read_text())["totals"]


def checksum(stdout):
    """managed_saxpy's result, "checksum V (N samples match the host)", without the line's timing."""
    lines = [line.split(",")[0] for line in stdout.splitlines() if line.startswith("checksum")]
    assert len(lines) == 1, stdout
    return lines[0]


def test_managed_saxpy_is_prefetched_and_matches(tmp_path):
    require_free("managed_saxpy (4 x 64 MiB)", 4 * 64 * MiB)
    argv = [sys.executable, ROOT / "examples" / "managed_saxpy.py", "--steps", "6"]
    plain = run(argv)
    pumped, totals = under_pump(tmp_path, argv)
    assert "fakecuda" not in plain.stdout + pumped.stdout
    assert checksum(plain.stdout) == checksum(pumped.stdout)
    assert totals["launches_managed"] == 12, totals
    assert totals["launches_prefetched"] > 0 and totals["prefetch_bytes"] >= 4 * 64 * MiB, totals
    assert totals["errors"] == 0, totals


def test_graph_replay_under_pump_matches_and_prefetches(tmp_path):
    require_free("chain.py --graph (4 x 64 MiB)", 4 * 64 * MiB)
    argv = [sys.executable, BENCH / "chain.py", "--memory", "managed", "--graph", "--pairs", "2", "--mib", "64",
            "--repeat", "2", "--warmup", "1", "--steps", "4"]
    _, plain, _ = suite.parse_output(run(argv).stdout)
    proc, totals = under_pump(tmp_path, argv)
    _, pumped, _ = suite.parse_output(proc.stdout)
    assert plain["checksum_hex"] == pumped["checksum_hex"]
    assert totals["graph_launches"] == 5, totals
    # The host rewrites the inputs before every replay: only pump's graph support moves them back.
    assert totals["prefetch_bytes"] >= 5 * 2 * 64 * MiB, totals
    assert totals["errors"] == 0, totals
