"""pump: a prefetcher for CUDA Unified Memory.

pump runs an unmodified CUDA program with a small shim (``libpump.so``, loaded with
LD_PRELOAD) that sees the program's managed allocations and kernel launches and
prefetches the memory each kernel will touch onto the GPU before it runs, so the
kernel does not stall on page faults.  ``pump-run COMMAND`` is the user's entry
point; ``pump.stats`` reads the per-process counter records the shim writes.
"""

from importlib import metadata as _metadata

try:
    __version__ = _metadata.version("pump")
except _metadata.PackageNotFoundError:  # running from a source tree
    __version__ = "0.0.0+unknown"

__all__ = ["__version__"]
