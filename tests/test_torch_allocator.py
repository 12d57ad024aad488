"""PyTorch's tensors under pump, on fakecuda (tests/c/torch_allocator.c makes a training
step's allocations the ways PyTorch does).

pump's allocator (shim/torch_allocator.c), driven as PyTorch's CUDAPluggableAllocator
drives it: every tensor is its own managed allocation, and a dead tensor's whole 2 MiB
blocks are discarded in its stream's order before it is freed. fakecuda poisons discarded
pages (NaN as floats), so a discard that came before a tensor's last use would change the
checksum.

PyTorch's caching allocator, followed (shim/torch_trace.c): tensors handed out of one
managed segment, reported as pump's bridge reports them (pump/boot/torch_trace.cpp), carve
the segment, so pump prefetches the tensors and not the segment."""

import pytest

MIB = 1 << 20
MANAGED_ALL = {"PUMP_MANAGED_ALL": "1"}
STEPS = 3
WEIGHTS, ACTIVATION = 8 * MIB, 6 * MIB  # tests/c/torch_allocator.c; both whole 2 MiB blocks


def bare(run_program, *args):
    result = run_program("torch_allocator", STEPS, *args, pump=False).result
    assert result["pump_allocator"] == 0 and result["managed"] == 0 and result["bytes_discarded"] == 0
    return result


def test_tensors_are_managed_and_dead_ones_discarded(run_program):
    expected = bare(run_program)
    run = run_program("torch_allocator", STEPS, env=MANAGED_ALL)
    result = run.result
    assert result["pump_allocator"] == 1 and result["managed"] == 1
    assert result["checksum"] == expected["checksum"]
    discarded = STEPS * ACTIVATION + WEIGHTS
    assert result["bytes_discarded"] == discarded  # fakecuda's count of what it discarded
    totals = run.totals
    assert totals["bytes_discarded"] == discarded
    assert totals["torch_allocs"] == totals["torch_frees"] == STEPS + 1
    assert totals["managed_allocs"] == totals["managed_frees"] == STEPS + 1
    assert totals["errors"] == 0
    assert run.proc.stderr == ""


def test_the_legacy_stream_gets_no_discard(run_program):
    # The driver refuses discards on the legacy NULL stream (PyTorch's default stream):
    # pump frees without one there.
    expected = bare(run_program, "legacy")
    run = run_program("torch_allocator", STEPS, "legacy", env=MANAGED_ALL)
    assert run.result["checksum"] == expected["checksum"]
    assert run.result["managed"] == 1 and run.result["bytes_discarded"] == 0
    assert run.totals["bytes_discarded"] == 0 and run.totals["torch_frees"] == STEPS + 1
    assert run.totals["errors"] == 0


def test_without_managed_all_tensors_stay_device_memory(run_program):
    expected = bare(run_program)
    run = run_program("torch_allocator", STEPS, env={"PUMP_MANAGED_ALL": "0"})
    assert run.result["managed"] == 0 and run.result["bytes_discarded"] == 0
    assert run.result["checksum"] == expected["checksum"]
    assert run.totals["torch_allocs"] == STEPS + 1 and run.totals["managed_allocs"] == 0


@pytest.mark.parametrize("variant", ["asan", "tsan"])
def test_sanitized(run_program, variant):
    expected = bare(run_program)
    run = run_program("torch_allocator", STEPS, variant=variant, env=MANAGED_ALL)
    assert run.result["checksum"] == expected["checksum"]
    assert run.result["bytes_discarded"] == STEPS * ACTIVATION + WEIGHTS


SEGMENT = 20 * MIB  # tests/c/torch_allocator.c's caching-allocator segment
# A second segment as large must fit after the first one's free: the carved segment's bytes
# are given back to the capacity.
CAP = {"PUMP_MANAGED_ALL": "1", "PUMP_CAPACITY": "24M"}


@pytest.mark.parametrize("legacy", [(), ("legacy",)], ids=["stream", "legacy"])
def test_caching_allocator_tensors_are_tracked_not_its_segments(run_program, legacy):
    expected = bare(run_program, *legacy, "caching")
    run = run_program("torch_allocator", STEPS, *legacy, "caching", env=CAP)
    result, totals = run.result, run.totals
    assert result["managed"] == 1 and result["checksum"] == expected["checksum"]
    # Only the tensors went to the GPU, never the segment's free 6 MiB; nothing faulted.
    assert result["device_resident_peak"] == WEIGHTS + ACTIVATION
    assert result["gpu_faults"] == 0 and result["bytes_discarded"] == 0
    assert totals["torch_tensor_allocs"] == totals["torch_tensor_frees"] == STEPS + 1
    assert totals["managed_allocs"] == totals["managed_frees"] == 2  # the two segments
    assert totals["errors"] == 0 and run.proc.stderr == ""


def test_unfollowed_caching_allocator_prefetches_whole_segments(run_program):
    # What pump does when its bridge could not be built: the same values, coarser prefetches.
    expected = bare(run_program, "segments")
    run = run_program("torch_allocator", STEPS, "segments", env=CAP)
    assert run.result["checksum"] == expected["checksum"]
    assert run.result["device_resident_peak"] == SEGMENT
    assert run.totals["torch_tensor_allocs"] == 0 and run.totals["managed_allocs"] == 2


def test_caching_allocator_without_managed_all_is_left_alone(run_program):
    run = run_program("torch_allocator", STEPS, "caching", env={"PUMP_MANAGED_ALL": "0"})
    assert run.result["managed"] == 0 and run.result["checksum"] == bare(run_program, "caching")["checksum"]
    assert run.totals["torch_tensor_allocs"] == 0 and run.totals["managed_allocs"] == 0


@pytest.mark.parametrize("variant", ["asan", "tsan"])
def test_caching_allocator_sanitized(run_program, variant):
    expected = bare(run_program, "caching")
    run = run_program("torch_allocator", STEPS, "caching", variant=variant, env=CAP)
    assert run.result["checksum"] == expected["checksum"]
    assert run.result["device_resident_peak"] == WEIGHTS + ACTIVATION
