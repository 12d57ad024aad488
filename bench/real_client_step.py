"""real_client_step.py: PyTorch's CUDA build, unmodified, training a GPT-style model on fakecuda,
for scripts/bench-steady's real-client row (bench/steady_real_client.py runs it, bare and under
pump-run, with torch's CUDA build's interpreter and FAKECUDA_PERSONA).

    python real_client_step.py STEPS WARMUP [--workload NAME] [--record-uses PATH]

The job is tests/real_client/train.py's GPT loop (embedding, SDPA attention, layer norm, GELU,
cross-entropy, backward, gradient clipping, AdamW foreach, an .item() each step), wider
(d=256) so that its tensors span several 2 MiB blocks and a budget of half of them means
something. PyTorch launches from two threads: the Python thread (forward, loss, optimizer)
and its autograd engine's thread for the device (backward). Each is read on itself: the Python
thread at every step's start (its batch call) and once after the last step; the autograd
thread in the backward of an identity Function on the model's output, the first backward node
after the loss's. Readings: the thread's CPU time and the driver host time fakecuda charged to
it (fakecuda_thread_host_ns), and, on the Python thread, CLOCK_MONOTONIC (fakecuda's clock),
fakecuda's counters (struct fakecuda_stats, raw) and calls per entry point, and libpump's
record when present (raw: $PUMP_STATS_DIR/pump-<pid>.stats). Prints one JSON line: the
readings of the steps' starts, the autograd thread's, and the end.

--workload: gpt-d256 (the default, above) or gpt2-small (tests/real_client/workloads.py).
--record-uses PATH: the job, model made and steps, runs under tests/real_client/operator_uses.py's
recorder (FAKECUDA_LAUNCH_LOG must be set), which writes at the end, at PATH, what each launch
touched, for a later run of the same job in the same configuration (FAKECUDA_LAUNCH_USES=PATH);
its summary is the line's "recorded". Its readings carry the recorder's Python cost."""
import argparse
import contextlib
import ctypes
import json
import os
import pathlib
import sys
import threading
import time

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "tests" / "real_client"))
import train  # noqa: E402 (the loop the real-client tests run)
import operator_uses  # noqa: E402
import workloads  # noqa: E402

WIDTH, HEADS = 256, 4
JOBS = {"gpt-d256": lambda: train.gpt_job(False, WIDTH, HEADS), "gpt2-small": workloads.gpt2_small_job}
STATS_BUFFER = 4096  # more than sizeof(struct fakecuda_stats): the bench reads the header's size


class EntryCost(ctypes.Structure):
    _fields_ = [("calls", ctypes.c_uint64), ("caller_ns", ctypes.c_uint64), ("worker_ns", ctypes.c_uint64)]


class Driver:
    """fakecuda's test API, from the libcuda.so.1 that the runtime loaded."""

    def __init__(self):
        self.lib = ctypes.CDLL("libcuda.so.1")
        self.lib.fakecuda_thread_host_ns.restype = ctypes.c_uint64
        self.lib.fakecuda_entry_name.restype = ctypes.c_char_p
        self.lib.fakecuda_entry_name.argtypes = [ctypes.c_uint]
        self.lib.fakecuda_get_entry_cost.argtypes = [ctypes.c_char_p, ctypes.POINTER(EntryCost)]
        self.names = []
        while (name := self.lib.fakecuda_entry_name(len(self.names))) is not None:
            self.names.append(name)
        self.record = pathlib.Path(os.environ["PUMP_STATS_DIR"]) / f"pump-{os.getpid()}.stats" \
            if os.environ.get("PUMP_STATS_DIR") else None

    def thread(self):
        """This thread's CPU and the driver host time fakecuda charged to it, in ns."""
        return {"cpu_ns": time.thread_time_ns(), "host_ns": self.lib.fakecuda_thread_host_ns()}

    def whole(self):
        """The Python thread's reading and the process's: clock, counters, entry points, pump's."""
        stats = ctypes.create_string_buffer(STATS_BUFFER)
        self.lib.fakecuda_get_stats(stats)
        cost, entries = EntryCost(), {}
        for name in self.names:
            self.lib.fakecuda_get_entry_cost(name, ctypes.byref(cost))
            entries[name.decode()] = [cost.calls, cost.caller_ns, cost.worker_ns]
        pump = self.record.read_bytes().hex() if self.record is not None and self.record.exists() else None
        return {**self.thread(), "wall_ns": time.monotonic_ns(), "fakecuda": stats.raw.hex(),
                "entries": entries, "pump": pump}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("steps", type=int)
    parser.add_argument("warmup", type=int)
    parser.add_argument("--workload", choices=sorted(JOBS), default="gpt-d256")
    parser.add_argument("--record-uses", metavar="PATH")
    args = parser.parse_args()
    steps, warmup, record_to = args.steps, args.warmup, args.record_uses
    torch.cuda.init()
    driver = Driver()
    recorder = operator_uses.Recorder(driver.lib) if record_to else None
    starts, autograd = [], []

    class Probe(torch.autograd.Function):
        """The identity; its backward reads the autograd engine's thread for the device."""
        @staticmethod
        def forward(ctx, x):
            return x.view_as(x)

        @staticmethod
        def backward(ctx, grad):
            autograd.append({**driver.thread(), "tid": threading.get_native_id()})
            return grad

    with recorder or contextlib.nullcontext():
        model, batch, optimizer, logits = JOBS[args.workload]()
        model.register_forward_hook(lambda module, args, out: Probe.apply(out))

        def batch_read():
            starts.append(driver.whole())
            if recorder is not None:
                recorder.mark_step()
            return batch()
        train.train(model, batch_read, optimizer, logits, steps)  # each step ends in .item(): nothing left to run
    end = driver.whole()
    line = {"steps": steps, "warmup": warmup, "python_tid": threading.get_native_id(),
            "torch": torch.__version__, "starts": starts, "end": end, "autograd": autograd}
    if recorder is not None:
        line["recorded"] = recorder.write(record_to, os.environ["FAKECUDA_LAUNCH_LOG"])
    print(json.dumps(line))


if __name__ == "__main__":
    main()
