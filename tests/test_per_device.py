"""Threads launching on different GPUs never wait for each other in pump (issue 15 item 5), on
fakecuda (tests/c/per_device.c: each thread over its own managed buffers, twice what a budget
of 8 MiB per device holds, so that every launch evicts and prefetches).

Before, one lock guarded the residency of every device and was held through the prefetch and
eviction ioctls: a thread-per-GPU launcher serialised on pump (this program under the shim of
0ec1383: each of two threads on two devices took 1.88 to 2.87 times as long as one thread
alone, the ioctls of one waiting for the other's; the waits were not counted;
docs/benchmarks.md). Now each device
has its own lock, held only to decide, and the driver calls are made after it: no thread
waited for another's lock, or for another's driver calls."""

import pytest

LAUNCHES = 64
BUDGET = {"PUMP_BUDGET": "8M", "FAKECUDA_DEVICES": "2"}


def two_threads(run_program, devices, variant):
    """pump's counters of two threads on `devices` devices; every value right, every launch
    prefetched (each needs a buffer the budget no longer holds)."""
    run = run_program("per_device", 2, devices, LAUNCHES, variant=variant, env=BUDGET)
    assert run.result["failures"] == 0
    totals = run.totals
    assert totals["errors"] == 0
    assert totals["launches_prefetched"] == 2 * (LAUNCHES + 1)  # each thread's set-up launch too
    return totals


@pytest.mark.parametrize("variant", ["plain", "asan", "tsan"])
def test_threads_on_two_devices_never_wait_for_each_other(run_program, variant):
    totals = two_threads(run_program, 2, variant)
    # Every launch evicted the buffer two before it, on both devices.
    assert totals["evictions"] >= 2 * (LAUNCHES - 2) * 2
    assert totals["residency_lock_waits"] == 0
    assert totals["residency_turn_waits"] == 0


@pytest.mark.parametrize("variant", ["plain", "tsan"])
def test_threads_on_one_device_take_their_moves_in_turn(run_program, variant):
    # Two threads share a device's lock and its streams: their moves are made in the order
    # they were decided, and every value is right (the waits, if any, are counted, not asserted).
    totals = two_threads(run_program, 1, variant)
    assert totals["resident_bytes_peak"] <= 8 << 20
