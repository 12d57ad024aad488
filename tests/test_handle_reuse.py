"""A kernel handle's address handed to another kernel after an unload (tests/c/handle_reuse.c).

fakecuda gives a freed function object's address to the next handle it makes, as a heap
would (FAKECUDA_HANDLE_REUSE, on by default). A 16-pointer kernel is launched, its module
(or library) unloaded, and a 2-parameter kernel of the next module gets the same address.
pump must scan that launch with the new kernel's layout: with the old one it reads
kernelParams[2..15] past the launch's array (ASan: heap-buffer-overflow; padded, the reads
show as 16 scanned words instead of 2)."""

import pytest

WIDE_WORDS = 16  # the first launch's pointers
NARROW_WORDS = 2  # narrow(float *x, uint64_t n)


def reuse_run(run_program, how, layout, program="handle_reuse", variant="plain", pump=True):
    env = {"PUMP_SOCKET": "", "PUMP_POLICY": "launch", "FAKECUDA_PARAM_INFO_OTHER_KIND": "garbage",
           "ASAN_OPTIONS": "detect_leaks=1"}
    run = run_program(program, how, layout, variant=variant, pump=pump, env=env)
    assert run.proc.returncode == 0, run.proc.stderr[-4000:]
    assert "Sanitizer" not in run.proc.stderr and "runtime error" not in run.proc.stderr, run.proc.stderr[-4000:]
    return run


@pytest.mark.parametrize("program", ["handle_reuse", "handle_reuse_procaddr"])
@pytest.mark.parametrize("how", ["module", "library"])
def test_reused_handle_is_scanned_with_its_own_layout(run_program, program, how):
    bare = reuse_run(run_program, how, "padded", program, pump=False).result
    assert bare["same_handle"] is True  # fakecuda handed the freed address out again
    assert bare["faults"] == 4  # 256 KiB of 64 KiB pages, written by the host
    run = reuse_run(run_program, how, "padded", program)
    assert run.result == {"same_handle": True, "faults": 0, "checksum": bare["checksum"]}
    totals = run.totals
    assert totals["launches"] == 2 and totals["launches_unscanned"] == 0
    assert totals["scan_words"] == WIDE_WORDS + NARROW_WORDS
    # each launch counted by its own handle's kind, though the thread's last handle had that address
    wide_kind = "launches_kernel_handles" if how == "library" else "launches_function_handles"
    counted = {kind: totals[kind] for kind in ("launches_kernel_handles", "launches_function_handles")}
    assert counted == {"launches_kernel_handles": int(wide_kind == "launches_kernel_handles"),
                       "launches_function_handles": 1 + int(wide_kind == "launches_function_handles")}


@pytest.mark.parametrize("how", ["module", "library"])
def test_reused_handle_sanitized(run_program, how):
    run = reuse_run(run_program, how, "exact", variant="asan")
    assert run.result["same_handle"] is True and run.result["faults"] == 0
    assert run.totals["scan_words"] == WIDE_WORDS + NARROW_WORDS


def test_reuse_can_be_turned_off(run_program):
    run = run_program("handle_reuse", "module", "padded", pump=False, env={"FAKECUDA_HANDLE_REUSE": "0"})
    assert run.proc.returncode == 0, run.proc.stderr[-4000:]
    assert run.result["same_handle"] is False
    bad = run_program("handle_reuse", "module", "padded", pump=False, env={"FAKECUDA_HANDLE_REUSE": "sometimes"})
    assert bad.proc.returncode == 2 and "FAKECUDA_HANDLE_REUSE=sometimes: allowed: 1" in bad.proc.stderr


@pytest.mark.parametrize("variant", ["asan", "tsan"])
def test_reused_handles_race_other_launches(run_program, variant):
    """A thread loads, launches and unloads modules (wide and narrow in turn at one address)
    while another launches its own kernel, whose layout each unload makes pump ask again."""
    env = {"PUMP_SOCKET": "", "PUMP_POLICY": "launch", "ASAN_OPTIONS": "detect_leaks=1",
           "TSAN_OPTIONS": "halt_on_error=1"}
    run = run_program("handle_reuse", "race", "exact", variant=variant, env=env)
    assert run.proc.returncode == 0, run.proc.stderr[-4000:]
    assert "Sanitizer" not in run.proc.stderr and "runtime error" not in run.proc.stderr, run.proc.stderr[-4000:]
    assert run.result["same_handle"] is True and run.result["launches"] > 0
    assert run.totals["launches_unscanned"] == 0
