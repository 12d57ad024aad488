"""pump/boot/sitecustomize.py: the start-up hook that puts pump's allocator under PyTorch
when a job asks for it, tested against a stand-in `torch` package (the real switch needs a
CUDA build of PyTorch: tests/test_gpu.py)."""

import os
import pathlib
import subprocess
import sys
import textwrap

import pump

BOOT = pathlib.Path(pump.__file__).parent / "boot"

FAKE_TORCH = {
    "torch/__init__.py": "from . import cuda\n",
    "torch/cuda/__init__.py": "from . import memory\n",
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
