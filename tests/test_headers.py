"""libpump and fakecuda build against CUDA 13.0's headers, what PyTorch's CUDA 13.0 build and
the GPU machine carry, as well as against the newest the registry serves (the rest of the suite's
build; issue 43 item 3): what later headers add and pump or fakecuda name is declared by
shim/base/cuda_compat.h and fakecuda/cuda_compat.h. Before those, libpump failed on
PFN_cuFuncGetParamCount_v13020 (13.2) and the capture hooks' 13.1 and 13.3 entry points, and
fakecuda on cuFuncGetParamCount.

The 13.0 headers are the real client's (nvidia-cuda-runtime 13.0.x in the venv of
PUMP_REAL_CLIENT_PYTHON, which CI makes); without that venv the test is skipped. libpump and
fakecuda (the library) also build with CUDA 12's (shim/base/cuda_compat.h and
fakecuda/cuda_compat.h declare what 12.5, 12.8, 12.9 and 13.0 added): libpump with the test
extra's nvidia-cuda-runtime-cu12 (the newest 12.x), both with 12.4's, the first with the 550
driver series, fetched once (pip download) into ~/.cache/pump-ci; where it cannot be fetched,
that case is skipped. fakecuda's self-test is a client of 13.0's API (cuMemPrefetchAsync,
cuMemAdvise and cuCtxCreate changed their prototypes in 13.0), so the suite's own build of it
runs against the 12.x-built library: the same exports and answers. Before,
libpump failed on PFN_cuMemPrefetchBatchAsync_v13000 and four more, fakecuda on
cuMemPrefetchBatchAsync, CU_MEM_ALLOCATION_TYPE_MANAGED and 13.0's CUdevSmResource fields."""

import os
import pathlib
import re
import subprocess
import sys
import zipfile

import pytest

from test_real_client import PYTHON

ROOT = pathlib.Path(__file__).resolve().parent.parent


def cuda_13_0_headers():
    """The include folder of the real client's CUDA 13.0 runtime, or None."""
    probe = subprocess.run([PYTHON, "-c", "import nvidia, os; print(os.path.dirname(nvidia.__path__[0]))"],
                           capture_output=True, text=True, timeout=120)
    if probe.returncode != 0:
        return None
    for include in pathlib.Path(probe.stdout.strip(), "nvidia").glob("cu*/include"):
        header = include / "cuda.h"
        found = header.is_file() and re.search(r"#define CUDA_VERSION (\d+)", header.read_text(errors="replace"))
        if found and found.group(1) == "13000":
            return include
    return None


def build_libpump_and_units(include, tmp_path, selftest=None):
    """Builds libpump and the shim's unit tests with the cuda.h in `include`, and runs the units;
    with `selftest` (a fakecuda self-test built by the suite), builds fakecuda too and runs the
    self-test against it."""
    build = tmp_path / "build"
    configure = subprocess.run(["cmake", "-S", str(ROOT), "-B", str(build), "-DPUMP_BUILD_TESTS=ON",
                                "-DCMAKE_BUILD_TYPE=Release", f"-DPUMP_CUDA_INCLUDE_DIR={include}"],
                               capture_output=True, text=True, timeout=300)
    assert configure.returncode == 0, configure.stderr[-3000:]
    targets = ["pump", "units_plain"] + (["fakecuda_plain"] if selftest else [])
    made = subprocess.run(["cmake", "--build", str(build), "-j", str(os.cpu_count() or 2), "--target", *targets],
                          capture_output=True, text=True, timeout=600)
    assert made.returncode == 0, (made.stdout + made.stderr)[-4000:]
    units = subprocess.run([str(build / "tests" / "plain" / "units")], capture_output=True, text=True, timeout=300)
    assert units.returncode == 0 and units.stdout.strip().endswith(", 0 failed"), units.stdout[-2000:]
    if selftest:
        env = {**os.environ, "LD_LIBRARY_PATH": str(build / "tests" / "plain")}  # before the self-test's RUNPATH
        run = subprocess.run([str(selftest)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
        assert run.returncode == 0 and run.stdout.rstrip().endswith(" 0 failed"), run.stdout[-2000:] + run.stderr[-2000:]


def test_libpump_and_fakecuda_build_with_cuda_13_0_headers(tmp_path):
    include = cuda_13_0_headers()
    if include is None:
        missing = pytest.fail if os.environ.get("PUMP_REAL_CLIENT_PYTHON") else pytest.skip
        missing(f"no CUDA 13.0 headers beside {PYTHON}'s torch (scripts/real-client-venv 2.14.1 makes a venv with them)")
    build_libpump_and_units(include, tmp_path)


CUDA_12_4 = "12.4.127"


def cuda_12_headers(version):
    """The include folder of nvidia-cuda-runtime-cu12: the test extra's (version None), or `version`'s
    wheel, fetched once into ~/.cache/pump-ci; None where there is none."""
    if version is None:
        import nvidia
        found = [p / "cuda_runtime" / "include" for p in map(pathlib.Path, nvidia.__path__)
                 if (p / "cuda_runtime" / "include" / "cuda.h").is_file()]
        return found[0] if found else None
    cache = pathlib.Path.home() / ".cache" / "pump-ci" / f"cuda-runtime-cu12-{version}"
    include = cache / "nvidia" / "cuda_runtime" / "include"
    if not (include / "cuda.h").is_file():
        wheels = cache.with_name(cache.name + "-wheel")
        fetched = subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--dest",
                                  str(wheels), f"nvidia-cuda-runtime-cu12=={version}"],
                                 capture_output=True, text=True, timeout=300)
        if fetched.returncode != 0:
            return None
        for wheel in wheels.glob("*.whl"):
            with zipfile.ZipFile(wheel) as z:
                z.extractall(cache)
    return include if (include / "cuda.h").is_file() else None


@pytest.mark.parametrize("version", [None, CUDA_12_4], ids=["test_extra", CUDA_12_4])
def test_libpump_and_fakecuda_build_with_cuda_12_headers(tmp_path, c_build, version):
    include = cuda_12_headers(version)
    if include is None:
        pytest.skip(f"no nvidia-cuda-runtime-cu12 {version or ''} (pip download could not fetch it)")
    # fakecuda with the oldest only (12.4 lacks every name cuda_compat.h declares): CI's time
    build_libpump_and_units(include, tmp_path, selftest=c_build / "plain" / "fakecuda_selftest" if version else None)


def test_fakecuda_builds_as_a_project_of_its_own_and_passes_its_self_test(tmp_path):
    """fakecuda/CMakeLists.txt (issue 42: fakecuda a component of its own), with CUDA 13.0's headers."""
    include = cuda_13_0_headers()
    if include is None:
        missing = pytest.fail if os.environ.get("PUMP_REAL_CLIENT_PYTHON") else pytest.skip
        missing(f"no CUDA 13.0 headers beside {PYTHON}'s torch (scripts/real-client-venv 2.14.1 makes a venv with them)")
    build = tmp_path / "fakecuda"
    configure = subprocess.run(["cmake", "-S", str(ROOT / "fakecuda"), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release",
                                f"-DFAKECUDA_CUDA_INCLUDE_DIR={include}"], capture_output=True, text=True, timeout=300)
    assert configure.returncode == 0, configure.stderr[-3000:]
    made = subprocess.run(["cmake", "--build", str(build), "-j", str(os.cpu_count() or 2)],
                          capture_output=True, text=True, timeout=600)
    assert made.returncode == 0, (made.stdout + made.stderr)[-4000:]
    run = subprocess.run([str(build / "fakecuda_selftest")], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and run.stdout.rstrip().endswith(" 0 failed"), run.stdout[-2000:] + run.stderr[-2000:]
    refused = subprocess.run(["cmake", "-S", str(ROOT / "fakecuda"), "-B", str(tmp_path / "none"),
                              f"-DFAKECUDA_CUDA_INCLUDE_DIR={tmp_path}"], capture_output=True, text=True, timeout=300)
    assert refused.returncode != 0 and "has no cuda.h" in refused.stderr, refused.stderr[-2000:]
