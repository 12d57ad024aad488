"""pumpd's iteration detector on bench/steady_step.c's training step, as pumpd reads it: the
launch keys of a trace pump-run wrote (the kernel and the allocations its arguments point into,
pump_channel.h), fed to pump/foresight.py's IterationDetector. Timing plays no part: the keys
are the program's, whichever reads pumpd made of them.

The step's 516 launches take their activations from tests/c/torch_caching.h, PyTorch's caching
allocator as the fakecuda programs make it. When it handed out the most recently freed block of
a size (and took it from an unordered free list), the activations' addresses permuted from one
step to the next: 298 of the 516 keys differed between consecutive steps, far over the
detector's 5% tolerance, and the key sequence repeated only every 33 steps, so pumpd learned an
iteration of 17,028 launches (and, within bench-steady's 12 steps, none). PyTorch hands out the
lowest-addressed free block of the size (its BlockComparatorSize order), which gives a step the
same addresses every time."""

import json
import subprocess

import numpy as np

from helpers import PUMP_RUN, clean_env
from pump import channel, trace
from pump.foresight import IterationDetector

STEPS = 5
SETUP_LAUNCHES = 4 * 32  # steady_step initialises each layer's four tensors first


def step_keys(c_build, tmp_path):
    """(launches per step, every launch's key in order) of one run of steady_step."""
    trace_file = tmp_path / "steady.trace"
    env = dict(clean_env(), LD_LIBRARY_PATH=str(c_build / "plain"), FAKECUDA_DEVICE_MEMORY="1G")
    command = [PUMP_RUN, "--daemon", "embedded", "--quiet", "--policy", "lookahead", "--trace", str(trace_file),
               "--", str(c_build / "plain" / "steady_step"), str(STEPS), "1"]
    proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads([line for line in proc.stdout.splitlines() if line.startswith("{")][-1])
    _header, blocks = trace.read(trace_file)
    keys = [channel.launch_keys(batch) for batch in (channel.decode(records) for _pid, records in blocks)
            if batch.launch_function is not None and len(batch.launch_function)]
    return result["launches_per_step"], np.concatenate(keys)


def test_the_detector_finds_the_training_step_as_the_iteration(c_build, tmp_path):
    per_step, keys = step_keys(c_build, tmp_path)
    assert per_step == 516
    # The trace may lack the last launches (pumpd's last read of the ring): whole steps only.
    whole = (len(keys) - SETUP_LAUNCHES) // per_step
    assert whole >= 3, f"the trace holds {len(keys)} launches"
    steps = keys[SETUP_LAUNCHES:SETUP_LAUNCHES + whole * per_step].reshape(whole, per_step)
    differing = [int(np.count_nonzero(steps[s] != steps[s + 1])) for s in range(1, whole - 1)]
    assert differing == [0] * (whole - 2), f"keys differing between consecutive steady steps: {differing}"
    detector = IterationDetector()
    detector.extend(keys)
    assert detector.detect() == per_step
