"""fakecuda's own self-test (tests/fakecuda/selftest.c), plain and under the sanitizers:
every other test's figures rest on the CPU driver model behaving as it says."""

import subprocess

import pytest


@pytest.mark.parametrize("variant", ["plain", "asan", "tsan"])
def test_selftest(c_build, tmp_path, variant):
    run = subprocess.run([str(c_build / variant / "fakecuda_selftest")], cwd=tmp_path, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.rstrip().endswith(" 0 failed"), run.stdout
