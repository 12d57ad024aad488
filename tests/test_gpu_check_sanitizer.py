"""scripts/gpu-check's reading of compute-sanitizer (bench/gpu/check/sanitizer.py), on the memcheck
output of the first GPU run (bench/results/gpu-20261124-nvidia-h100-80gb-hbm3/benchmarks.log,
driver 580, CUDA 13.0): pump's two parameter-end probes are expected there and nowhere else; any
other report, or one more error than shown, fails."""

import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench" / "gpu" / "check"))

import sanitizer  # noqa: E402

RUN = ROOT / "bench" / "results" / "gpu-20261124-nvidia-h100-80gb-hbm3" / "benchmarks.log"


def memcheck_output():
    """The memcheck run's lines of the committed log, as the stage saw them (the log indents by two)."""
    lines = RUN.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if "--tool memcheck" in line)
    end = next(i for i in range(start, len(lines)) if "ERROR SUMMARY" in lines[i])
    return [line[2:] for line in lines[start + 1:end + 1]]


def test_parameter_end_probes_are_expected_before_cuda_13_2():
    assert sanitizer.judge(memcheck_output(), 13000) == {"errors": 2, "expected": 2, "unexpected": []}


def test_the_same_reports_fail_where_the_driver_counts_parameters():
    got = sanitizer.judge(memcheck_output(), 13020)
    assert got["expected"] == 0 and len(got["unexpected"]) == 2


def test_any_other_report_fails():
    lines = memcheck_output()
    other = ["========= Invalid __global__ read of size 4 bytes", "=========     at saxpy+0x70", "========= "]
    at = lines.index(next(line for line in lines if "ERROR SUMMARY" in line))
    lines = lines[:at] + other + [lines[at].replace("2 errors", "3 errors")]
    got = sanitizer.judge(lines, 13000)
    assert got["expected"] == 2 and got["unexpected"] == ["Invalid __global__ read of size 4 bytes"]


def test_an_error_not_from_pump_fails():
    lines = [line.replace("libpump.so", "libtorch_cuda.so") for line in memcheck_output()]
    assert sanitizer.judge(lines, 13000)["expected"] == 0


def test_errors_counted_but_not_shown_fail():
    lines = [line.replace("2 errors", "5 errors") for line in memcheck_output()]
    assert sanitizer.judge(lines, 13000)["unexpected"] == ["3 error(s) counted but not shown"]


def test_a_clean_racecheck():
    lines = ["========= COMPUTE-SANITIZER", "step 0: saxpy", "========= RACECHECK SUMMARY: 0 hazards displayed "
             "(0 errors, 0 warnings)"]
    assert sanitizer.judge(lines, 13000) == {"errors": 0, "expected": 0, "unexpected": []}
