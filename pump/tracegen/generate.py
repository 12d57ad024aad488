"""The training loop a generated trace records, one path for the built-in models and a
user's own (user.py): per step zero_grad(set_to_none=True),
a batch copied in, forward, loss, backward, AdamW's step; optionally a smaller last
batch and an evaluation forward (no_grad, eval mode) every K steps, the irregularities
an iteration detector must survive.  With ``inference``, each step is that forward alone
(no_grad, eval mode, no loss): what a profile of a model serving requests holds.

AdamW runs its foreach implementation (PyTorch's default for CUDA tensors), so its
kernels are multi_tensor_apply launches over chunks of the parameters; its step
counters stay on the host, as they do without capturable or fused.  fp32 throughout.
"""

import dataclasses
import gc
import os
import re
import warnings

import torch
from torch.utils import _pytree as pytree

from pump import outfile
from pump.tracegen import SIZES, allocator, events, models, record


@dataclasses.dataclass
class Program:
    """What the training loop runs: a built-in model or a user's callable (user.py), alike."""
    name: str                 # the model's name in the trace's header and the summary
    model: torch.nn.Module    # on the meta device
    batch: object             # an example batch: meta tensors, alone or in tuples, lists, dicts
    loss: object              # loss(model, batch): the forward pass and the loss, a scalar tensor
    optimizer: torch.optim.Optimizer
    config: object = None     # a built-in model's configuration
    seq: int = 0              # a built-in sequence model's length
    forward: object = None    # forward(model, batch): the forward pass alone (inference)

    @property
    def batch_size(self) -> int:
        """The leading dimension of the batch's first tensor."""
        first = next(t for t in pytree.tree_leaves(self.batch) if isinstance(t, torch.Tensor))
        return first.shape[0] if first.dim() else 1

    def shape(self) -> str:
        return f"batch {self.batch_size}" + (f" seq {self.seq}" if self.seq else "")


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
    step_flops: int               # of the first step (forward, backward, optimizer; forward alone in inference)
    inference: bool = False

    def line(self, path: str) -> str:
        shape = f"batch {self.batch}" + (f" seq {self.seq}" if self.seq else "")
        what = ("forward pass" if self.inference else "step") + ("es" if self.inference else "s") * (self.steps > 1)
        return (f"{self.model} ({shape}, {self.steps} {what}{', inference' * self.inference}): "
                f"{self.launches} launches, "
                f"peak footprint {_bytes(self.footprint_bytes)} in {self.segments} segments "
                f"({_bytes(self.peak_allocated_bytes)} allocated), "
                f"{_flops(self.step_flops)} per {'pass' if self.inference else 'step'} -> {path}")


def _bytes(n: int) -> str:
    """n bytes in the largest binary unit that leaves at least 1 of it (3 significant digits)."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n} B"


def _flops(n: int) -> str:
    """n FLOPs in the largest decimal unit that leaves at least 1 of it (3 significant digits)."""
    for unit, scale in (("TFLOP", 10**12), ("GFLOP", 10**9), ("MFLOP", 10**6), ("kFLOP", 10**3)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n} FLOP"


def builtin(model: str, size: str = "full", batch: int = None, seq: int = None) -> Program:
    """Built-in ``model`` as a Program; ValueError names the setting that is wrong and what is allowed."""
    if model not in models.MODELS:
        raise ValueError(f"unknown model {model!r}; models: {', '.join(models.MODELS)}")
    if size not in SIZES:
        raise ValueError(f"unknown size {size!r}; sizes: {', '.join(SIZES)}")
    spec = models.MODELS[model]
    config = spec.full if size == "full" else spec.tiny
    batch = config.batch if batch is None else batch
    if batch < 1:
        raise ValueError(f"--batch {batch}: at least 1")
    if spec.sequence:
        seq = config.seq if seq is None else seq
        if not 1 <= seq <= spec.max_seq(config):
            raise ValueError(f"--seq {seq}: from 1 to {spec.max_seq(config)} ({model}'s positions)")
    elif seq is not None:
        raise ValueError(f"--seq: {model} takes images, not sequences "
                         f"(sequence models: {', '.join(n for n, s in models.MODELS.items() if s.sequence)})")
    net = models.build(model, config)
    optimizer = torch.optim.AdamW(net.parameters(), lr=1e-4, weight_decay=0.01, foreach=True)
    return Program(f"{model} {size}", net, spec.batch(config, batch, seq or 0),
                   lambda m, b: spec.loss(m(b[0]), b[1]), optimizer, config, seq or 0, lambda m, b: m(b[0]))


def generate(path: str, make_program, steps: int = 3, last_batch: int = None, eval_every: int = None,
             progress=None, inference: bool = False) -> Summary:
    """Record ``steps`` training steps of the Program ``make_program()`` builds (called once the
    settings are checked), or with ``inference`` as many forward passes, and write them to the
    trace ``path``.  progress(what): called as each step begins, with the program's name."""
    if steps < 1:
        raise ValueError(f"--steps {steps}: at least 1")
    if eval_every is not None and eval_every < 1:
        raise ValueError(f"--eval-every {eval_every}: at least 1")
    if inference and eval_every is not None:
        raise ValueError("--eval-every adds evaluation passes to training steps; with --inference every step "
                         "is one: give one of them")
    program = make_program()
    batch = program.batch_size
    if last_batch is not None and not 1 <= last_batch < batch:
        raise ValueError(f"--last-batch {last_batch}: from 1 to {batch - 1} (smaller than the batch)")
    # Opened first: a file that cannot be written fails before minutes of work.
    out = outfile.open_output(path)
    try:
        stream, caching, step_flops = _record(program, steps, last_batch, eval_every, progress or (lambda _: None),
                                              _infer if inference else _step)
        stream.write(os.dup(out.fileno()), "generated",
                     f"{program.name} {program.shape()}{' inference' if inference else ''}")
    except BaseException:
        out.discard()
        raise
    out.close()
    return Summary(program.name.split()[0], program.config, batch, program.seq, steps, stream.launches,
                   len(stream.rows), len(caching.segments), caching.reserved_bytes, caching.peak_allocated_bytes,
                   step_flops, inference)


def _narrowed(batch, size: int, n: int):
    """The batch with its first ``n`` samples: each tensor whose leading dimension is the batch's."""
    return pytree.tree_map_only(torch.Tensor, lambda t: t[:n] if t.dim() and t.shape[0] == size else t, batch)


def _fresh(batch):
    """New storages shaped as the batch's tensors: a batch copied in from the host."""
    return pytree.tree_map_only(torch.Tensor, torch.empty_like, batch)


def _step(program, batch):
    program.optimizer.zero_grad(set_to_none=True)
    program.loss(program.model, batch).backward()
    program.optimizer.step()


def _infer(program, batch):
    """A forward pass as a model serving requests runs it: eval mode, no gradients, no loss."""
    program.model.eval()
    with torch.no_grad():
        program.forward(program.model, batch)


def _evaluate(program, batch):
    training = program.model.training
    program.model.eval()
    with torch.no_grad():
        program.loss(program.model, batch)
    program.model.train(training)


def _run(program, step: int, what, batch):
    """what(program, a fresh copy of ``batch``): an exception says, in one line, which step
    raised it, or what the meta device cannot trace (record.Unsupported)."""
    try:
        # Copied in from the host; freed when the step is done with it.
        what(program, _fresh(batch))
    except Exception as exc:
        refused = record.unsupported(exc)
        if refused is not None:
            raise refused from None
        message = (str(exc).strip().splitlines() or [""])[0]
        where = {_evaluate: "training step {} (evaluation)", _infer: "inference pass {}"}.get(
            what, "training step {}")
        raise ValueError(f"{program.name} raised {type(exc).__name__} in {where.format(step + 1)}: {message}") from None


def _record(program, steps, last_batch, eval_every, progress, step_function=_step):
    """(EventStream, CachingAllocator, FLOPs of the first step) of the loop of ``step_function``s
    (a training step, or an inference pass)."""
    last = _narrowed(program.batch, program.batch_size, last_batch) if last_batch else program.batch
    stream, caching = events.EventStream(), allocator.CachingAllocator()
    recorder = record.Recorder(stream, caching)
    step_flops = None
    # Storages are freed when their last reference goes, as in the program; the cycle
    # collector would add frees at moments that differ from run to run.
    gc.collect()
    gc.disable()
    try:
        with record.CudaChoices(), recorder, warnings.catch_warnings():
            warnings.filterwarnings("error", ".*" + re.escape(record.AUTOCAST_WARNING), UserWarning)
            recorder.place_module(program.model)
            for step in range(steps):
                progress(program.name)
                stream.step(step)
                flops_before = recorder.flops
                _run(program, step, step_function, last if step == steps - 1 else program.batch)
                if step_flops is None:
                    step_flops = recorder.flops - flops_before
                if eval_every and (step + 1) % eval_every == 0:
                    _run(program, step, _evaluate, program.batch)
        recorder.close()
    finally:
        gc.enable()
    return stream, caching, step_flops
