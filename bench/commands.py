"""The commands the fakecuda benchmarks run and print (scripts/bench-steady,
scripts/bench-real-client-budget): the C tests' build they run on, this Python's pump-run, and
a command's words as a reader reruns them."""
import os
import pathlib
import shutil
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent


def build_tests():
    """Builds the C tests (fakecuda and the programs, scripts/build-tests) with this Python's
    CUDA headers; None, or why the build failed."""
    build = subprocess.run([str(ROOT / "scripts" / "build-tests")], env=dict(os.environ, PYTHON=sys.executable),
                           capture_output=True, text=True)
    return None if build.returncode == 0 else f"building the C tests failed: {build.stderr.strip()[-2000:]}"


def pump_run_command():
    """The pump-run of the Python running the benchmark (its environment's), else PATH's;
    FileNotFoundError when neither has one."""
    beside = pathlib.Path(sys.executable).parent / "pump-run"
    found = str(beside) if beside.exists() else shutil.which("pump-run")
    if found is None:
        raise FileNotFoundError("pump-run not found: pip install . first")
    return [found]


def as_written(word):
    """A command's word as a reader reruns it: paths in this tree relative, pump-run by name."""
    if word.endswith("/pump-run"):
        return "pump-run"
    path = pathlib.Path(word)
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else word
