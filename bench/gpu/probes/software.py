#!/usr/bin/env python3
"""The machine's software and the device as the driver describes it: Python, PyTorch (and the
CUDA it was built for), cuda-bindings, the driver (NVML's version and cuDriverGetVersion), every
cuDeviceGetAttribute value by name, the device's UUID and PCI ids, the PCIe link, the UVM
module's parameters (/sys/module/nvidia_uvm/parameters: the fault-prefetch and thrashing
defaults), the confidential-computing state, nvidia-smi's output, and whether this is gVisor
(whose per-driver ioctl allow-list decides what managed memory may do: issue 27 risk 6).

    python bench/gpu/probes/software.py

Prints one JSON line.  Nothing is allocated."""

import pathlib
import platform
import re
import subprocess
import sys
from importlib import metadata

import probe
from cudrv import call, cu


def version(dist):
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def output(argv, limit=20000):
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        return (proc.stdout + proc.stderr)[:limit]
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unavailable: {exc}"


def gvisor() -> dict:
    """gVisor announces itself in dmesg, and its /proc/version is a fixed 4.4.0 string."""
    proc_version = pathlib.Path("/proc/version").read_text().strip()
    dmesg = output(["dmesg"], 4000)
    return {"detected": "gVisor" in dmesg or proc_version.startswith("Linux version 4.4.0 #1 SMP Sun Jan 10 15:06:54"),
            "proc_version": proc_version, "dmesg_head": dmesg[:600]}


def nvml() -> dict:
    try:
        import pynvml
        pynvml.nvmlInit()
    except Exception as exc:  # no NVML: said, not fatal
        return {"error": f"{type(exc).__name__}: {exc}"}
    out = {}
    try:
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        for key, fn in (("driver", lambda: pynvml.nvmlSystemGetDriverVersion()),
                        ("cuda_driver_version", lambda: pynvml.nvmlSystemGetCudaDriverVersion()),
                        ("pcie_link_generation_max", lambda: pynvml.nvmlDeviceGetMaxPcieLinkGeneration(h)),
                        ("pcie_link_width_max", lambda: pynvml.nvmlDeviceGetMaxPcieLinkWidth(h)),
                        ("pcie_link_generation", lambda: pynvml.nvmlDeviceGetCurrPcieLinkGeneration(h)),
                        ("pcie_link_width", lambda: pynvml.nvmlDeviceGetCurrPcieLinkWidth(h)),
                        ("pci", lambda: {f: getattr(info, f) for info in [pynvml.nvmlDeviceGetPciInfo(h)]
                                         for f in ("busId", "pciDeviceId", "pciSubSystemId")}),
                        ("conf_compute", lambda: {f: getattr(s, f) for s in [pynvml.nvmlSystemGetConfComputeState()]
                                                  for f in ("environment", "ccFeature", "devToolsMode")})):
            try:
                value = fn()
                out[key] = value.decode() if isinstance(value, bytes) else value
            except Exception as exc:  # an NVML call this driver or stand-in lacks
                out[key] = f"unavailable: {type(exc).__name__}: {exc}"
    finally:
        pynvml.nvmlShutdown()
    return out


def main() -> int:
    doc = {"probe": "software", "python": platform.python_version(), "executable": sys.executable,
           "packages": {d: version(d) for d in ("torch", "cuda-bindings", "nvidia-ml-py", "numpy", "cupy-cuda13x",
                                                "cffi", "pycparser", "pump")},
           "gvisor": gvisor(), "nvml": nvml()}
    try:
        import torch
        doc["torch_cuda"] = torch.version.cuda
    except ImportError as exc:
        doc["torch_cuda"] = f"unavailable: {exc}"
    uvm = pathlib.Path("/sys/module/nvidia_uvm/parameters")
    doc["nvidia_uvm_parameters"] = ({p.name: p.read_text().strip() for p in sorted(uvm.iterdir()) if p.is_file()}
                                    if uvm.is_dir() else "no /sys/module/nvidia_uvm (no UVM module visible)")
    doc["nvidia_smi"] = output(["nvidia-smi"])
    doc["nvidia_smi_q"] = output(["nvidia-smi", "-q"])
    doc["conf_compute_smi"] = output(["nvidia-smi", "conf-compute", "-f"], 2000)
    try:
        call("cuInit", 0)
        dev = call("cuDeviceGet", 0)
    except probe.cudrv.CudaError as exc:
        doc["finding"] = f"the driver refused to start: {exc}"
        probe.emit(doc)
        return 0
    doc["cuDriverGetVersion"] = call("cuDriverGetVersion")
    doc["name"] = call("cuDeviceGetName", 256, dev).split(b"\0")[0].decode()
    doc["uuid"] = probe.attempt(lambda: bytes(call("cuDeviceGetUuid", dev).bytes).hex())
    doc["pci_bus_id"] = probe.attempt(lambda: call("cuDeviceGetPCIBusId", 64, dev).split(b"\0")[0].decode())
    doc["total_mem"] = probe.attempt(call, "cuDeviceTotalMem", dev)
    attrs = {}
    for name, member in cu.CUdevice_attribute.__members__.items():
        if re.search(r"_MAX$", name):
            continue
        value = probe.attempt(call, "cuDeviceGetAttribute", member, dev)
        attrs[name.removeprefix("CU_DEVICE_ATTRIBUTE_")] = value
    doc["attributes"] = attrs
    probe.emit(doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
