"""libpump and fakecuda build against CUDA 13.0's headers, what PyTorch's CUDA 13.0 build and
the GPU machine carry, as well as against the newest the registry serves (the rest of the suite's
build; issue 43 item 3): what later headers add and pump or fakecuda name is declared by
shim/base/cuda_compat.h and fakecuda/cuda_compat.h. Before those, libpump failed on
PFN_cuFuncGetParamCount_v13020 (13.2) and the capture hooks' 13.1 and 13.3 entry points, and
fakecuda on cuFuncGetParamCount.

The 13.0 headers are the real client's (nvidia-cuda-runtime 13.0.x in the venv of
PUMP_REAL_CLIENT_PYTHON, which CI makes); without that venv the test is skipped."""

import os
import pathlib
import re
import subprocess

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


def test_libpump_and_fakecuda_build_with_cuda_13_0_headers(tmp_path):
    include = cuda_13_0_headers()
    if include is None:
        missing = pytest.fail if os.environ.get("PUMP_REAL_CLIENT_PYTHON") else pytest.skip
        missing(f"no CUDA 13.0 headers beside {PYTHON}'s torch (scripts/real-client-venv 2.14.1 makes a venv with them)")
    build = tmp_path / "build"
    configure = subprocess.run(["cmake", "-S", str(ROOT), "-B", str(build), "-DPUMP_BUILD_TESTS=ON",
                                "-DCMAKE_BUILD_TYPE=Release", f"-DPUMP_CUDA_INCLUDE_DIR={include}"],
                               capture_output=True, text=True, timeout=300)
    assert configure.returncode == 0, configure.stderr[-3000:]
    made = subprocess.run(["cmake", "--build", str(build), "-j", str(os.cpu_count() or 2), "--target", "pump",
                           "units_plain"], capture_output=True, text=True, timeout=600)
    assert made.returncode == 0, (made.stdout + made.stderr)[-4000:]
    units = subprocess.run([str(build / "tests" / "plain" / "units")], capture_output=True, text=True, timeout=300)
    assert units.returncode == 0 and units.stdout.strip().endswith(", 0 failed"), units.stdout[-2000:]


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
