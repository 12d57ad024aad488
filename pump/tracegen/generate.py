"""The training loop a generated trace records: per step zero_grad(set_to_none=True),
a batch copied in, forward, loss, backward, AdamW's step; optionally a smaller last
batch and an evaluation forward (no_grad, eval mode) every K steps, the irregularities
an iteration detector must survive.

AdamW runs its foreach implementation (PyTorch's default for CUDA tensors), so its
kernels are multi_tensor_apply launches over chunks of the parameters; its step
counters stay on the host, as they do without capturable or fused.  fp32 throughout.
"""

import dataclasses
import gc
import os

import torch

from pump.tracegen import SIZES, allocator, events, models, record


@dataclasses.dataclass
class Summary:
    model: str
    config: object
    batch: int
    seq: int
    steps: int
    launches: int
    records: int
    segments: int
    footprint_bytes: int          # in segments: the caching allocator's reserved memory, at its peak
    peak_allocated_bytes: int     # in blocks handed out, at the peak
    step_flops: int               # of the first training step (forward, backward, optimizer)

    def line(self, path: str) -> str:
        shape = f"batch {self.batch}" + (f" seq {self.seq}" if self.seq else "")
        return (f"{self.model} ({shape}, {self.steps} steps): {self.launches} launches, "
                f"peak footprint {self.footprint_bytes / 2**30:.2f} GiB in {self.segments} segments "
                f"({self.peak_allocated_bytes / 2**30:.2f} GiB allocated), "
                f"{self.step_flops / 1e9:.1f} GFLOP per step -> {path}")


def options(model: str, size: str = "full", batch: int = None, seq: int = None, steps: int = 3,
            last_batch: int = None, eval_every: int = None):
    """The checked settings of a generation: (spec, config, batch, seq); ValueError names
    the setting that is wrong and what is allowed."""
    if model not in models.MODELS:
        raise ValueError(f"unknown model {model!r}; models: {', '.join(models.MODELS)}")
    if size not in SIZES:
        raise ValueError(f"unknown size {size!r}; sizes: {', '.join(SIZES)}")
    spec = models.MODELS[model]
    config = spec.full if size == "full" else spec.tiny
    batch = config.batch if batch is None else batch
    if batch < 1:
        raise ValueError(f"--batch {batch}: at least 1")
    if steps < 1:
        raise ValueError(f"--steps {steps}: at least 1")
    if last_batch is not None and not 1 <= last_batch < batch:
        raise ValueError(f"--last-batch {last_batch}: from 1 to {batch - 1} (smaller than the batch)")
    if eval_every is not None and eval_every < 1:
        raise ValueError(f"--eval-every {eval_every}: at least 1")
    if spec.sequence:
        seq = config.seq if seq is None else seq
        if not 1 <= seq <= spec.max_seq(config):
            raise ValueError(f"--seq {seq}: from 1 to {spec.max_seq(config)} ({model}'s positions)")
    elif seq is not None:
        raise ValueError(f"--seq: {model} takes images, not sequences "
                         f"(sequence models: {', '.join(n for n, s in models.MODELS.items() if s.sequence)})")
    return spec, config, batch, seq or 0


def generate(path: str, model: str, size: str = "full", batch: int = None, seq: int = None, steps: int = 3,
             last_batch: int = None, eval_every: int = None) -> Summary:
    """Record ``steps`` training steps of ``model`` and write them to the trace ``path``."""
    spec, config, batch, seq = options(model, size, batch, seq, steps, last_batch, eval_every)
    # Opened first: a file that cannot be written fails before minutes of work.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        stream, caching, step_flops = _record(spec, config, model, batch, seq, steps, last_batch, eval_every)
    except BaseException:
        os.close(fd)
        os.unlink(path)
        raise
    shape = f"batch {batch}" + (f" seq {seq}" if seq else "")
    stream.write(fd, "generated", f"{model} {size} {shape}")
    return Summary(model, config, batch, seq, steps, stream.launches, len(stream.rows), len(caching.segments),
                   caching.reserved_bytes, caching.peak_allocated_bytes, step_flops)


def _record(spec, config, model, batch, seq, steps, last_batch, eval_every):
    """(EventStream, CachingAllocator, FLOPs of the first step) of the training loop."""
    net = models.build(model, config)
    optimizer = torch.optim.AdamW(net.parameters(), lr=1e-4, weight_decay=0.01, foreach=True)
    stream, caching = events.EventStream(), allocator.CachingAllocator()
    recorder = record.Recorder(stream, caching)
    step_flops = None
    # Storages are freed when their last reference goes, as in the program; the cycle
    # collector would add frees at moments that differ from run to run.
    gc.collect()
    gc.disable()
    try:
        with record.CudaChoices(), recorder:
            recorder.place_module(net)
            for step in range(steps):
                stream.step(step)
                # Copied in from the host; the previous batch went when the loop took this one.
                inputs, labels = spec.batch(config, last_batch if last_batch and step == steps - 1 else batch, seq)
                optimizer.zero_grad(set_to_none=True)
                flops_before = recorder.flops
                loss = spec.loss(net(inputs), labels)
                loss.backward()
                optimizer.step()
                del inputs, labels
                if step_flops is None:
                    step_flops = recorder.flops - flops_before
                if eval_every and (step + 1) % eval_every == 0:
                    net.eval()
                    with torch.no_grad():
                        eval_inputs, eval_labels = spec.batch(config, batch, seq)
                        spec.loss(net(eval_inputs), eval_labels)
                        del eval_inputs, eval_labels
                    net.train()
        recorder.close()
    finally:
        gc.enable()
    return stream, caching, step_flops
