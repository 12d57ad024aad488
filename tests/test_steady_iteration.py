"""pumpd's iteration detector on bench/steady_step.c's training step: its launches' keys (the
kernel and the device tensors it is given, what pump_channel.h's launch key is made of), as the
program prints them (`print_launches`), fed to pump/foresight.py's IterationDetector. No daemon
and no timing: the keys are the program's, whichever reads pumpd would make of them.

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

from helpers import clean_env
from pump.iteration import IterationDetector

STEPS = 5
SETUP_LAUNCHES = 4 * 32  # steady_step initialises each layer's four tensors first


def step_keys(c_build):
    """(launches per step, every launch's key in order) of one bare run of steady_step."""
    env = dict(clean_env(), LD_LIBRARY_PATH=str(c_build / "plain"), FAKECUDA_DEVICE_MEMORY="1G")
    command = [str(c_build / "plain" / "steady_step"), str(STEPS), "1", "print_launches"]
    proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    result = json.loads([line for line in lines if line.startswith("{")][-1])
    ids = {}
    for line in lines:
        if line.startswith("launch "):
            kernel, *tensors = line.split()[1:]
            ids.setdefault((kernel, *dict.fromkeys(tensors)), len(ids) + 1)  # a key per distinct launch
    keys = [ids[(kernel, *dict.fromkeys(tensors))] for kernel, *tensors in
            (line.split()[1:] for line in lines if line.startswith("launch "))]
    return result["launches_per_step"], np.array(keys, np.uint64)


def test_the_detector_finds_the_training_step_as_the_iteration(c_build):
    per_step, keys = step_keys(c_build)
    assert per_step == 516 and len(keys) == SETUP_LAUNCHES + STEPS * per_step
    steps = keys[SETUP_LAUNCHES:].reshape(STEPS, per_step)
    differing = [int(np.count_nonzero(steps[s] != steps[s + 1])) for s in range(1, STEPS - 1)]
    assert differing == [0] * (STEPS - 2), f"keys differing between consecutive steady steps: {differing}"
    detector = IterationDetector()
    detector.extend(keys)
    assert detector.detect() == per_step
