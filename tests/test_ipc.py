"""IPC handles under managed_all, on fakecuda (which, as the driver, gives no
IPC handle of managed memory: CUDA_ERROR_INVALID_VALUE). A communication
library's own buffers, which it shares with other processes by IPC handle
(NCCL's P2P transport probes legacy IPC on a cudaMalloc buffer), stay device
memory, whether it calls the driver or the shared CUDA runtime; the same
allocation made by the program becomes managed, and the refused handle gets
one notice naming the way out."""

import pytest

MANAGED_ALL = {"PUMP_MANAGED_ALL": "1"}
SANITIZER_ENV = {"ASAN_OPTIONS": "detect_leaks=1:abort_on_error=0", "UBSAN_OPTIONS": "print_stacktrace=1",
                 "TSAN_OPTIONS": "halt_on_error=1:second_deadlock_stack=1"}
PATHS = ["driver", "runtime", "async"]  # cuMemAlloc, cudaMalloc in the shared runtime, cuMemAllocAsync


def shared(path, managed):
    """Two rounds of tests/c/ipc_share.h: IS_MANAGED, and what cuIpcGetMemHandle returned: success for
    device memory, CUDA_ERROR_INVALID_VALUE (1) for managed memory, the driver's answer unchanged
    (-1: not asked of stream-ordered memory)."""
    ipc = -1 if path == "async" else int(managed)
    return {"managed": [int(managed)] * 2, "ipc": [ipc] * 2}


def run_clean(run_program, *args, variant="plain", env=None, pump=True):
    run = run_program("ipc", *args, variant=variant, env=env, pump=pump, timeout=600)
    assert run.proc.returncode == 0, run.proc.stderr[-4000:]
    assert "Sanitizer" not in run.proc.stderr and "runtime error" not in run.proc.stderr, run.proc.stderr[-4000:]
    return run


@pytest.mark.parametrize("variant", ["plain", "asan", "tsan"])
@pytest.mark.parametrize("path", PATHS)
def test_a_communication_librarys_buffers_stay_device_memory(run_program, variant, path):
    env = dict(MANAGED_ALL, **SANITIZER_ENV)
    assert run_clean(run_program, "library", path, pump=False).result == shared(path, managed=False)
    run = run_clean(run_program, "library", path, variant=variant, env=env)
    assert run.result == shared(path, managed=False)
    assert run.proc.stderr == ""
    assert run.totals["managed_all_kept_shared"] == 2 and run.totals["managed_all_allocs"] == 0
    assert run.totals["ipc_refusals"] == 0


@pytest.mark.parametrize("variant", ["plain", "asan", "tsan"])
@pytest.mark.parametrize("path", PATHS)
def test_the_programs_own_allocation_is_made_managed_and_its_handle_refused_once(run_program, variant, path):
    env = dict(MANAGED_ALL, **SANITIZER_ENV)
    run = run_clean(run_program, "program", path, variant=variant, env=env)
    assert run.result == shared(path, managed=True)
    assert run.totals["managed_all_allocs"] == 2 and run.totals["managed_all_kept_shared"] == 0
    if path == "async":
        assert run.proc.stderr == ""
    else:
        (notice,) = run.proc.stderr.splitlines()
        assert "cuIpcGetMemHandle" in notice and "managed_all" in notice and "--no-managed-all" in notice
        assert run.totals["ipc_refusals"] == 2
    off = run_clean(run_program, "program", path, variant=variant, env=SANITIZER_ENV)
    assert off.result == shared(path, managed=False) and off.proc.stderr == ""


@pytest.mark.parametrize("variant", ["plain", "asan", "tsan"])
def test_a_refused_handle_of_the_programs_own_managed_memory_blames_nobody(run_program, variant):
    """The driver refuses an IPC handle of managed memory with or without pump: where the program
    allocated it managed itself, managed_all is not why, and pump says nothing."""
    env = dict(MANAGED_ALL, **SANITIZER_ENV)
    bare = run_clean(run_program, "program", "managed", pump=False)
    run = run_clean(run_program, "program", "managed", variant=variant, env=env)
    assert run.result == bare.result == {"managed": [1, 1], "ipc": [1, 1]}
    assert run.proc.stderr == "" and run.totals["ipc_refusals"] == 0
