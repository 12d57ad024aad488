"""pump in a host where a driver or a stacked interposer calls back into exported names
(item 9 of the issue "What a real job would hit today").

tests/c/unbound_driver.c is a driver linked without -Bsymbolic: its cuGetProcAddress
answers with pump's hooks (its addresses of its own exports bind to pump's), and its
cuMemAllocManaged calls cuMemGetInfo_v2 through the PLT, into pump's hook. Before the fix
pump took its own cuMemGetInfo_v2 hook as the driver's: under managed_all,
cuMemAllocManaged -> capacity (lock held) -> pump's cuMemGetInfo_v2 -> capacity -> the
same lock, and the program hung (killed by `timeout` after 10 s, exit status 124). With
the fix but without the per-thread guard, the driver's own 200 memory queries (4 threads
x 50 allocations) got pump's capacity view instead of its own function's answer. And a
process without libcuda asking dlsym(RTLD_DEFAULT, "cuLaunchKernel") got pump's export,
where without pump it gets NULL and a dlerror().

tests/c/naive_interposer.c is a second shim preloaded after pump whose dlsym (exported as
dlsym@GLIBC_2.34, as nvshare's is) answers driver names from RTLD_DEFAULT, that is with
pump's own exports. Before the fix pump took its own cuGetProcAddress_v2 hook as the
driver's, and the program died of the endless recursion (SIGSEGV, exit status 139)."""

import json
import subprocess

import pytest

from helpers import clean_env
from pump import stats

THREADS, ALLOCATIONS = 4, 50


def run_unbound(c_build, libpump, tmp_path, variant, pump=True, env=None):
    full_env = dict(clean_env(), LD_LIBRARY_PATH=str(c_build / variant / "unbound_driver"),
                    ASAN_OPTIONS="detect_leaks=1", TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1",
                    UBSAN_OPTIONS="print_stacktrace=1")
    if pump:
        full_env.update(PUMP_STATS_DIR=str(tmp_path), PUMP_MANAGED_ALL="1", PUMP_CAPACITY="host")
        if variant == "plain":
            full_env["LD_PRELOAD"] = str(libpump)
    full_env.update(env or {})
    proc = subprocess.run([str(c_build / variant / "unbound"), str(THREADS), str(ALLOCATIONS)], env=full_env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "Sanitizer" not in proc.stderr and "runtime error" not in proc.stderr, proc.stderr[-4000:]
    return json.loads(proc.stdout), stats.aggregate(stats.read_dir(tmp_path)) if pump else None


@pytest.mark.parametrize("variant", ["plain", "asan", "tsan"])
def test_a_driver_calling_back_into_exported_names(c_build, libpump, tmp_path, variant):
    result, totals = run_unbound(c_build, libpump, tmp_path, variant)
    assert result["failures"] == 0
    # every query the driver made from inside cuMemAllocManaged reached its own function
    assert result["foreign_answers"] == 0
    # and pump did its work in the outer hooks: each allocation counted and tracked
    # (frees are not compared: the driver hands freed addresses straight out again, and
    # pump forgets an allocation only after the driver's free returns, so another thread's
    # new allocation at that address can be taken for the freed one)
    assert totals["managed_allocs"] == THREADS * ALLOCATIONS
    assert totals["capacity_refusals"] == 0


def test_a_stacked_interposer_answering_with_pumps_own_hooks(c_build, libpump, tmp_path):
    plain = c_build / "plain"
    env = dict(clean_env(), LD_LIBRARY_PATH=str(plain), PUMP_STATS_DIR=str(tmp_path), PUMP_LOG="1",
               LD_PRELOAD=f"{libpump}:{plain / 'libnaive_interposer.so'}")
    proc = subprocess.run([str(plain / "touch_procaddr")], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert json.loads(proc.stdout.splitlines()[-1])["gpu_faults"] == 0  # pump prefetched as usual
    assert proc.stderr.count("taken from libcuda's handle instead") == 1  # said once
    assert stats.aggregate(stats.read_dir(tmp_path))["errors"] == 0


@pytest.mark.parametrize("variant", ["plain", "asan", "tsan"])
def test_is_cuda_here_probe_answers_as_without_pump(c_build, libpump, tmp_path, variant):
    """dlsym(RTLD_DEFAULT, "cuLaunchKernel") before any libcuda is loaded."""
    bare, _ = run_unbound(c_build, libpump, tmp_path, "plain", pump=False)
    under, _ = run_unbound(c_build, libpump, tmp_path, variant)
    assert bare["probe"] is False and bare["probe_dlerror"] is True
    assert (under["probe"], under["probe_dlerror"]) == (bare["probe"], bare["probe_dlerror"])
