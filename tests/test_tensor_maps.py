"""TMA descriptors (tests/c/tensor_map_launch.c): a kernel given a CUtensorMap by value
reads the tensor it names, whose address is no plain word of the arguments (fakecuda
scrambles its descriptors' bytes, as cuda.h keeps them opaque). pump learns each
descriptor where it is made (cuTensorMapEncodeTiled, ReplaceAddress, EncodeIm2col,
EncodeIm2colWide) and prefetches the managed memory it covers: without pump every page
faults, with it none does. Through the linked entry points and cuGetProcAddress, plain and
sanitized."""

import subprocess

import pytest

STEPS = ("tiled", "replaced", "im2col", "im2col_wide")
PAGES = (4 << 20) // (64 << 10)  # each tensor: 4 MiB of fakecuda's 64 KiB pages
REFUSALS = 7                      # descriptors cuda.h's rules forbid, each refused


def tma_run(run_program, program="tensor_map_launch", variant="plain", pump=True):
    env = {"PUMP_SOCKET": "", "PUMP_POLICY": "launch", "ASAN_OPTIONS": "detect_leaks=1",
           "TSAN_OPTIONS": "halt_on_error=1"}
    run = run_program(program, variant=variant, pump=pump, env=env)
    assert run.proc.returncode == 0, run.proc.stderr[-4000:]
    assert "Sanitizer" not in run.proc.stderr and "runtime error" not in run.proc.stderr, run.proc.stderr[-4000:]
    return run


@pytest.mark.parametrize("program", ["tensor_map_launch", "tensor_map_launch_procaddr"])
def test_descriptor_memory_prefetched(run_program, program):
    bare = tma_run(run_program, program, pump=False).result
    assert {step: bare[step] for step in STEPS} == {step: PAGES for step in STEPS}
    assert bare["refusals"] == REFUSALS
    run = tma_run(run_program, program)
    assert run.result == {**{step: 0 for step in STEPS}, "refusals": REFUSALS, "checksum": bare["checksum"]}
    totals = run.totals
    assert totals["tensor_maps_noted"] == 4 and totals["tensor_map_args"] == 4
    assert totals["launches_managed"] == 4 and totals["errors"] == 0


@pytest.mark.parametrize("variant", ["asan", "tsan"])
def test_descriptor_memory_prefetched_sanitized(run_program, variant):
    run = tma_run(run_program, variant=variant)
    assert {step: run.result[step] for step in STEPS} == {step: 0 for step in STEPS}


@pytest.mark.parametrize("variant", ["plain", "asan", "tsan"])
def test_tables_units(c_build, variant):
    """tests/c/units_tables.c: the handle-kind and descriptor tables, with racing threads."""
    proc = subprocess.run([str(c_build / variant / "units_tables")], capture_output=True, text=True, timeout=300,
                          env={"TSAN_OPTIONS": "halt_on_error=1", "ASAN_OPTIONS": "detect_leaks=1"})
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    assert "Sanitizer" not in proc.stderr and "runtime error" not in proc.stderr, proc.stderr[-4000:]
    assert proc.stdout.splitlines()[-1] == "units_tables: 24 passed, 0 failed"
