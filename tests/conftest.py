"""Shared fixtures: the C test build (fakecuda and the test programs, in plain
and sanitizer variants) and a runner for those programs with or without the
shim, collecting what fakecuda and the shim counted."""

import json
import os
import pathlib
import signal
import subprocess
import sys

import pytest
from _pytest.mark.expression import Expression  # how -m reads its expression (no public API)

from helpers import clean_env
from pump import shim, stats

ROOT = pathlib.Path(__file__).resolve().parent.parent
BUILD = ROOT / "build" / "tests"
LOCK_HELD_LINE = "pump's rule: no lock held across a driver call"


# The two tiers (README): `pytest` runs the fast one, `pytest -m slow` the slow one: the runs of
# the sanitizer builds, PyTorch's CUDA build on fakecuda (the real client), Slurm, fuzzing and the
# daemon's fairness under load (a test of another module that runs the real client, through the
# cuda_torch fixture, is slow too). A path or node id named on the command line, or any -m, runs
# what it selects, slow or not.
SLOW_MODULES = {"test_real_client", "test_real_client_allocators", "test_real_client_iteration",
                "test_real_client_training", "test_real_client_uses", "test_real_client_outside",
                "test_bench_steady_real", "test_slurm", "test_fuzz", "test_daemon_fair"}
SLOW_VARIANTS = {"asan", "tsan"}
# Slow tests that another worker's load skews, so CI runs them apart (`pytest -m alone`), the rest
# of the slow tier on two workers: those that time the daemon's CPU under a load they make (under
# pytest -n 2 a register's CPU grew 3.2x from 1,024 to 2,048 jobs, where 3x is allowed), and a test
# marked `alone` where it is written (a plan made from times the host's clock takes).
ALONE_MODULES = {"test_daemon_fair"}


def _slow(item) -> bool:
    params = getattr(item, "callspec", None)
    variant = params.params.get("variant") if params else None
    return (item.module.__name__ in SLOW_MODULES or variant in SLOW_VARIANTS
            or "cuda_torch" in getattr(item, "fixturenames", ())
            or any(item.get_closest_marker(mark) is not None for mark in ("slow", "alone")))


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's: the GPU machine has pytest alone
def pytest_xdist_auto_num_workers(config):
    """`pytest` (`-n auto`: pyproject.toml) runs on a worker per CPU this process may use, but in
    this one process where its -m selects the tests that want the machine alone (`-m slow`,
    `-m alone`)."""
    expression = config.option.markexpr
    if expression and Expression.compile(expression).evaluate(lambda name, **_: name in ("slow", "alone")):
        return 0
    return len(os.sched_getaffinity(0))


def pytest_configure(config):
    """Under pytest-xdist (`pytest`, the README's fast tier), a file's tests stay in one worker
    (`--dist loadfile` where `-n` alone would deal them out one by one): a module's fixtures (a
    recording of the real client, a daemon, a build) are made once, not once per worker."""
    if getattr(config.option, "dist", "no") == "load":
        config.option.dist = "loadfile"
        # Files are dealt out in the order pytest_collection_modifyitems leaves them, not by
        # their count of tests (pytest-xdist's default), which dealt the real client's files,
        # few tests behind minutes of fixtures, last.
        config.option.loadscopereorder = False
    _catch_inherited_ignored_signals()


def _catch_inherited_ignored_signals():
    """A runner started in the background by a non-interactive shell (`pytest &`, `nohup pytest`)
    gets SIGINT, SIGQUIT or SIGHUP ignored, and every program a test starts would inherit that:
    pump-run rightly forwards no signal its job ignores, so the signal tests would fail on how pytest
    was started. A handler that does nothing keeps this process as deaf as its launcher asked, and
    since exec resets a caught signal to its default (an ignored one stays ignored), the programs
    the tests start get the defaults a terminal would give them."""
    for sig in (signal.SIGINT, signal.SIGQUIT, signal.SIGHUP):
        if signal.getsignal(sig) == signal.SIG_IGN:
            signal.signal(sig, lambda _signum, _frame: None)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGQUIT, signal.SIGHUP, signal.SIGTERM})


def pytest_collection_modifyitems(config, items):
    for item in items:
        if _slow(item):
            item.add_marker(pytest.mark.slow)
        if item.module.__name__ in ALONE_MODULES:
            item.add_marker(pytest.mark.alone)
    _real_client_files_first(items)
    if config.option.markexpr or config.args_source != pytest.Config.ArgsSource.TESTPATHS:
        return
    fast = [item for item in items if not _slow(item)]
    config.hook.pytest_deselected(items=[item for item in items if _slow(item)])
    items[:] = fast


def _real_client_files_first(items):
    """The files that run the real client (the cuda_torch fixture: a minute or more of module
    fixtures each, against seconds for most files) go first, so that two workers end the slow
    tier together: dealt last, one worker ran them while the other sat idle (a schedule replayed
    from one run's durations: 649 s for the busier worker against 611 this way)."""
    heavy = {item.module.__name__ for item in items if "cuda_torch" in getattr(item, "fixturenames", ())}
    items.sort(key=lambda item: item.module.__name__ not in heavy)  # stable: the rest keep their order


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """Where the slow tier must run (PUMP_SLOW_TIER_REQUIRED=1: CI), a slow test that skipped fails,
    saying why it skipped: a tier that did not run is not a tier that passed."""
    report = yield
    if report.skipped and os.environ.get("PUMP_SLOW_TIER_REQUIRED") == "1" and _slow(item):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome, report.longrepr = "failed", f"the slow tier must run here, but this test skipped: {reason}"
    return report


def _build_c_tests():
    build = subprocess.run([str(ROOT / "scripts" / "build-tests")], env=dict(os.environ, PYTHON=sys.executable),
                           capture_output=True, text=True)
    if build.returncode != 0:
        pytest.fail(f"building the C tests failed:\n{build.stdout}\n{build.stderr}")


@pytest.fixture(scope="session")
def c_build():
    """The directory of the C test build (built once per session)."""
    _build_c_tests()
    return BUILD


@pytest.fixture(scope="session")
def libpump():
    """The libpump.so the package installed (what pump-run preloads)."""
    return shim.shim_path()


class Run:
    """One run of a test program: its process, JSON lines and pump records."""

    def __init__(self, proc, records):
        self.proc = proc
        self.records = records
        self.lines = [json.loads(l) for l in proc.stdout.splitlines() if l.startswith("{")]

    @property
    def result(self):
        assert self.proc.returncode == 0, self.proc.stderr
        assert self.lines, self.proc.stdout
        return self.lines[-1]

    @property
    def totals(self):
        return stats.aggregate(self.records)


@pytest.fixture
def run_program(c_build, libpump, tmp_path):
    """run_program(name, *args, variant="plain", pump=True, env={}, driver=True, preexec=None).

    plain programs get the shim through LD_PRELOAD (pump=False runs them
    bare); sanitizer variants have it linked in. driver=False hides fakecuda
    (no libcuda.so.1 on the library path). preexec runs in the child before the program."""
    counter = [0]

    def run(name, *args, variant="plain", pump=True, env=None, driver=True, timeout=300, preexec=None):
        counter[0] += 1
        stats_dir = tmp_path / f"stats{counter[0]}"
        stats_dir.mkdir()
        full_env = clean_env()
        if driver:
            full_env["LD_LIBRARY_PATH"] = str(c_build / variant)
        else:
            full_env.pop("LD_LIBRARY_PATH", None)
        if pump:
            full_env["PUMP_STATS_DIR"] = str(stats_dir)
            if variant == "plain":
                full_env["LD_PRELOAD"] = str(libpump)
        full_env.update(env or {})
        program = c_build / variant / name
        proc = subprocess.run([str(program), *map(str, args)], env=full_env, capture_output=True, text=True,
                              timeout=timeout, preexec_fn=preexec)
        # pump's rule, checked in every run: fakecuda says when a driver entry point is called
        # while the calling thread holds one of pump's locks (shim/base/locks.h).
        assert LOCK_HELD_LINE not in proc.stderr, proc.stderr
        return Run(proc, stats.read_dir(stats_dir))

    return run
