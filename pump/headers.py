"""The C headers the shim and Python share, parsed with cffi (ABI mode).

``pump_stats.h`` (the per-process counter record) and ``pump_channel.h`` (the
socket messages, event ring and plan) are the single source of truth for every
layout both sides read: Python takes sizes, offsets and constants from them here
and writes none down twice.  They are installed next to the package; a source
tree's ``shim/base/`` (the shim's lowest layer) serves when running from a checkout.
"""

import functools
import importlib.resources
import pathlib

import cffi


def header_path(name: str) -> pathlib.Path:
    """The header ``name``: installed next to the package, else the source tree's shim/base/."""
    candidates = [
        pathlib.Path(str(importlib.resources.files("pump") / name)),
        pathlib.Path(__file__).resolve().parent.parent / "shim" / "base" / name,
    ]
    for path in candidates:
        if path.is_file():
            return path
    raise FileNotFoundError(
        f"{name} not found (looked in {', '.join(str(p) for p in candidates)})"
    )


@functools.cache
def load(name: str):
    """(ffi, consts) for header ``name``: its types, and its enum constants as attributes."""
    text = header_path(name).read_text()
    # cdef() takes no preprocessor lines; the headers keep everything else plain C.
    cdef = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    ffi = cffi.FFI()
    ffi.cdef(cdef)
    return ffi, ffi.dlopen(None)
