"""Builds pump's C++ bridges to PyTorch against the job's own PyTorch, once per PyTorch and pump.

Two bridges talk to PyTorch's C++ interfaces, whose types are its C++ ABI, so each is compiled
here against the job's PyTorch headers and libraries (cached under $XDG_CACHE_HOME/pump, else
~/.cache/pump): torch_trace.cpp follows its caching allocator (_pump_torch_trace.py), and
torch_allocator.cpp is pump's allocator with PyTorch's memory answers (_pump_torch_allocator.py).

It needs a C++ compiler ($CXX, else c++) and CUDA's runtime headers (PyPI's
nvidia-cuda-runtime and nvidia-cuda-crt, or a toolkit under $CUDA_HOME); without them the
caller says so once and the job goes on. Like sitecustomize.py, this file uses the standard
library only.
"""

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
HEADER = "pump_torch_trace.h"
BUILD_TIMEOUT_S = 300


class Unavailable(Exception):
    """Why the bridge cannot be had here: said once, and the job goes on."""


def header_dir():
    """Where pump_torch_trace.h is: installed beside the package, else the source tree's shim/base/."""
    package = os.path.dirname(HERE)
    for candidate in (package, os.path.join(os.path.dirname(package), "shim", "base")):
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


def compile_argv(torch, source, libs, output, cuda_include, extra_includes=()):
    """The command that builds `source` (beside this file) into `output`, linked to the job's
    PyTorch's `libs`."""
    torch_dir = os.path.dirname(os.path.abspath(torch.__file__))
    lib = os.path.join(torch_dir, "lib")
    abi = int(bool(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", True)))
    includes = [arg for d in extra_includes for arg in ("-I", d)]
    # C++20, as torch.utils.cpp_extension builds against these headers (2.13 and 2.14 both):
    # 2.14's c10/util/intrusive_ptr.h declares operator<=> (std::strong_ordering).
    return [compiler(), "-std=c++20", "-O2", "-fPIC", "-shared", f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
            *includes, "-I", header_dir(), "-isystem", os.path.join(torch_dir, "include"),
            "-isystem", cuda_include, os.path.join(HERE, source), "-o", output,
            "-L", lib, *(f"-l{name}" for name in libs), f"-Wl,-rpath,{lib}"]


def first_error(done):
    """The compiler's first error line: its last line is a caret or a count, naming nothing."""
    lines = done.stderr.strip().splitlines()
    errors = [line for line in lines if "error" in line]
    return (errors or lines or [f"exit status {done.returncode}"])[0].strip()


def cache_dir():
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(root, "pump")


def build(torch, source, libs):
    """The shared library of `source` for this PyTorch: from the cache, else compiled into it."""
    cuda_include = cuda_include_dir()
    key = hashlib.sha256()
    # the command (a new flag makes a new build), this PyTorch, the sources
    for part in (*compile_argv(torch, source, libs, "", cuda_include), torch.__version__):
        key.update(part.encode() + b"\0")
    for path in (os.path.join(HERE, source), os.path.join(header_dir(), HEADER)):
        with open(path, "rb") as f:
            key.update(f.read())
    directory = cache_dir()
    stem = os.path.splitext(source)[0]
    library = os.path.join(directory, f"{stem}-{key.hexdigest()[:20]}.so")
    if os.path.isfile(library):
        return library
    try:
        os.makedirs(directory, exist_ok=True)
        fd, partial = tempfile.mkstemp(prefix=f".{stem}-", suffix=".so", dir=directory)
        os.close(fd)
    except OSError as error:
        raise Unavailable(f"cannot write its cache ({error})") from None
    try:
        argv = compile_argv(torch, source, libs, partial, cuda_include)
        done = subprocess.run(argv, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
        if done.returncode != 0:
            raise Unavailable(f"its build failed: {first_error(done)} (command: {' '.join(argv)})")
        os.replace(partial, library)  # whole or not at all, whichever process wins
    except subprocess.TimeoutExpired:
        raise Unavailable(f"its build took more than {BUILD_TIMEOUT_S} s") from None
    finally:
        if os.path.exists(partial):
            os.unlink(partial)
    return library
