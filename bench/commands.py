"""The commands the fakecuda benchmarks run and print (scripts/bench-steady,
scripts/bench-real-client-budget): this Python's pump-run, and a command's words as a reader
reruns them."""
import pathlib
import shutil
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent


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
