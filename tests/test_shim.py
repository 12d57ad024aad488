"""The shim on fakecuda: prefetch at launch through every path into the
driver, results identical to a run without pump, and the safety rules."""

import json
import os
import pathlib
import re
import subprocess
import time

import pytest

from helpers import PUMP_RUN, clean_env

MiB, GiB = 1 << 20, 1 << 30

PAGES_256_MIB = 256 * 1024 // 64  # fakecuda faults per 64 KiB page
PROGRAMS = ["touch_linked", "touch_procaddr"]


def bare_checksum(run_program, program, *args):
    run = run_program(program, *args, pump=False)
    assert run.result["gpu_faults"] == run.result["expected_faults"]
    return run.result["checksum"]


@pytest.mark.parametrize("program", PROGRAMS)
def test_policy_off_faults_equal_pages_touched(run_program, program):
    run = run_program(program, env={"PUMP_POLICY": "off"})
    assert run.result["expected_faults"] == PAGES_256_MIB
    assert run.result["gpu_faults"] == PAGES_256_MIB
    assert run.result["checksum"] == bare_checksum(run_program, program)
    assert run.totals["prefetch_calls"] == 0
    assert run.totals["launches"] == 6
    assert run.totals["launches_managed"] == 6


@pytest.mark.parametrize("program", PROGRAMS)
def test_policy_launch_prefetches_everything(run_program, program):
    run = run_program(program)
    assert run.result["gpu_faults"] == 0
    assert run.result["checksum"] == bare_checksum(run_program, program)
    totals = run.totals
    assert totals["launches"] == 6
    assert totals["launches_managed"] == 6
    # Each buffer moves once: later launches believe it resident.
    assert totals["prefetch_bytes"] == 256 << 20
    assert totals["resident_skips"] > 0
    assert totals["errors"] == 0
    assert run.result["bytes_prefetched_h2d"] == 256 << 20
    # CUDA 13's batch call, one per launch that needed a prefetch
    assert run.result["batch_prefetch_calls"] == totals["prefetch_calls"] == totals["launches_prefetched"]


@pytest.mark.parametrize("program", PROGRAMS)
def test_wait_off_lets_kernels_race_their_prefetch(run_program, program):
    run = run_program(program, env={"PUMP_WAIT": "0"})
    faults = run.result["gpu_faults"]
    assert 0 <= faults <= PAGES_256_MIB
    assert run.result["checksum"] == bare_checksum(run_program, program)
    print(f"{program}: PUMP_WAIT=0 -> {faults} GPU faults of {PAGES_256_MIB} pages")


@pytest.mark.parametrize("program", PROGRAMS)
def test_beliefs_expire_after_host_touches(run_program, program):
    """Between iterations the host rewrites buffer A (after a synchronize):
    pump must prefetch it again rather than trust an old belief."""
    off = run_program(program, 3, env={"PUMP_POLICY": "off"})
    assert off.result["gpu_faults"] == off.result["expected_faults"] == PAGES_256_MIB + 2 * PAGES_256_MIB // 4
    on = run_program(program, 3)
    assert on.result["gpu_faults"] == 0
    assert on.result["checksum"] == off.result["checksum"]
    assert on.totals["epochs"] >= 2


@pytest.mark.parametrize("program", PROGRAMS)
def test_capturing_stream_gets_no_prefetch(run_program, program):
    run = run_program(program, 1, "--capture")
    assert run.result["checksum"] == bare_checksum(run_program, program)
    assert run.result["gpu_faults"] == 0
    # the captured launch and the one on a stream that joined the capture
    assert run.totals["launches_captured"] == 2
    assert run.totals["graph_launches"] == 1


def test_bare_run_matches_expectations(run_program):
    run = run_program("touch_linked", pump=False)
    assert run.result["gpu_faults"] == PAGES_256_MIB
    assert run.records == []


def test_threads(run_program):
    run = run_program("threads", 8, 200)
    assert run.result["failures"] == 0
    assert run.totals["launches"] == 8 * 200
    assert run.totals["errors"] == 0


def test_fork_child_before_cuda_keeps_working(run_program):
    run = run_program("fork", "before")
    assert run.proc.returncode == 0, run.proc.stderr
    (child,) = [l for l in run.lines if l["who"] == "child"]
    assert child["ok"] and child["gpu_faults"] == 0
    assert not any(r["passthrough"] for r in run.records)


def test_fork_child_after_cuda_passes_through(run_program):
    run = run_program("fork", "after")
    assert run.proc.returncode == 0, run.proc.stderr
    assert [l["who"] for l in run.lines] == ["parent", "parent-after-fork"]
    assert all(l["ok"] and l["gpu_faults"] == 0 for l in run.lines)
    parent = [r for r in run.records if not r["passthrough"]]
    child = [r for r in run.records if r["passthrough"]]
    assert len(parent) == 1 and len(child) == 1
    assert child[0]["passthrough_reason"] == "forked after CUDA init"
    assert child[0]["parent_pid"] == parent[0]["pid"]
    assert child[0]["exited"] == 1 and child[0]["launches"] == 0


@pytest.mark.parametrize("variant", ["plain", "asan", "tsan"])
def test_a_fork_does_not_wait_for_a_driver_call_of_pumps(run_program, tmp_path, variant):
    """Issue 42, risk 4: a thread of the job is inside the prefetch pump's launch rule made for
    its kernel (no lock or turn held: the turn ends once the moves are queued), held there by
    fakecuda until the test lets it go; another thread forks. The fork returns at once, the
    child exits, the kernel's values are right. Before, the fork waited for every turn under the device locks (here 3 s, until
    the program's watchdog let the call go)."""
    release = tmp_path / "release"
    run = run_program("fork_turn", release, variant=variant, timeout=120,
                      env={"PUMP_POLICY": "launch", "PUMP_SOCKET": "", "FAKECUDA_HOLD_PREFETCH": str(release),
                           "TSAN_OPTIONS": "halt_on_error=1"})
    assert run.proc.returncode == 0 and "Sanitizer" not in run.proc.stderr, run.proc.stderr[-3000:]
    assert run.result == {"fork_waited": False, "held": True, "ok": True}
    assert run.totals["errors"] == 0


def test_dlopen_recursion(run_program, c_build):
    run = run_program("recursion", c_build / "plain" / "recursion_lib.so", timeout=60)
    assert run.proc.returncode == 0, run.proc.stderr
    assert run.proc.stdout.strip() == "ok"
    assert run.totals["managed_allocs"] == 2


def test_libcuda_missing_is_pure_pass_through(run_program):
    bare = run_program("touch_procaddr", pump=False, driver=False)
    run = run_program("touch_procaddr", driver=False)
    assert run.proc.returncode == bare.proc.returncode == 4
    assert run.proc.stdout == bare.proc.stdout
    assert run.proc.stderr == bare.proc.stderr == "no CUDA driver\n"
    assert run.records == []


@pytest.mark.parametrize("command", [["true"], ["sh", "-c", "echo hello; ls / >/dev/null; exit 7"]])
def test_program_that_never_uses_cuda(libpump, tmp_path, command):
    env = dict(os.environ, PUMP_STATS_DIR=str(tmp_path))
    bare = subprocess.run(command, capture_output=True, env=env)
    under = subprocess.run(command, capture_output=True, env=dict(env, LD_PRELOAD=str(libpump)))
    assert (under.returncode, under.stdout, under.stderr) == (bare.returncode, bare.stdout, bare.stderr)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("failing, code", [("cuMemAllocManaged", 2), ("cuLaunchKernel", 719),
                                           ("cuMemAlloc_v2", 2), ("cuLaunchKernelEx", 1)])
def test_driver_errors_reach_the_program_unchanged(run_program, failing, code):
    env = {"FAKECUDA_FAIL": f"{failing}={code}"}
    bare = run_program("touch_linked", pump=False, env=env)
    run = run_program("touch_linked", env=env)
    assert bare.proc.returncode == run.proc.returncode == 3
    assert f"returned {code}" in bare.proc.stderr
    assert run.proc.stderr == bare.proc.stderr


def test_bad_pump_values_warn_once_and_use_defaults(run_program):
    run = run_program("touch_linked", env={"PUMP_POLICY": "fast", "PUMP_WAIT": "maybe", "PUMP_LOG": "9",
                                           "PUMP_CAPACITY": "lots", "PUMP_EPOCH_LAUNCHES": "-1",
                                           "PUMP_KERNEL_TIMES": "yes"})
    warnings = run.proc.stderr.splitlines()
    assert len(warnings) == 6, warnings
    for var in ["PUMP_POLICY=fast", "PUMP_WAIT=maybe", "PUMP_LOG=9", "PUMP_CAPACITY=lots", "PUMP_EPOCH_LAUNCHES=-1",
                "PUMP_KERNEL_TIMES=yes"]:
        assert sum(var in w for w in warnings) == 1
    assert all("allowed" in w for w in warnings)
    assert run.result["gpu_faults"] == 0  # the default policy still prefetches


def test_capacity_refuses_past_the_cap(run_program):
    run = run_program("touch_linked", env={"PUMP_CAPACITY": "200MiB"})
    assert run.proc.returncode == 3
    lines = run.proc.stderr.splitlines()
    (refusal,) = [l for l in lines if "refused" in l]
    assert "--capacity" in refusal and "host" in refusal
    assert "returned 2" in run.proc.stderr  # CUDA_ERROR_OUT_OF_MEMORY
    assert run.totals["capacity_refusals"] == 1
    assert run.totals["capacity_bytes"] == 200 << 20


def test_default_capacity_is_free_device_memory(run_program):
    small = {"FAKECUDA_DEVICE_MEMORY": str(192 << 20)}
    refused = run_program("touch_linked", env=small)
    assert refused.proc.returncode == 3
    assert refused.totals["capacity_bytes"] == 192 << 20
    bare = run_program("touch_linked", pump=False)
    for cap in ["host", "1GiB"]:
        ok = run_program("touch_linked", env=dict(small, PUMP_CAPACITY=cap))
        assert ok.proc.returncode == 0 and ok.result["checksum"] == bare.result["checksum"], cap


def own_memory_cgroup():
    """(directory, v2) of this process's memory cgroup where it can be written (root), else None."""
    lines = pathlib.Path("/proc/self/cgroup").read_text().splitlines()
    mounts = [l.split(" - ") for l in pathlib.Path("/proc/self/mountinfo").read_text().splitlines()]
    for v2 in (False, True):
        path = next((l.split(":", 2)[2] for l in lines if (l.startswith("0::") if v2 else "memory" in l.split(":")[1].split(","))), None)
        for head, tail in mounts:
            kind, _, options = tail.split(" ", 2)
            if path and (kind == "cgroup2" if v2 else kind == "cgroup" and "memory" in options.split(",")):
                root, point = head.split(" ")[3:5]
                d = pathlib.Path(point + (path[len(root):] if root != "/" else path))
                if (d / ("memory.max" if v2 else "memory.limit_in_bytes")).exists() and os.access(d, os.W_OK):
                    return d, v2
    return None


def test_capacity_host_is_bounded_by_the_memory_cgroup_less_a_reserve(run_program, tmp_path):
    """--capacity host on a 256 MiB device, in a memory cgroup limited to the reserve (the larger
    of 2 GiB and 5% of MemTotal) and 512 MiB more: the cap is the device and what the cgroup leaves
    less the reserve, not the host's MemAvailable; one line says how it was made."""
    found = own_memory_cgroup()
    if found is None:
        pytest.skip("no writable memory cgroup here (the test needs root, as in CI)")
    parent, v2 = found
    total = int(re.search(r"MemTotal:\s+(\d+) kB", pathlib.Path("/proc/meminfo").read_text()).group(1)) * 1024
    reserve = max(2 * GiB, total // 20)
    group = parent / f"pump-test-{os.getpid()}"
    group.mkdir()
    try:
        (group / ("memory.max" if v2 else "memory.limit_in_bytes")).write_text(str(reserve + 512 * MiB))
        enter = lambda: (group / "cgroup.procs").write_text(str(os.getpid()))
        run = run_program("touch_linked", env={"FAKECUDA_DEVICE_MEMORY": str(256 * MiB), "PUMP_CAPACITY": "host"},
                          preexec=enter)
        assert run.proc.returncode == 0, run.proc.stderr
        room = run.totals["capacity_bytes"] - 256 * MiB
        assert 512 * MiB - 64 * MiB < room <= 512 * MiB, (room, run.proc.stderr)   # less what the job holds
        (said,) = [l for l in run.proc.stderr.splitlines() if "capacity host:" in l]
        assert "the job's memory cgroup leaves" in said and f"less {reserve / GiB:.1f} GiB kept" in said, said
    finally:
        group.rmdir()


# touch's 256 MiB on a 192 MiB device: fakecuda's driver evicts at the device's size, so
# without a budget of pump's own its prefetches pushed each other out (4,096 faults, as many
# as with no prefetching at all). pump's default budget (budget.c: the device less foreign
# memory and a margin, from 1/128 of the device) makes room itself: what faults is only the part
# of the largest launch (add: a, b and c, 192 MiB) that cannot fit beside the margin. `out`, a
# plain allocation of 8 bytes (256 of fakecuda's), made after the first managed allocation and
# not through managed_all, is not in the ledger: the managed memory could account for it, and
# the margin covers it.
@pytest.mark.parametrize("cap", ["host", "1GiB"])
def test_capacity_above_the_device_holds_a_default_budget(run_program, cap):
    device = 192 << 20
    run = run_program("touch_linked", env={"FAKECUDA_DEVICE_MEMORY": str(device), "PUMP_CAPACITY": cap})
    t = run.totals
    block = 2 << 20
    margin = -(-device // 128 // block) * block   # whole blocks
    assert t["default_budget_bytes"] == t["budget_bytes"] == (device - margin) // block * block, cap
    assert t["resident_bytes_peak"] <= t["budget_bytes"]
    largest_launch = 192 << 20
    assert 0 < run.result["gpu_faults"] <= (largest_launch - t["budget_bytes"]) // (64 << 10), cap
    assert run.result["checksum"] == bare_checksum(run_program, "touch_linked")
    assert t["budget_rereads"] == 1 and t["budget_changes"] == 0  # one synchronisation, nothing changed


def test_default_budget_only_above_the_device(run_program):
    """The default capacity (the device's free memory) keeps managed memory within the
    device: no default budget, and no driver call for one."""
    run = run_program("touch_linked", 2, env={"FAKECUDA_DEVICE_MEMORY": str(1 << 30)})
    t = run.totals
    assert t["default_budget_bytes"] == t["budget_bytes"] == t["budget_rereads"] == 0
    assert run.result["gpu_faults"] == 0


def test_capacity_percentage(run_program):
    run = run_program("touch_linked", env={"FAKECUDA_DEVICE_MEMORY": str(1 << 30), "PUMP_CAPACITY": "50%"})
    assert run.result["gpu_faults"] == 0
    assert run.totals["capacity_bytes"] == 512 << 20
    assert run.totals["managed_bytes_peak"] == 256 << 20


def test_old_driver_without_batch_or_param_info(run_program):
    """CUDA 12.2 driver: no cuMemPrefetchBatchAsync and no GetParamInfo. The
    kernelParams launches cannot be scanned; the `extra` launch still can."""
    run = run_program("touch_linked", env={"FAKECUDA_DRIVER_VERSION": "12020"})
    assert run.result["checksum"] == bare_checksum(run_program, "touch_linked")
    assert run.totals["launches_unscanned"] == 5
    assert run.totals["launches_prefetched"] == 1
    assert run.totals["errors"] == 0


def test_driver_with_param_info_but_no_batch(run_program):
    run = run_program("touch_linked", env={"FAKECUDA_DRIVER_VERSION": "12080"})
    assert run.result["gpu_faults"] == 0
    assert run.result["batch_prefetch_calls"] == 0
    assert run.totals["prefetch_calls"] == run.totals["prefetch_ranges"]


@pytest.mark.parametrize("variant", ["asan", "tsan"])
@pytest.mark.parametrize("program, args", [("touch_linked", [2]), ("touch_procaddr", [2, "--capture"]),
                                           ("threads", [4, 50]), ("fork", ["after"]), ("fork", ["before"])])
def test_under_sanitizers(run_program, variant, program, args):
    env = {"ASAN_OPTIONS": "detect_leaks=1:abort_on_error=0", "UBSAN_OPTIONS": "print_stacktrace=1",
           "TSAN_OPTIONS": "halt_on_error=1:second_deadlock_stack=1"}
    run = run_program(program, *args, variant=variant, env=env, timeout=600)
    assert run.proc.returncode == 0, run.proc.stderr[-4000:]
    assert "Sanitizer" not in run.proc.stderr and "runtime error" not in run.proc.stderr, run.proc.stderr[-4000:]
    if program.startswith("touch"):
        assert run.result["gpu_faults"] == 0


@pytest.mark.parametrize("variant", ["asan", "tsan"])
def test_recursion_under_sanitizers(run_program, c_build, variant):
    run = run_program("recursion", c_build / variant / "recursion_lib.so", variant=variant,
                      env={"ASAN_OPTIONS": "detect_leaks=1", "TSAN_OPTIONS": "halt_on_error=1"}, timeout=120)
    assert run.proc.returncode == 0, run.proc.stderr[-4000:]


def test_decoy_word_costs_a_useless_prefetch(run_program):
    """The extent rule's cost, counted: an integer argument that happens to
    equal an address inside an allocation prefetches it for nothing."""
    run = run_program("touch_linked", 1, "--decoy")
    assert run.result["gpu_faults"] == 0
    assert run.result["checksum"] == bare_checksum(run_program, "touch_linked")
    assert run.result["bytes_prefetched_unused"] == 16 << 20
    assert run.totals["prefetch_bytes"] == (256 + 16) << 20
    assert run.totals["scan_hits"] > run.totals["launches_managed"]


def test_exit_while_another_thread_is_inside_the_driver(run_program):
    start = time.monotonic()
    run = run_program("exit_busy", timeout=30)
    elapsed = time.monotonic() - start
    assert run.result == {"exiting": True}
    assert elapsed < 3, elapsed  # the kernel it abandons sleeps 5 s
    (record,) = run.records
    assert record["exited"] == 1


@pytest.mark.parametrize("program", ["units", "units_channel", "units_tensor_lists"])
@pytest.mark.parametrize("variant", ["plain", "asan", "tsan"])
def test_shim_units(c_build, variant, program):
    proc = subprocess.run([str(c_build / variant / program)], capture_output=True, text=True, timeout=300,
                          env={"TSAN_OPTIONS": "halt_on_error=1", "ASAN_OPTIONS": "detect_leaks=1"})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().startswith(f"{program}: ") and proc.stdout.strip().endswith(", 0 failed")


def pump_run_job(c_build, tmp_path, *command, flags=()):
    """pump-run (the installed console script) over fakecuda programs."""
    stats_file = tmp_path / "stats.json"
    env = dict(clean_env(), LD_LIBRARY_PATH=str(c_build / "plain"))
    proc = subprocess.run([PUMP_RUN, "--stats", str(stats_file), *flags, *map(str, command)], env=env,
                          capture_output=True, text=True, timeout=300)
    return proc, json.loads(stats_file.read_text())


def test_pump_run_whole_process_tree(c_build, tmp_path):
    plain = c_build / "plain"
    proc, doc = pump_run_job(c_build, tmp_path, "sh", "-c", f"{plain}/touch_linked && {plain}/touch_procaddr")
    assert proc.returncode == 0, proc.stderr
    results = [json.loads(l) for l in proc.stdout.splitlines()]
    assert [r["gpu_faults"] for r in results] == [0, 0]
    assert len(doc["processes"]) == 2
    assert doc["totals"]["launches"] == 12
    # each process's 256 MiB of managed buffers, and its 8-byte result buffer, which
    # pump-run's default --managed-all made managed memory
    assert doc["totals"]["prefetch_bytes"] == 2 * ((256 << 20) + 8)
    assert doc["totals"]["managed_all_allocs"] == 2
    (summary,) = proc.stderr.splitlines()
    assert summary.startswith("pump: 12 launches (12 on managed memory)")
    assert "512.0 MiB prefetched" in summary and "2 processes" in summary


def test_pump_run_policy_off(c_build, tmp_path):
    proc, doc = pump_run_job(c_build, tmp_path, c_build / "plain" / "touch_linked", flags=["--policy", "off"])
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["gpu_faults"] == PAGES_256_MIB
    assert doc["totals"]["prefetch_calls"] == 0


def test_pump_run_capacity_flag(c_build, tmp_path):
    proc, doc = pump_run_job(c_build, tmp_path, c_build / "plain" / "touch_linked",
                             flags=["--capacity", "128MiB", "--quiet"])
    assert proc.returncode == 3
    assert doc["totals"]["capacity_refusals"] == 1
    assert [l for l in proc.stderr.splitlines() if l.startswith("pump:")] == []  # --quiet
    assert "--capacity host lets it" not in proc.stderr


def test_pump_run_names_capacity_host_after_a_refusal(c_build, tmp_path):
    """A job refused memory at its capacity (by default the GPU's free memory) ends with a line
    that counts the refusals and names --capacity host and its cost; none once it is host."""
    touch = c_build / "plain" / "touch_linked"
    small = {"FAKECUDA_DEVICE_MEMORY": str(192 * MiB)}
    stats_file = tmp_path / "s.json"
    run = lambda *flags: subprocess.run([PUMP_RUN, *flags, str(touch)], capture_output=True, text=True, timeout=300,
                                        env=dict(clean_env(), LD_LIBRARY_PATH=str(c_build / "plain"), **small))
    proc = run()
    assert proc.returncode == 3, proc.stderr
    assert proc.stderr.splitlines()[-1] == (
        "pump-run: 1 allocation refused at the job's capacity (192.0 MiB: by default the GPU's free memory at its "
        "first allocation); --capacity host lets it go beyond GPU memory into host memory, where what does not "
        "fit on the GPU crosses the link each time it is used: slower, never wrong"), proc.stderr
    proc = run("--capacity", "128MiB")
    assert "(128.0 MiB: --capacity 128MiB); --capacity host lets it" in proc.stderr.splitlines()[-1]
    proc = run("--capacity", "host", "--stats", str(stats_file))
    assert proc.returncode == 0 and "--capacity host lets it" not in proc.stderr, proc.stderr


@pytest.mark.parametrize("mode", ["bare", "pump"])
def test_lookup_routing(run_program, mode):
    """cuGetProcAddress and dlsym answer with pump's hook of exactly the ABI
    variant the driver picked (version, per-thread stream), leave every other
    lookup alone, and keep RTLD_NEXT relative to the real caller."""
    run = run_program("routing", mode, pump=mode == "pump")
    assert run.proc.returncode == 0, run.proc.stderr
    assert run.proc.stdout.strip().endswith(" passed, 0 failed")


@pytest.mark.parametrize("program", PROGRAMS)
def test_prefetch_goes_to_the_kernels_device(run_program, program):
    two = {"FAKECUDA_DEVICES": "2"}
    off = run_program(program, 2, "--device=1", env=dict(two, PUMP_POLICY="off"))
    assert off.result["gpu_faults"] == off.result["expected_faults"]
    run = run_program(program, 2, "--device=1", env=two)
    assert run.result["gpu_faults"] == 0
    assert run.result["checksum"] == off.result["checksum"]


def test_logging_is_rate_limited(run_program):
    """The real runtime's bootstrap makes dozens of hooked lookups (59) in well
    under a second; PUMP_LOG=2 logs each, at most 20 lines a second. A second is
    the clock's (shim/base/log.c), so a run that crosses into the next one may
    log 20 more there, after a line counting what the first suppressed: 25 lines
    in one CI run under load, where 21 was the bound."""
    quiet = run_program("runtime_static")
    assert quiet.proc.stderr == ""  # logging is off by default
    start = time.monotonic()
    loud = run_program("runtime_static", env={"PUMP_LOG": "2"})
    seconds_spanned = int(time.monotonic() - start) + 2
    lines = loud.proc.stderr.splitlines()
    hooks = loud.records[0]["procaddr_hooks"]
    assert hooks > 21 * 2
    assert 10 <= len(lines) <= 21 * seconds_spanned and len(lines) < hooks, lines
    assert all(l.startswith("pump[") for l in lines)


def test_unusable_stats_dir_changes_nothing(run_program, tmp_path):
    run = run_program("touch_linked", env={"PUMP_STATS_DIR": str(tmp_path / "missing" / "dir")})
    assert run.proc.stderr == ""
    assert run.result["gpu_faults"] == 0


@pytest.mark.parametrize("variant", ["plain", "tsan"])
def test_a_free_forgets_its_own_allocation_not_the_next_at_its_address(run_program, variant):
    """Threads allocate and free managed memory of one size, so the driver hands one thread the
    address another has just freed: every allocation pump tracked is forgotten by its own free,
    and the footprint ends at zero."""
    run = run_program("free_race", 4, 2000, variant=variant, env={"TSAN_OPTIONS": "halt_on_error=1"}, timeout=600)
    assert run.proc.returncode == 0, run.proc.stderr[-4000:]
    assert run.totals["managed_allocs"] == 4 * 2000
    assert run.totals["managed_frees"] == run.totals["managed_allocs"]
    assert run.totals["managed_bytes"] == 0
