"""Turning a program's operators into a trace: a TorchDispatchMode that sees every
aten operator a model's training step runs on the meta device (after autograd, so
backward and the optimizer are seen too) and records what a CUDA device would do.

The meta device stands for the GPU; tensors on the CPU stay on the host (the
optimizer's step counters) and are not recorded.  Per operator:
  - every new storage gets an address from the caching-allocator model (BLOCK_ALLOC,
    and ALLOC when a segment is made); when the storage dies (a weakref finalizer on
    its Python object, which PyTorch keeps alive exactly as long as the storage),
    its block goes back (BLOCK_FREE);
  - operators that only make views or change metadata launch nothing, nor do
    allocation-only ones (empty) or host-to-device copies (not kernels);
  - any other launches a kernel, with the exact byte ranges of its operands (inputs
    read, schema-mutated arguments written, new outputs written), the segments holding
    them, its FLOPs (torch.utils.flop_counter's formulas; 0 for operators without one,
    which are bound by memory traffic) and its bytes read plus written;
  - a _foreach_ operator launches as CUDA's multi_tensor_apply does: chunks of 65536
    elements, a launch whenever the tensors or blocks per launch reach their limit.
CudaChoices makes the choices PyTorch makes for a CUDA tensor where the meta device
would choose otherwise (dropout's fused kernel and its boolean mask).  What cannot be
traced on the meta device is refused, named (Unsupported): an operator without a meta
kernel, and autocast, which does not apply to meta tensors.
"""

import weakref

import torch
from torch.nn import functional as F
from torch.overrides import TorchFunctionMode
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import flop_registry

from pump import channel
from pump.tracegen.operands import (ALLOCATION_ONLY, foreach_launches, reads_mutated, schema_operands,
                                    storage_extent, tensor_inputs)

class Unsupported(ValueError):
    """Something in the traced program the meta device cannot run as a GPU would; str() names it."""


# torch.autocast("cuda") on a machine without CUDA warns this and disables itself; with CUDA it
# stays enabled but applies to CUDA tensors only.  Either way meta tensors stay in fp32.
AUTOCAST_WARNING = "Disabling autocast"
AUTOCAST_REFUSED = ("autocast cannot be traced: it does not apply to meta tensors, so every operator would "
                    "be recorded in fp32; trace without autocast, or cast the model and batch to one dtype")


def unsupported(exc: BaseException):
    """The Unsupported error an exception raised while tracing stands for, or None."""
    if isinstance(exc, Unsupported):
        return exc
    if isinstance(exc, UserWarning) and AUTOCAST_WARNING in str(exc):
        return Unsupported(AUTOCAST_REFUSED)
    return None


def _no_meta_kernel(func, exc: BaseException):
    """Unsupported naming ``func`` if ``exc`` says it has no meta kernel, else None."""
    text = str(exc)
    if not (isinstance(exc, NotImplementedError) or "meta tensors" in text or "'Meta' backend" in text):
        return None
    why = "Tensor.item() or a Python number taken from a tensor" if "_local_scalar_dense" in str(func) \
        else (text.splitlines() or [""])[0][:160]
    return Unsupported(f"operator {func} has no meta kernel ({why}): an operator whose output depends on the "
                       "data cannot be traced; for a custom or Triton operator, register a fake implementation "
                       "with torch.library.register_fake")


def _on_device(t) -> bool:
    return isinstance(t, torch.Tensor) and t.device.type == "meta"


class CudaChoices(TorchFunctionMode):
    """Dropout in training takes CUDA's fused native_dropout (one kernel, a bool mask;
    ATen's is_fused_kernel_acceptable) where the meta device would take the CPU path
    (a float mask filled by bernoulli_, then a multiply)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.dropout:
            p = args[1] if len(args) > 1 else kwargs.get("p", 0.5)
            training = args[2] if len(args) > 2 else kwargs.get("training", True)
            inplace = args[3] if len(args) > 3 else kwargs.get("inplace", False)
            x = args[0]
            if training and not inplace and 0 < p < 1 and _on_device(x) and x.numel():
                return torch.native_dropout(x, p, True)[0]
        return func(*args, **kwargs)


class Recorder(TorchDispatchMode):
    """Records operators into an EventStream, placing storages with a CachingAllocator."""

    def __init__(self, events, allocator):
        super().__init__()
        self.events, self.allocator = events, allocator
        self.live = {}           # storage (its StorageImpl's address) -> (address, bytes, segment)
        self.flops = 0           # of every launch recorded so far
        self.recording = True

    # --- storages ------------------------------------------------------------------------
    def place(self, t) -> bool:
        """Give the storage of device tensor ``t`` a block if it has none; True if it is new."""
        storage = t.untyped_storage()
        key, nbytes = storage._cdata, storage.nbytes()
        held = self.live.get(key)
        if held is not None and held[1] >= nbytes:
            return False
        if held is not None:      # resized in place: a new block, as resize_ takes one
            self._release(key)
        if nbytes == 0:
            return False
        address, size, segment = self.allocator.malloc(nbytes)
        if segment is not None:
            self.events.alloc(*segment)
        self.events.block_alloc(address, size)
        self.live[key] = (address, nbytes, self.allocator.blocks[address].segment)
        if held is None:
            weakref.finalize(storage, self._release, key).atexit = False
        return True

    def place_module(self, module):
        """Place a model's parameters and buffers in the order Module.to() copies them to
        the GPU: each submodule's before its parent's own."""
        for child in module.children():
            self.place_module(child)
        for t in [*module._parameters.values(), *module._buffers.values()]:
            if _on_device(t):
                self.place(t)

    def _release(self, key):
        if not self.recording or key not in self.live:
            return
        address = self.live.pop(key)[0]
        self.events.block_free(address, self.allocator.free(address))

    def close(self):
        """Stop recording: storages that die from now on are not the program's frees."""
        self.recording = False

    def _extent(self, t, start: int = 0, stop: int = None):
        """(address, bytes, segment) of elements [start, stop) of ``t`` (all of it by default)
        in its storage, or None if that is empty."""
        extent = storage_extent(t, start, stop)
        if extent is None:
            return None
        address, _, segment = self.live[t.untyped_storage()._cdata]
        return address + extent[0], extent[1], segment

    # --- operators -----------------------------------------------------------------------
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if torch.is_autocast_enabled("cuda"):
            raise Unsupported(AUTOCAST_REFUSED)
        try:
            out = func(*args, **kwargs)
        except Exception as exc:
            refused = _no_meta_kernel(func, exc)
            if refused is None:
                raise
            raise refused from None
        if func.namespace != "aten":
            return out
        operands = schema_operands(func, args, kwargs)
        inputs = tensor_inputs(operands, _on_device)
        for t, _ in inputs:      # made before recording began (a constant the program holds): copied in
            self.place(t)
        outputs = [t for t in pytree.tree_leaves(out) if _on_device(t)]
        new = [t for t in outputs if self.place(t)]
        name = func.overloadpacket.__name__
        mutates = any(m for _, m in inputs)
        if name in ALLOCATION_ONLY or torch.Tag.inplace_view in func.tags or not (new or mutates):
            return out               # no kernel: an allocation, a view, or metadata only
        if not inputs and any(isinstance(t, torch.Tensor) for value, _ in operands
                              for t in pytree.tree_leaves(value)):
            return out               # a host-to-device copy: the copy engine, no kernel
        read_mutated = reads_mutated(func)
        if name.startswith("_foreach_"):
            for uses in foreach_launches(operands, new, read_mutated, _on_device):
                self._launch(str(func), [(self._extent(t, first, stop), read, written)
                                         for t, first, stop, read, written in uses], 0)
        else:
            ranges = [(self._extent(t), not m or read_mutated, m) for t, m in inputs]
            ranges += [(self._extent(t), False, True) for t in new]
            flops = flop_registry[func.overloadpacket](*args, **kwargs, out_val=out) \
                if func.overloadpacket in flop_registry else 0
            self._launch(str(func), ranges, flops)
        return out

    def _launch(self, name: str, ranges, flops: int):
        """One kernel over ``ranges``: [((address, bytes, segment) or None, read, written)]."""
        merged = {}              # (address, bytes) -> [read, written, segment], first use first
        for extent, read, written in ranges:
            if extent is None:
                continue
            entry = merged.setdefault(extent[:2], [False, False, extent[2]])
            entry[0] |= read
            entry[1] |= written
        if not merged:
            return
        segments = list(dict.fromkeys(segment for _, _, segment in merged.values()))
        traffic = sum(nbytes * (read + written) for (_, nbytes), (read, written, _) in merged.items())
        self.events.launch(name, segments[:channel.LAUNCH_BASES_MAX],
                           [(a, n, w) for (a, n), (_, w, _) in merged.items()], int(flops), traffic)
        self.flops += int(flops)
