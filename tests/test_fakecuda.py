"""fakecuda's own self-test (fakecuda/selftest.c), plain and under the sanitizers:
every other test's figures rest on the CPU driver model behaving as it says. And its measured
host costs: fakecuda_model.h's launch cost is what the real A100 traces say."""

import importlib.util
import pathlib
import re
import signal
import statistics
import subprocess
import sys

import pytest

FAKECUDA = pathlib.Path(__file__).resolve().parent.parent / "fakecuda"


@pytest.mark.parametrize("variant", ["plain", "asan", "tsan"])
def test_selftest(c_build, tmp_path, variant):
    run = subprocess.run([str(c_build / variant / "fakecuda_selftest")], cwd=tmp_path, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.rstrip().endswith(" 0 failed"), run.stdout


def test_a_graph_copy_from_memory_no_longer_pinned_stops_the_process(c_build, tmp_path):
    """A copy from page-locked host memory captured into a graph reads its source whenever the
    graph runs (cuda.h, cuGraphAddMemcpyNode); with the memory unregistered since (still mapped,
    so nothing else would notice) the driver's DMA is undefined, and fakecuda stops, naming it."""
    run = subprocess.run([str(c_build / "plain" / "fakecuda_selftest"), "pinned-unregistered"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == -signal.SIGABRT, (run.returncode, run.stderr)
    assert "a captured copy ran after its page-locked host memory" in run.stderr, run.stderr


def test_launch_cost_is_the_traces_smallest_median():
    spec = importlib.util.spec_from_file_location("measure_kineto", FAKECUDA / "measure_kineto.py")
    measure = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(measure)
    traces = sorted(measure.DEFAULT_DIR.glob("*.json.gz"))
    if not traces:
        pytest.skip(f"the Kineto traces are not here ({measure.DEFAULT_DIR})")
    medians = [statistics.median(calls["cudaLaunchKernel"]) for _, calls in map(measure.host_durations, traces)
               if "cudaLaunchKernel" in calls]
    model = (FAKECUDA / "fakecuda_model.h").read_text()
    launch_ns = int(re.search(r"#define FAKECUDA_LAUNCH_HOST_NS (\d+)u", model).group(1))
    assert len(medians) == 3 and launch_ns == min(medians) * 1000, (medians, launch_ns)


def test_example_stats_struct_matches_fakecuda_h():
    """examples/managed_saxpy.py reads struct fakecuda_stats through ctypes: a field missing there
    lets fakecuda_get_stats write past the buffer (the job then crashed in Python's GC at exit)."""
    sys.path.insert(0, str(FAKECUDA.parent / "examples"))
    import managed_saxpy
    header = (FAKECUDA / "fakecuda.h").read_text()
    body = header[header.index("struct fakecuda_stats {"):header.index("};", header.index("struct fakecuda_stats {"))]
    body = re.sub(r"/\*.*?\*/", "", body, flags=re.S)
    fields = [name.strip() for decl in re.findall(r"uint64_t([^;]+);", body) for name in decl.split(",")]
    assert [f for f, _ in managed_saxpy.FakeStats._fields_] == fields
