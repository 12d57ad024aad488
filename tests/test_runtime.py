"""NVIDIA's real CUDA runtime (from the nvidia-cuda-runtime wheel), static and
shared, bootstrapping under pump: its driver lookups go through pump's dlsym
and cuGetProcAddress, which hand back pump's hooks, and what the runtime
reports is the same as without pump, initialisation included (fakecuda answers the
driver's private export tables the runtime asks for)."""

import pytest


@pytest.mark.parametrize("program", ["runtime_static", "runtime_shared"])
def test_real_runtime_lookups_reach_pump(run_program, program):
    bare = run_program(program, pump=False)
    under = run_program(program)
    assert bare.proc.returncode == under.proc.returncode == 0, under.proc.stderr
    assert under.result == bare.result
    assert under.result["runtime"] >= 13000 and under.result["driver_error"] == 0
    assert under.result["init_error"] == 0  # cudaFree(0): the runtime initialised
    assert under.proc.stderr == bare.proc.stderr == ""
    (record,) = under.records
    # Every launch, allocation and sync entry point the runtime asked for
    # (24 with the 13.5 runtime) came back as pump's hook.
    assert record["procaddr_hooks"] >= 20
    assert not record["passthrough"]
