"""pump's own budget above the device (shim/policy/budget.c) told to pumpd: the shim's BUDGET records,
decoded and checked (pump/channel.py), kept per session (pumpd/jobs.py: the least over the
process's devices) and shown by `pump trace show`. The shim's side is in tests/test_channel.py
(test_pumps_own_budget_is_told_at_its_first_reading_and_each_change), what pumpd's plans do with
it in tests/test_traffic.py (test_oversubscribed_lookahead_plans_for_pumps_own_budget)."""

import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from helpers import channel_record, ringless_session
from pump import channel

MiB = 1 << 20
PUMP = str(pathlib.Path(sys.executable).parent / "pump")


def budget_record(device: int, nbytes: int, count: int = 1) -> np.ndarray:
    return channel_record("budget", device, count, nbytes)


def test_decode_gives_each_device_its_budget():
    batch = channel.decode(np.concatenate([budget_record(0, 248 * MiB), budget_record(3, 124 * MiB)]))
    assert batch.budgets == [(0, 248 * MiB), (3, 124 * MiB)]
    assert (batch.invalid, batch.problems) == (0, [])


@pytest.mark.parametrize("device, nbytes, count", [(-1, MiB, 1), (64, MiB, 1), (0, 0, 1), (0, MiB, 2)])
def test_a_malformed_budget_record_is_rejected_and_named(device, nbytes, count):
    batch = channel.decode(np.concatenate([budget_record(device, nbytes, count), budget_record(1, 8 * MiB)]))
    assert batch.budgets == [(1, 8 * MiB)]  # the good one after it still counts
    assert batch.invalid == 1
    assert batch.problems == [f"BUDGET record for device {device} with count {count} and {nbytes} bytes; "
                              "allowed: ordinals 0..63, count 1, bytes > 0"]


def test_a_session_keeps_the_least_of_its_devices_newest_budgets():
    session = ringless_session()
    assert session.own_budget == 0  # none told: pumpd plans for the job's, or the GPU's memory
    session.ingest(channel.decode(np.concatenate([budget_record(0, 248 * MiB), budget_record(1, 200 * MiB)])))
    assert session.own_budget == 200 * MiB
    session.ingest(channel.decode(budget_record(1, 300 * MiB)))  # device 1's changed
    assert session.own_budget == 248 * MiB


def test_pump_trace_show_prints_it(tmp_path):
    from pump import trace
    path = tmp_path / "t.trace"
    w = trace.TraceWriter(os.open(path, os.O_WRONLY | os.O_CREAT, 0o644), "j1", "budgets")
    w.write(11, budget_record(2, 124 * MiB))
    w.close()
    shown = subprocess.run([PUMP, "trace", "show", str(path)], capture_output=True, text=True, timeout=30)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.splitlines()[1].split(None, 3)[2:] == ["budget", f"device 2: pump's own budget {124 * MiB} bytes"]
