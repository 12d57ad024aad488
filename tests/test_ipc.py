"""IPC handles under managed_all, on fakecuda (which, as the driver, gives no
IPC handle of managed memory: CUDA_ERROR_INVALID_VALUE). A communication
library's own buffers, which it shares with other processes by IPC handle
(NCCL's P2P transport probes legacy IPC on a cudaMalloc buffer), stay device
memory, whether it calls the driver or the shared CUDA runtime; the same
allocation made by the program becomes managed, and the refused handle gets
one notice naming the way out."""

import pytest

MANAGED_ALL = {"PUMP_MANAGED_ALL": "1"}
DEVICE_MEMORY = {"managed": [0, 0], "ipc": [0, 0]}
REFUSED = {"managed": [1, 1], "ipc": [1, 1]}  # CUDA_ERROR_INVALID_VALUE, the driver's answer unchanged
SANITIZER_ENV = {"ASAN_OPTIONS": "detect_leaks=1:abort_on_error=0", "UBSAN_OPTIONS": "print_stacktrace=1",
                 "TSAN_OPTIONS": "halt_on_error=1:second_deadlock_stack=1"}


def run_clean(run_program, *args, variant="plain", env=None, pump=True):
    run = run_program("ipc", *args, variant=variant, env=env, pump=pump, timeout=600)
    assert run.proc.returncode == 0, run.proc.stderr[-4000:]
    assert "Sanitizer" not in run.proc.stderr and "runtime error" not in run.proc.stderr, run.proc.stderr[-4000:]
    return run


@pytest.mark.parametrize("variant", ["plain", "asan", "tsan"])
@pytest.mark.parametrize("path", ["driver", "runtime"])
def test_a_communication_librarys_buffers_stay_device_memory(run_program, variant, path):
    env = dict(MANAGED_ALL, **SANITIZER_ENV)
    assert run_clean(run_program, "library", path, pump=False).result == DEVICE_MEMORY
    run = run_clean(run_program, "library", path, variant=variant, env=env)
    assert run.result == DEVICE_MEMORY
    assert run.proc.stderr == ""
    assert run.totals["managed_all_kept_shared"] == 2 and run.totals["managed_all_allocs"] == 0
    assert run.totals["ipc_refusals"] == 0


@pytest.mark.parametrize("variant", ["plain", "asan", "tsan"])
@pytest.mark.parametrize("path", ["driver", "runtime"])
def test_the_programs_own_allocation_is_made_managed_and_its_handle_refused_once(run_program, variant, path):
    env = dict(MANAGED_ALL, **SANITIZER_ENV)
    run = run_clean(run_program, "program", path, variant=variant, env=env)
    assert run.result == REFUSED
    (notice,) = run.proc.stderr.splitlines()
    assert "cuIpcGetMemHandle" in notice and "managed_all" in notice and "--no-managed-all" in notice
    assert run.totals["managed_all_allocs"] == 2 and run.totals["managed_all_kept_shared"] == 0
    assert run.totals["ipc_refusals"] == 2
    off = run_clean(run_program, "program", path, variant=variant, env=SANITIZER_ENV)
    assert off.result == DEVICE_MEMORY and off.proc.stderr == ""
