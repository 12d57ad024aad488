"""PUMP_MANAGED_ALL on fakecuda: a program written for device memory gets
managed memory within the job's capacity (and so, prefetch), its stream-ordered
allocations come from a managed pool except in a capture or from a pool it
chose, memory queries report the capacity, and what cannot be managed is left
alone with one notice. Unset or 0, nothing changes."""

import pytest

MANAGED_ALL = {"PUMP_MANAGED_ALL": "1"}
CHUNK = 64 << 20  # tests/c/managed_all.c allocates 64 MiB at a time
PAGES_TWO_CHUNKS = 2 * CHUNK // (64 << 10)  # fakecuda faults per 64 KiB page


def bare_device_run(run_program):
    run = run_program("managed_all", "device", 2, pump=False)
    assert run.result["managed"] == [0, 0]
    assert run.result["gpu_faults"] == 0  # fakecuda's plain memory never faults
    return run.result


def test_device_allocations_become_managed_and_are_prefetched(run_program):
    bare = bare_device_run(run_program)
    run = run_program("managed_all", "device", 2, env=MANAGED_ALL)
    assert run.proc.stderr == ""
    assert run.result["managed"] == [1, 1]
    assert run.result["gpu_faults"] == 0
    assert run.result["checksum"] == bare["checksum"]
    totals = run.totals
    assert totals["managed_all_allocs"] == 2 and totals["managed_all_bytes"] == 2 * CHUNK
    assert totals["managed_allocs"] == totals["managed_frees"] == 2
    assert totals["launches_managed"] == totals["launches"] == 4
    assert totals["prefetch_bytes"] == 2 * CHUNK
    assert totals["errors"] == 0


def test_without_prefetch_the_managed_memory_faults(run_program):
    bare = bare_device_run(run_program)
    run = run_program("managed_all", "device", 2, env=dict(MANAGED_ALL, PUMP_POLICY="off"))
    assert run.result["managed"] == [1, 1]
    assert run.result["gpu_faults"] == PAGES_TWO_CHUNKS
    assert run.result["checksum"] == bare["checksum"]


@pytest.mark.parametrize("setting", [None, "0"])
def test_unset_or_zero_changes_nothing(run_program, setting):
    env = {} if setting is None else {"PUMP_MANAGED_ALL": setting}
    bare = bare_device_run(run_program)
    run = run_program("managed_all", "device", 2, env=env)
    assert run.proc.stderr == ""
    assert run.result == bare
    assert run.totals["managed_all_allocs"] == 0 and run.totals["managed_allocs"] == 0
    info = run_program("managed_all", "info", env=dict(env, PUMP_CAPACITY="1GiB"))
    assert info.result == run_program("managed_all", "info", pump=False).result
    async_run = run_program("managed_all", "async", env=env)
    assert async_run.result["managed"] == 0


def test_bad_value_warns_once_and_stays_off(run_program):
    run = run_program("managed_all", "device", 1, env={"PUMP_MANAGED_ALL": "yes"})
    (warning,) = run.proc.stderr.splitlines()
    assert "PUMP_MANAGED_ALL=yes" in warning and "allowed 0 or 1" in warning and "using 0" in warning
    assert run.result["managed"] == [0, 0]


def test_stream_ordered_allocations(run_program):
    bare = run_program("managed_all", "async", pump=False)
    assert bare.result == {"managed": 0, "values_ok": 1, "captured_managed": 0, "own_pool_managed": 1,
                           "chosen_pool_managed": 0}
    run = run_program("managed_all", "async", env=MANAGED_ALL)
    assert run.proc.stderr == ""
    # from the managed pool on a normal stream; as asked in a capture and from the pool the program chose
    assert run.result == dict(bare.result, managed=1)
    totals = run.totals
    assert totals["managed_all_allocs"] == 1 and totals["managed_all_captured"] == 1
    # the converted one and the one from the program's own managed pool, both freed in stream order
    assert totals["managed_allocs"] == totals["managed_frees"] == 2
    assert totals["managed_bytes"] == 0


@pytest.mark.parametrize("kind, env", [("alloc", MANAGED_ALL), ("async", MANAGED_ALL),
                                       ("pool", {}), ("pool", MANAGED_ALL)])
def test_capacity_refuses_past_the_cap(run_program, kind, env):
    """The cap holds for converted allocations and for any managed pool's."""
    assert run_program("managed_all", "fill", kind, 1024, pump=False).result == {"allocated_mib": 1024, "result": 0}
    run = run_program("managed_all", "fill", kind, 1024, env=dict(env, PUMP_CAPACITY="200MiB"))
    assert run.result == {"allocated_mib": 192, "result": 2}  # CUDA_ERROR_OUT_OF_MEMORY
    (refusal,) = run.proc.stderr.splitlines()
    assert "refused" in refusal and "--capacity" in refusal
    assert run.totals["capacity_refusals"] == 1
    assert run.totals["managed_bytes"] == 0 and run.totals["managed_bytes_peak"] == 192 << 20


def test_memory_queries_report_the_capacity(run_program):
    run = run_program("managed_all", "info", env=dict(MANAGED_ALL, PUMP_CAPACITY="1GiB"))
    assert run.result == {"free0": 1 << 30, "total0": 1 << 30, "free1": (1 << 30) - CHUNK, "total1": 1 << 30}
    # the default capacity: the device's free memory when first needed
    small = run_program("managed_all", "info", env=dict(MANAGED_ALL, FAKECUDA_DEVICE_MEMORY=str(4 << 30)))
    assert small.result["total0"] == small.result["free0"] == 4 << 30
    assert small.result["free1"] == (4 << 30) - CHUNK


TWO_SMALL_DEVICES = {"FAKECUDA_DEVICES": "2", "FAKECUDA_DEVICE_MEMORY": str(256 << 20)}


@pytest.mark.parametrize("kind", ["alloc", "async"])
def test_each_device_has_its_own_capacity_and_memory_answer(run_program, kind):
    """192 MiB on each of two 256 MiB devices. With one cap and one footprint per process
    (before issue 15), device 1 got 64 MiB, then CUDA_ERROR_OUT_OF_MEMORY, and its memory
    query answered free 0 (device 0's footprint). async: device 1's cap is resolved while
    device 0's context is current, from device 1's memory (device 0's has 64 MiB free then)."""
    bare = run_program("managed_all", "two", kind, 192, pump=False, env=TWO_SMALL_DEVICES)
    assert bare.result == {"allocated_mib": [192, 192], "result": [0, 0], "free_mib": [64, 64],
                           "total_mib": [256, 256], "free_after_mib": [256, 64]}
    run = run_program("managed_all", "two", kind, 192, env=dict(MANAGED_ALL, **TWO_SMALL_DEVICES))
    assert run.proc.stderr == ""
    # device 0's memory, freed while device 1 is current, comes back on device 0
    assert run.result == bare.result
    totals = run.totals
    assert totals["capacity_refusals"] == 0 and totals["managed_all_allocs"] == 6
    assert totals["capacity_bytes"] == 2 * (256 << 20)  # the caps of both devices
    assert totals["managed_bytes_peak"] == 2 * (192 << 20) and totals["managed_bytes"] == 0


def test_unmanageable_memory_is_left_alone_with_one_notice_each(run_program):
    bare = run_program("managed_all", "unmanageable", pump=False)
    assert bare.result == {"vmm": [0, 0], "ipc": [0, 0]}
    run = run_program("managed_all", "unmanageable", env=MANAGED_ALL)
    assert run.result == {"vmm": [0, 0], "ipc": [1, 1]}  # IPC of managed memory: CUDA_ERROR_INVALID_VALUE
    vmm, ipc = run.proc.stderr.splitlines()
    assert "cuMemCreate" in vmm and "expandable segments" in vmm
    assert "cuIpcGetMemHandle" in ipc and "--no-managed-all" in ipc and "PUMP_MANAGED_ALL=0" in ipc
    assert run.totals["vmm_allocs"] == 2 and run.totals["ipc_refusals"] == 2
    quiet = run_program("managed_all", "unmanageable")
    assert quiet.result == bare.result and quiet.proc.stderr == ""
    assert quiet.totals["ipc_refusals"] == 0


def test_no_concurrent_managed_access_keeps_device_memory(run_program):
    env = dict(MANAGED_ALL, FAKECUDA_CONCURRENT_MANAGED="0")
    bare = bare_device_run(run_program)
    run = run_program("managed_all", "device", 2, env=env)
    assert run.result == bare
    (notice,) = run.proc.stderr.splitlines()
    assert "managed_all is off" in notice and "concurrent managed access" in notice
    assert run.totals["managed_all_allocs"] == 0
    info = run_program("managed_all", "info", env=dict(env, PUMP_CAPACITY="1GiB"))
    assert info.result["total0"] == 80 << 30  # the driver's answer


@pytest.mark.parametrize("variant", ["asan", "tsan"])
@pytest.mark.parametrize("args", [["device", 2], ["async"], ["fill", "pool", 1024], ["unmanageable"],
                                  ["two", "async", 192]])
def test_under_sanitizers(run_program, variant, args):
    env = dict(MANAGED_ALL, **TWO_SMALL_DEVICES) if args[0] == "two" else dict(MANAGED_ALL, PUMP_CAPACITY="200MiB")
    env.update(ASAN_OPTIONS="detect_leaks=1:abort_on_error=0",
               UBSAN_OPTIONS="print_stacktrace=1", TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1")
    run = run_program("managed_all", *args, variant=variant, env=env, timeout=600)
    assert run.proc.returncode == 0, run.proc.stderr[-4000:]
    assert "Sanitizer" not in run.proc.stderr and "runtime error" not in run.proc.stderr, run.proc.stderr[-4000:]
    if args[0] == "device":
        assert run.result["managed"] == [1, 1] and run.result["gpu_faults"] == 0
    if args[0] == "two":
        assert run.result["allocated_mib"] == [192, 192]
