"""What a GPU suite run ran on and with: the software's versions and the GPU as NVML names it
(bench/gpu/suite.py's JSON: `versions`, `device`)."""

import os
import pathlib
import platform
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[2]


def versions() -> dict:
    from importlib import metadata
    out = {"python": platform.python_version()}
    for dist in ("pump", "cuda-bindings", "torch", "nvidia-ml-py", "numpy"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = None
    def output(argv):
        try:
            return subprocess.run(argv, capture_output=True, text=True, timeout=120).stdout.strip() or None
        except (OSError, subprocess.TimeoutExpired):
            return None
    out["torch_cuda"] = output([sys.executable, "-c", "import torch; print(torch.version.cuda)"])
    out["commit"] = output(["git", "-C", str(REPO), "rev-parse", "HEAD"]) or os.environ.get("PUMP_COMMIT")
    return out


def device_info() -> dict:
    """GPU 0 as NVML names it, with the driver and the CUDA version the driver supports."""
    import pynvml
    pynvml.nvmlInit()
    try:
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        name = pynvml.nvmlDeviceGetName(h)
        driver = pynvml.nvmlSystemGetDriverVersion()
        cuda = pynvml.nvmlSystemGetCudaDriverVersion()
        mem = pynvml.nvmlDeviceGetMemoryInfo(h)
        return {"name": name.decode() if isinstance(name, bytes) else name,
                "driver": driver.decode() if isinstance(driver, bytes) else driver,
                "cuda_driver_version": f"{cuda // 1000}.{cuda % 1000 // 10}", "memory_total_bytes": int(mem.total),
                "memory_free_at_start_bytes": int(mem.free)}
    finally:
        pynvml.nvmlShutdown()
