"""Follows PyTorch's caching allocator for libpump: the default `torch_allocator = "caching"`.

PyTorch reports every block its caching allocator hands out and takes back to trace
trackers, a C++ interface only (attachAllocatorTraceTracker). pump's bridge,
torch_trace.cpp beside this file, is therefore compiled against the job's own PyTorch, once
per PyTorch and pump (cached under $XDG_CACHE_HOME/pump, else ~/.cache/pump), and attached
when PyTorch initialises CUDA, which is when the allocator comes to exist, before any tensor.
libpump then sees tensors, not segments (shim/torch_trace.c).

It needs a C++ compiler ($CXX, else c++) and CUDA's runtime headers (PyPI's
nvidia-cuda-runtime and nvidia-cuda-crt, or a toolkit under $CUDA_HOME); without them the
job runs as before, pump seeing segments, after one notice. Like sitecustomize.py, this file
uses the standard library only.
"""

import ctypes
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.join(HERE, "torch_trace.cpp")
HEADER = "pump_torch_trace.h"
BUILD_TIMEOUT_S = 300


class Unavailable(Exception):
    """Why the bridge cannot be had here: said once, and the job goes on."""


def header_dir():
    """Where pump_torch_trace.h is: installed beside the package, else the source tree's shim/."""
    package = os.path.dirname(HERE)
    for candidate in (package, os.path.join(os.path.dirname(package), "shim")):
        if os.path.isfile(os.path.join(candidate, HEADER)):
            return candidate
    raise Unavailable(f"{HEADER} not found beside pump")


def cuda_include_dir():
    """A directory with CUDA's runtime headers, crt/ included (PyTorch's CUDA headers need them)."""
    candidates = [os.path.join(entry or ".", "nvidia", sub, "include")
                  for entry in sys.path for sub in ("cu13", "cuda_runtime")]
    candidates += [os.path.join(os.environ[var], "include") for var in ("CUDA_HOME", "CUDA_PATH")
                   if os.environ.get(var)]
    candidates.append("/usr/local/cuda/include")
    for candidate in candidates:
        if all(os.path.isfile(os.path.join(candidate, name))
               for name in ("cuda_runtime.h", os.path.join("crt", "host_config.h"))):
            return os.path.abspath(candidate)
    raise Unavailable("CUDA's runtime headers not found (pip install nvidia-cuda-runtime "
                      "nvidia-cuda-crt, or set CUDA_HOME to a CUDA toolkit)")


def compiler():
    found = shutil.which(os.environ.get("CXX") or "c++")
    if not found:
        raise Unavailable(f"no C++ compiler ({os.environ.get('CXX') or 'c++'} not found; set CXX)")
    return found


def compile_argv(torch, output, cuda_include, extra_includes=()):
    """The command that builds the bridge into `output`, linked to the job's PyTorch."""
    torch_dir = os.path.dirname(os.path.abspath(torch.__file__))
    lib = os.path.join(torch_dir, "lib")
    abi = int(bool(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", True)))
    includes = [arg for d in extra_includes for arg in ("-I", d)]
    return [compiler(), "-std=c++17", "-O2", "-fPIC", "-shared", f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
            *includes, "-I", header_dir(), "-isystem", os.path.join(torch_dir, "include"),
            "-isystem", cuda_include, SOURCE, "-o", output,
            "-L", lib, "-lc10_cuda", "-lc10", f"-Wl,-rpath,{lib}"]


def cache_dir():
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(root, "pump")


def build(torch):
    """The bridge's shared library for this PyTorch: from the cache, else compiled into it."""
    cuda_include = cuda_include_dir()
    key = hashlib.sha256()
    for part in (torch.__version__, os.path.abspath(torch.__file__), cuda_include):
        key.update(part.encode() + b"\0")
    for path in (SOURCE, os.path.join(header_dir(), HEADER)):
        with open(path, "rb") as f:
            key.update(f.read())
    directory = cache_dir()
    library = os.path.join(directory, f"torch_trace-{key.hexdigest()[:20]}.so")
    if os.path.isfile(library):
        return library
    try:
        os.makedirs(directory, exist_ok=True)
        fd, partial = tempfile.mkstemp(prefix=".torch_trace-", suffix=".so", dir=directory)
        os.close(fd)
    except OSError as error:
        raise Unavailable(f"cannot write its cache ({error})") from None
    try:
        argv = compile_argv(torch, partial, cuda_include)
        done = subprocess.run(argv, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
        if done.returncode != 0:
            lines = done.stderr.strip().splitlines() or [f"exit status {done.returncode}"]
            raise Unavailable(f"its build failed: {lines[-1]} (command: {' '.join(argv)})")
        os.replace(partial, library)  # whole or not at all, whichever process wins
    except subprocess.TimeoutExpired:
        raise Unavailable(f"its build took more than {BUILD_TIMEOUT_S} s") from None
    finally:
        if os.path.exists(partial):
            os.unlink(partial)
    return library


def attach(torch, notice):
    """Build (or find) the bridge and attach it; one notice where it cannot be."""
    try:
        library = ctypes.CDLL(build(torch))
        status = library.pump_torch_trace_attach()
        if status == 1:
            raise Unavailable("libpump is not in this process")
        if status != 0:
            raise Unavailable("PyTorch refused its trace tracker")
    except Exception as error:  # pump must never break the job: it goes on as without the bridge
        notice(f"PyTorch's allocator is not followed: {error}; "
               "pump sees its segments, not its tensors")


def arm(torch, notice):
    """Attach once PyTorch has initialised CUDA (now, if it has); nothing on a CPU-only build.
    `notice(message)` says why, once, where it cannot be."""
    if getattr(getattr(torch, "version", None), "cuda", None) is None:
        return
    try:
        torch.cuda._lazy_call(lambda: attach(torch, notice))
    except Exception as error:  # a PyTorch without the hook pump waits on
        notice(f"PyTorch's allocator is not followed: cannot wait for its CUDA start ({error})")
