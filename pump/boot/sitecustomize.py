"""pump's start-up hook for Python frameworks.

pump-run puts this directory first on PYTHONPATH when a job asks for something that only
Python code can do, so Python runs this file at start-up in every Python process of the
job, whatever interpreter the job uses (hence the standard library only: pump itself may
not be importable there). Then it runs the sitecustomize it shadows, if there is one.

What it does, the moment `torch` has been imported, before any tensor exists, so that pump
knows each tensor's exact extent and death:
- `[memory] torch_allocator = "pump"` (PUMP_TORCH_ALLOCATOR=pump) hands every PyTorch tensor
  to libpump's `pump_torch_alloc` / `pump_torch_free` (shim/hooks/torch_allocator.c), with PyTorch's
  memory answers (_pump_torch_allocator.py).
- Otherwise, under managed_all (PUMP_MANAGED_ALL=1), PyTorch keeps its caching allocator and
  pump follows it (_pump_torch_trace.py).
"""

import importlib
import importlib.abc
import importlib.util
import os
import sys

ALLOCATOR_ENV = "PUMP_TORCH_ALLOCATOR"
ALLOCATORS = ("caching", "pump")  # pump.config.TORCH_ALLOCATORS: this file may not import pump


def notice(message):
    print(f"pump: {message}", file=sys.stderr)


def install_pump_allocator(torch):
    import _pump_torch_allocator  # here: a job that never imports torch never loads it

    _pump_torch_allocator.install(torch, notice)


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs `then(module)` once, right after the top-level module `name` has executed."""

    def __init__(self, name, then):
        self.name, self.then = name, then

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)  # one shot, and the lookup below must not find us
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        loader, then = spec.loader, self.then

        class ThenLoader(importlib.abc.Loader):
            def create_module(self, spec):
                return loader.create_module(spec)

            def exec_module(self, module):
                loader.exec_module(module)
                then(module)

        spec.loader = ThenLoader()
        return spec


def follow_caching_allocator(torch):
    import _pump_torch_trace  # here: a job that never imports torch never loads it

    _pump_torch_trace.arm(torch, notice)


def _on_torch_import():
    """What to do once torch is imported, from the job's settings (None: nothing)."""
    choice = os.environ.get(ALLOCATOR_ENV, "")
    if choice == "pump":
        return install_pump_allocator
    if choice not in ("", "caching"):
        notice(f"{ALLOCATOR_ENV}={choice!r} is not one of {', '.join(ALLOCATORS)}; "
               "PyTorch keeps its caching allocator")
    if os.environ.get("PUMP_MANAGED_ALL") == "1":
        return follow_caching_allocator
    return None


def _arm():
    then = _on_torch_import()
    if then is None:
        return
    if "torch" in sys.modules:
        then(sys.modules["torch"])
    else:
        sys.meta_path.insert(0, _AfterImport("torch", then))


def _chain():
    """Run the sitecustomize this file shadows: the one the user's setup expects."""
    here = os.path.dirname(os.path.abspath(__file__))
    saved = sys.path[:]
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    mine = sys.modules.pop("sitecustomize", None)
    try:
        importlib.import_module("sitecustomize")
    except ImportError as error:
        if error.name != "sitecustomize":
            raise  # the other file's own failure: site.py reports it, as without pump
        sys.modules["sitecustomize"] = mine
    finally:
        sys.path[:] = saved


_arm()
_chain()
