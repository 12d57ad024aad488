"""Makes libpump PyTorch's CUDA allocator: `[memory] torch_allocator = "pump"`.

The allocator is torch_allocator.cpp beside this file, compiled against the job's own PyTorch
(_pump_torch_build.py): PyTorch's CUDAPluggableAllocator around libpump's pump_torch_alloc /
pump_torch_free, with the memory answers the plain pluggable allocator lacks (memory_stats,
cacheInfo). Where it cannot be built, the plain CUDAPluggableAllocator stands in after one
notice, and torch.cuda.memory_stats raises as PyTorch's pluggable allocators do. PyTorch
refuses a new allocator once its allocator has been used, and a program that installs its own
allocator later still gets its way. Like sitecustomize.py, this file uses the standard library only.

Once installed, the end of every optimizer step (torch.optim's global step hook) is told to
libpump (pump_torch_step): pump's allocator then places each tensor where the same allocation
went the step before (shim/policy/placement.c), so that pumpd's plans, keyed by addresses, hold.
"""

import ctypes
import importlib
import os

import _pump_torch_build as bridges

SOURCE, LIBS = "torch_allocator.cpp", ("torch_cuda", "c10_cuda", "c10")
SHIM_NAME = "libpump.so"


def shim_path():
    """The libpump the process was started with (LD_PRELOAD), else PUMP_SHIM_PATH."""
    for entry in os.environ.get("LD_PRELOAD", "").replace(":", " ").split():
        if os.path.basename(entry) == SHIM_NAME:
            return entry
    return os.environ.get("PUMP_SHIM_PATH", "")


def install_with_answers(torch):
    """The bridge, built (or found) and installed; raises Unavailable where it cannot be."""
    library = ctypes.CDLL(bridges.build(torch, SOURCE, LIBS))
    status = library.pump_torch_allocator_install()
    if status == 1:
        raise bridges.Unavailable("libpump is not in this process")
    if status != 0:
        raise bridges.Unavailable("PyTorch refused it")


def install_plain(torch):
    """PyTorch's own pluggable allocator around libpump's two functions: no memory answers."""
    shim = shim_path()
    if not shim:
        raise RuntimeError(f"{SHIM_NAME} is not in LD_PRELOAD")
    memory = torch.cuda.memory
    memory.change_current_allocator(memory.CUDAPluggableAllocator(shim, "pump_torch_alloc", "pump_torch_free"))


def mark_steps(torch, notice, symbol="pump_torch_step",
               without="tensors get no fixed places, and pumpd's lookahead may not learn the step"):
    """Tell libpump where each optimizer step ends, by its function `symbol` (pump's allocator:
    its placement of tensors follows steps; the caching allocator's bridge: traces' step
    markers); one notice saying what goes `without` them where they cannot be marked."""
    shim = shim_path()
    try:
        step = getattr(ctypes.CDLL(shim), symbol) if shim else None
        register = importlib.import_module("torch.optim.optimizer").register_optimizer_step_post_hook
    except (OSError, ImportError, AttributeError) as error:  # an older libpump or PyTorch
        notice(f"optimizer steps are not marked ({type(error).__name__}: {error}): {without}")
        return
    if step is not None:
        step.argtypes, step.restype = [], None
        register(lambda optimizer, args, kwargs: step())


def install(torch, notice):
    """Make libpump PyTorch's CUDA allocator; one notice where it cannot be, or is without answers."""
    if getattr(getattr(torch, "version", None), "cuda", None) is not None:
        try:
            install_with_answers(torch)
            mark_steps(torch, notice)
            return
        except Exception as error:  # the job goes on: the plain pluggable allocator, said once
            reason = f"PyTorch's memory answers (memory_stats) are missing: {error}"
    else:
        reason = None
    try:
        install_plain(torch)
        if reason:
            notice(f'torch_allocator = "pump": {reason}')
    except Exception as error:  # a CPU-only build, an allocator already in use, no libpump
        notice(f'torch_allocator = "pump" not installed ({type(error).__name__}: {error}); '
               "PyTorch keeps its caching allocator")
        return
    mark_steps(torch, notice)
