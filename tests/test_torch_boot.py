"""pump/boot/: the start-up hook that puts pump's allocator under PyTorch when a job asks
for it, or else follows PyTorch's caching allocator through the bridge it builds
(_pump_torch_trace.py, torch_trace.cpp; _pump_torch_build.py builds it, and pump's allocator's,
torch_allocator.cpp). Tested against a stand-in `torch` package (the real
switch and the attached bridge need a CUDA build of PyTorch: tests/test_gpu.py), and the
bridge's source compiled against the real PyTorch headers."""

import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

import pump

BOOT = pathlib.Path(pump.__file__).parent / "boot"

FAKE_TORCH = {
    "torch/__init__.py": "from . import _C, cuda, version\n__version__ = '0.0+fake'\n",
    "torch/_C.py": "_GLIBCXX_USE_CXX11_ABI = True\n",
    "torch/version.py": "import os\ncuda = os.environ.get('FAKE_TORCH_CUDA') or None\n",
    "torch/cuda/__init__.py": textwrap.dedent("""\
        from . import memory
        queued = []
        def _lazy_call(callable):
            queued.append(callable)
        def _lazy_init():
            for callable in queued:
                callable()
        """),
    "torch/cuda/memory.py": textwrap.dedent("""\
        import os
        calls = []
        class CUDAPluggableAllocator:
            def __init__(self, path, alloc, free):
                if os.environ.get("FAKE_TORCH_CPU_ONLY"):
                    raise AttributeError("module 'torch._C' has no attribute '_cuda_customAllocator'")
                self.args = (path, alloc, free)
        def change_current_allocator(allocator):
            calls.append(allocator.args)
        """),
}


def _tree(root: pathlib.Path, files: dict) -> pathlib.Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def _run(tmp_path, code, *, extra_path=(), **env):
    fake = _tree(tmp_path / "fake", FAKE_TORCH)
    full_env = {k: v for k, v in os.environ.items() if k not in ("PUMP_TORCH_ALLOCATOR", "LD_PRELOAD")}
    full_env.update(env)
    full_env["PYTHONPATH"] = os.pathsep.join([str(BOOT), str(fake), *map(str, extra_path)])
    return subprocess.run([sys.executable, "-c", code], env=full_env, capture_output=True, text=True, timeout=60)


SHOW = "import torch; print(torch.cuda.memory.calls)"


def test_pump_allocator_installed_when_torch_is_imported(tmp_path):
    # LD_PRELOAD names a library that does not exist: the loader says so and goes on.
    r = _run(tmp_path, SHOW, PUMP_TORCH_ALLOCATOR="pump", LD_PRELOAD="/nowhere/libpump.so")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[('/nowhere/libpump.so', 'pump_torch_alloc', 'pump_torch_free')]"


def test_shim_path_falls_back_to_the_developer_override(tmp_path):
    r = _run(tmp_path, SHOW, PUMP_TORCH_ALLOCATOR="pump", PUMP_SHIM_PATH="/dev/libpump.so")
    assert "'/dev/libpump.so'" in r.stdout, r.stderr


def test_caching_or_unset_leaves_torch_alone(tmp_path):
    for value in ("caching", ""):
        r = _run(tmp_path, SHOW, PUMP_TORCH_ALLOCATOR=value, LD_PRELOAD="/nowhere/libpump.so")
        assert r.stdout.strip() == "[]"
        assert "pump:" not in r.stderr


def test_failure_is_one_notice_and_the_program_goes_on(tmp_path):
    r = _run(tmp_path, SHOW + "; print('still running')", PUMP_TORCH_ALLOCATOR="pump",
             LD_PRELOAD="/nowhere/libpump.so", FAKE_TORCH_CPU_ONLY="1")
    assert r.returncode == 0
    assert r.stdout.split("\n")[1] == "still running"
    notices = [line for line in r.stderr.splitlines() if line.startswith("pump:")]
    assert len(notices) == 1 and "_cuda_customAllocator" in notices[0], r.stderr


def test_no_shim_in_the_process_is_a_notice(tmp_path):
    r = _run(tmp_path, SHOW, PUMP_TORCH_ALLOCATOR="pump")
    assert r.stdout.strip() == "[]"
    assert "libpump.so is not in LD_PRELOAD" in r.stderr


def test_a_bad_choice_is_named_with_what_is_allowed(tmp_path):
    r = _run(tmp_path, SHOW, PUMP_TORCH_ALLOCATOR="cudaMallocAsync", LD_PRELOAD="/nowhere/libpump.so")
    assert r.stdout.strip() == "[]"
    assert "PUMP_TORCH_ALLOCATOR='cudaMallocAsync' is not one of caching, pump" in r.stderr


def test_the_shadowed_sitecustomize_still_runs(tmp_path):
    other = _tree(tmp_path / "other", {"sitecustomize.py": "import builtins; builtins.OTHER_SITE = 'ran'\n"})
    r = _run(tmp_path, "import builtins, sitecustomize; print(builtins.OTHER_SITE, sitecustomize.__file__)",
             extra_path=[other])
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["ran", str(other / "sitecustomize.py")]


def test_an_error_inside_the_shadowed_sitecustomize_is_reported_as_without_pump(tmp_path):
    other = _tree(tmp_path / "other", {"sitecustomize.py": "import no_such_module_here\n"})
    r = _run(tmp_path, "print('ran')", extra_path=[other])
    assert r.stdout.strip() == "ran"
    assert "no_such_module_here" in r.stderr  # site.py's own report, as it would be without pump


# ---- following the caching allocator: the bridge, built and attached at CUDA's start ----

START_CUDA = "import torch; print(len(torch.cuda.queued)); torch.cuda._lazy_init(); print('ran')"
# A stand-in compiler: logs its arguments, writes an output that is no shared library.
FAKE_CXX = """#!/bin/sh
echo "$@" >> "$FAKE_CXX_LOG"
while [ "$1" != "-o" ]; do shift; done
echo not-elf > "$2"
"""


def _follow(tmp_path, **env):
    cxx = tmp_path / "fake-c++"
    if not cxx.exists():
        cxx.write_text(FAKE_CXX)
        cxx.chmod(0o755)
    settings = dict(PUMP_MANAGED_ALL="1", FAKE_TORCH_CUDA="13.0", CXX=str(cxx),
                    FAKE_CXX_LOG=str(tmp_path / "cxx.log"), XDG_CACHE_HOME=str(tmp_path / "cache"))
    settings.update(env)
    return _run(tmp_path, START_CUDA, **settings)


def _notices(r):
    return [line for line in r.stderr.splitlines() if line.startswith("pump:")]


def test_the_bridge_is_built_once_and_attached_when_cuda_starts(tmp_path):
    r = _follow(tmp_path)
    assert r.returncode == 0 and r.stdout.split() == ["1", "ran"], r.stderr
    argv = (tmp_path / "cxx.log").read_text().split()
    assert "-D_GLIBCXX_USE_CXX11_ABI=1" in argv and "-lc10_cuda" in argv
    assert str(tmp_path / "fake" / "torch" / "include") in argv
    assert argv[argv.index("-o") + 1].startswith(str(tmp_path / "cache" / "pump"))
    # The stand-in's output does not load: one notice, and the job goes on.
    notices = _notices(r)
    assert len(notices) == 1 and "PyTorch's allocator is not followed" in notices[0], r.stderr
    assert "pump sees its segments, not its tensors" in notices[0]
    # The next job finds it in the cache: no second build.
    assert _follow(tmp_path).stdout.split() == ["1", "ran"]
    assert len((tmp_path / "cxx.log").read_text().splitlines()) == 1
    assert not [f for f in (tmp_path / "cache" / "pump").iterdir() if f.name.startswith(".")]


def test_a_failed_build_is_one_notice_naming_the_compiler_error(tmp_path):
    cxx = tmp_path / "broken-c++"
    cxx.write_text("#!/bin/sh\necho 'torch_trace.cpp:9: error: no member named attach' >&2\nexit 1\n")
    cxx.chmod(0o755)
    r = _follow(tmp_path, CXX=str(cxx))
    assert r.stdout.split() == ["1", "ran"]
    notices = _notices(r)
    assert len(notices) == 1 and "its build failed: torch_trace.cpp:9: error: no member named attach" in notices[0]
    assert list((tmp_path / "cache" / "pump").iterdir()) == []  # nothing half-built left


def test_a_failed_build_names_the_first_error_not_the_last_line(tmp_path):
    # What g++ prints for torch 2.14's headers under -std=c++17: the error, then context lines.
    cxx = tmp_path / "broken-c++"
    cxx.write_text("#!/bin/sh\ncat >&2 <<'EOF'\nIn file included from c10/core/Allocator.h:12,\n"
                   "c10/util/intrusive_ptr.h:775:27: error: 'strong_ordering' in namespace 'std' does not name a type\n"
                   "  775 | [[nodiscard]] inline std::strong_ordering operator<=>(\n"
                   "      |                           ^~~~~~~~~~~~~~~\nEOF\nexit 1\n")
    cxx.chmod(0o755)
    notices = _notices(_follow(tmp_path, CXX=str(cxx)))
    assert len(notices) == 1 and "its build failed: c10/util/intrusive_ptr.h:775:27: error: 'strong_ordering'" in \
        notices[0], notices


def test_no_compiler_is_one_notice(tmp_path):
    r = _follow(tmp_path, CXX="/nowhere/c++")
    assert r.stdout.split() == ["1", "ran"]
    assert "no C++ compiler (/nowhere/c++ not found; set CXX)" in _notices(r)[0]


@pytest.mark.parametrize("setting", [{"FAKE_TORCH_CUDA": ""}, {"PUMP_MANAGED_ALL": "0"}],
                         ids=["cpu-build", "no-managed-all"])
def test_nothing_to_follow_is_silent(tmp_path, setting):
    r = _follow(tmp_path, **setting)
    # A CPU-only build has no CUDA allocator; without managed_all its memory is not pump's.
    assert r.stdout.split() == ["0", "ran"] and _notices(r) == [], r.stderr
    assert not (tmp_path / "cxx.log").exists()


@pytest.mark.parametrize("source, libs, symbol, needs", [
    ("torch_trace.cpp", ("c10_cuda", "c10"), "pump_torch_trace_attach", "pump_torch_trace"),
    ("torch_allocator.cpp", ("torch_cuda", "c10_cuda", "c10"), "pump_torch_allocator_install", "pump_torch_alloc"),
])
def test_the_bridges_compile_against_the_real_pytorch_headers(tmp_path, source, libs, symbol, needs):
    """Each bridge against the installed PyTorch's C++ headers (the pinned version of the
    models extra), as the job's build would compile it; only linking needs a CUDA build
    (tests/test_real_client_allocators.py builds and runs both against PyTorch's CUDA build)."""
    torch = pytest.importorskip("torch")
    sys.path.insert(0, str(BOOT))
    try:
        import _pump_torch_build as bridges
    finally:
        sys.path.remove(str(BOOT))
    # CPU builds of PyTorch leave out this one generated header; CUDA builds have it.
    stub = _tree(tmp_path / "stub", {"c10/cuda/impl/cuda_cmake_macros.h": "#pragma once\n"})
    obj = tmp_path / "bridge.o"
    argv = bridges.compile_argv(torch, source, libs, str(obj), bridges.cuda_include_dir(), extra_includes=[stub])
    argv = ["-c" if arg == "-shared" else arg for arg in argv[:argv.index("-o") + 2]]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    symbols = subprocess.run(["nm", "-C", str(obj)], capture_output=True, text=True).stdout
    assert f"T {symbol}" in symbols
    assert "U c10::cuda::CUDACachingAllocator::allocator" in symbols or "changeCurrentAllocator" in symbols
    assert f"w {needs}" in symbols  # libpump's, when the process has it
