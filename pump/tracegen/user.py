"""pump trace generate --model MODULE:CALLABLE: a user's own model, traced as the built-in ones are.

MODULE is a module Python can import (the current directory first, as `python -m` has it) or a
file, path/to/file.py; CALLABLE a name in it (dots reach into classes).  The callable takes no
arguments and returns (model, batch), (model, batch, optimizer) or (model, batch, optimizer,
loss_fn).  It is called under torch.device("meta"), so the model it builds has shapes and no
memory, whatever its size.  The batch is a tensor, a tuple or list of tensors (the model is
called with them as arguments) or a dict of tensors (as keyword arguments).  loss_fn(output,
batch) gives the loss; without it the output is the loss if it is a single number, its `loss`
if it has one (as Hugging Face models have given labels), else the sum of its elements, a
stand-in that costs one reduction.  Without an optimizer: AdamW, as the built-in models have.
Every problem is a ValueError of one line, naming MODULE:CALLABLE and what is allowed.
"""

import importlib
import importlib.util
import os
import sys

import torch
from torch.utils import _pytree as pytree

from pump.tracegen.generate import Program

RETURNS = "(model, batch), (model, batch, optimizer) or (model, batch, optimizer, loss_fn)"


def _first_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0]}"


def _module(name: str, spec: str):
    if name.endswith(".py"):
        if not os.path.isfile(name):
            raise ValueError(f"--model {spec}: no file {name}")
        found = importlib.util.spec_from_file_location(os.path.basename(name)[:-3], name)
        module = importlib.util.module_from_spec(found)
        found.loader.exec_module(module)
        return module
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    return importlib.import_module(name)


def resolve(spec: str):
    """The callable ``spec`` (MODULE:CALLABLE) names."""
    module_name, _, attribute = spec.rpartition(":")
    if not module_name or not attribute:
        raise ValueError(f"--model {spec!r}: expected MODULE:CALLABLE (a module Python can import, or "
                         "path/to/file.py, then the function's name), e.g. mymodels:build")
    try:
        target = _module(module_name, spec)
    except ValueError:
        raise
    except ModuleNotFoundError as exc:
        raise ValueError(f"--model {spec}: no module {exc.name!r} (MODULE is a module Python can import "
                         "from the current directory or sys.path, or a path ending in .py)") from None
    except Exception as exc:
        raise ValueError(f"--model {spec}: importing {module_name} raised {_first_line(exc)}") from None
    for name in attribute.split("."):
        if not hasattr(target, name):
            raise ValueError(f"--model {spec}: {module_name} has no {attribute!r}")
        target = getattr(target, name)
    if not callable(target):
        raise ValueError(f"--model {spec}: {attribute} is a {type(target).__name__}, not a callable")
    return target


def load(spec: str) -> Program:
    """Call ``spec``'s callable under the meta device and check what it returns."""
    make = resolve(spec)
    try:
        with torch.device("meta"):
            returned = make()
    except Exception as exc:
        raise ValueError(f"--model {spec} raised {_first_line(exc)}") from None
    if not isinstance(returned, (tuple, list)) or not 2 <= len(returned) <= 4:
        raise ValueError(f"--model {spec} returned a {type(returned).__name__}; expected {RETURNS}")
    model, batch, optimizer, loss_fn = (*returned, None, None)[:4]
    if not isinstance(model, torch.nn.Module):
        raise ValueError(f"--model {spec}: the model is a {type(model).__name__}, not a torch.nn.Module")
    tensors = [t for t in pytree.tree_leaves(batch) if isinstance(t, torch.Tensor)]
    if not tensors:
        raise ValueError(f"--model {spec}: the batch holds no tensor; expected a tensor, or tensors in a "
                         "tuple, list or dict")
    for where, t in [*(("batch tensor", t) for t in tensors),
                     *model.named_parameters(), *model.named_buffers()]:
        if t.device.type != "meta":
            raise ValueError(f"--model {spec}: {where} is on {t.device.type}, not meta: make it in the callable "
                             "(it runs under torch.device('meta')), not loaded or moved to a device")
    if optimizer is None:
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01, foreach=True)
    elif not isinstance(optimizer, torch.optim.Optimizer):
        raise ValueError(f"--model {spec}: the optimizer is a {type(optimizer).__name__}, not a "
                         "torch.optim.Optimizer (or None for AdamW)")
    for group in optimizer.param_groups:
        # On CUDA tensors PyTorch's optimizers default to foreach; on meta ones they would not.
        if group.get("foreach", False) is None and not group.get("fused"):
            group["foreach"] = True
    if loss_fn is not None and not callable(loss_fn):
        raise ValueError(f"--model {spec}: loss_fn is a {type(loss_fn).__name__}, not a callable (or None)")
    module_name, _, attribute = spec.rpartition(":")
    return Program(f"{os.path.basename(module_name)}:{attribute}", model, batch, _loss(spec, loss_fn), optimizer,
                   forward=_call)


def _call(model, batch):
    if isinstance(batch, dict):
        return model(**batch)
    if isinstance(batch, (tuple, list)):
        return model(*batch)
    return model(batch)


def _loss(spec: str, loss_fn):
    def forward_and_loss(model, batch):
        output = _call(model, batch)
        if loss_fn is not None:
            loss = loss_fn(output, batch)
        elif isinstance(output, dict) and "loss" in output or hasattr(output, "loss"):
            loss = output["loss"] if isinstance(output, dict) else output.loss
        elif isinstance(output, torch.Tensor):
            loss = output if output.numel() == 1 else output.float().sum()
        else:
            raise ValueError(f"the model returned a {type(output).__name__} with no loss: return a loss_fn "
                             f"too, {RETURNS}")
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
            raise ValueError(f"the loss is a {type(loss).__name__}"
                             f"{' of shape ' + str(tuple(loss.shape)) if isinstance(loss, torch.Tensor) else ''}, "
                             "not a tensor holding one number")
        return loss
    return forward_and_loss
