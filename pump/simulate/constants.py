"""Every constant of pump's simulator, named, with its source (issue 4: "every constant of
the model lives in one file").  Change one only with new evidence, never to pass a target.

Two models share the engine:
- ``H100`` (the default): an NVIDIA H100 PCIe card on a PCIe Gen5 x16 link, the UVM driver's
  fault path and eviction as read from its source (../shared/research/PREFETCHING.md §4-5).
- ``FAKECUDA``: tests/fakecuda's CPU model, its constants read from fakecuda_model.h (not
  copied), used to predict what a replay on fakecuda counts (faults and bytes, not time).

Sources cited below:
  [H100]  NVIDIA H100 Tensor Core GPU datasheet (nvidia.com, 2023), column "H100 PCIe":
          BF16 Tensor Core 1,513 TFLOPS *with sparsity* (dense: half), GPU memory 80 GB,
          memory bandwidth 2 TB/s, PCIe Gen5: 128 GB/s (both directions together).
          FP32 51 TFLOPS, TF32 Tensor Core 756 TFLOPS *with sparsity*.
  [TF32]  PyTorch documentation, "CUDA semantics", section "TensorFloat-32 (TF32) on Ampere
          (and later) devices": torch.backends.cuda.matmul.allow_tf32 defaults to False (since
          PyTorch 1.12), torch.backends.cudnn.allow_tf32 to True.
  [PCIE5] PCI Express Base Specification 5.0 (PCI-SIG, 2019): 32 GT/s per lane, 128b/130b
          encoding; x16 carries 32e9 * 16 * 128/130 / 8 = 63.0e9 bytes/s each way.
  [UVM]   NVIDIA open-gpu-kernel-modules 595.45.04, kernel-open/nvidia-uvm/ (PREFETCHING.md §4):
          uvm_va_block_types.h, uvm_pmm_gpu.h, uvm_gpu_replayable_faults.c, uvm_pmm_gpu.c.
  [OBS]   ObservUVM §II, citing prior work (PREFETCHING.md §4.4): "10-50 us per fault
          serviced; 64 KiB migrated per fault".
  [CUDF]  G. Kimball (NVIDIA), facebookincubator/velox#15022 (PREFETCHING.md §5): "Driver
          paging is about 10x lower throughput than explicit prefetching (which approaches
          the interconnect limit)": a cross-check of [OBS] and [PCIE5], not an input.
  [DISCARD] CUDA 13 driver API, cuMemDiscardBatchAsync (cuda-python's cuda.bindings docs):
          discarding "informs the driver that the contents of that range are no longer
          useful", "allows the driver to optimize certain data migrations", and is undone by a
          write or a prefetch.  The UVM driver's UVM_DISCARD (open-gpu-kernel-modules 580,
          uvm_va_block.c and uvm_pmm_gpu.c, as read in a public analysis of that tree):
          discarded pages are not copied on migration and keep that state through the driver's
          eviction until a writable mapping or an API migration; wholly discarded root chunks
          are evicted before used ones.  Whether libcuda's call reaches UVM_DISCARD is not
          visible there: bench/gpu/discard.py measures the copies on a GPU.
  [SO]    stackoverflow.com/questions/53970187 (NVIDIA forum thread 68937 likewise), measured:
          "It takes 4~5us to launch a kernel"; after about 1000 queued kernels a launch waits
          for a kernel to finish ("the buffer size is about 1000 kernel").
"""

import os
import re

KIB, MIB = 1 << 10, 1 << 20

# ---- units of managed memory ([UVM] §4.1; pump's shim and fakecuda use the same) ----
# The fault and migration unit: the big page, UVM_BIG_PAGE_SIZE.
PAGE_BYTES = 64 * KIB
# The VA block (UVM_VA_BLOCK_BITS 21) and the GPU root chunk (UVM_CHUNK_SIZE_MAX): the unit of
# residency accounting, of eviction by the driver, and of pump's plans.
BLOCK_BYTES = 2 * MIB
PAGES_PER_BLOCK = BLOCK_BYTES // PAGE_BYTES

# ---- the GPU: H100 PCIe ([H100]) ----
# The traces are fp32 training (pump trace generate), and PyTorch's defaults decide where fp32
# FLOPs run ([TF32]): matrix multiplies on the FP32 units (torch.backends.cuda.matmul.allow_tf32
# is False by default), convolutions on TF32 tensor cores (torch.backends.cudnn.allow_tf32 is
# True by default).
# FP32 peak: 51 TFLOPS.
H100_PEAK_FLOPS = 51e12
# TF32 tensor-core peak: 756 TFLOPS with 2:4 sparsity / 2 (dense).
H100_TF32_FLOPS = 756e12 / 2
# HBM2e bandwidth of the PCIe card: the roofline's memory roof.
H100_HBM_BYTES_PER_S = 2.0e12
# Device memory: the capacity when none is given is this (80 GB, decimal as the datasheet).
H100_MEMORY_BYTES = 80 * 10**9

# ---- the link: PCIe Gen5 x16 ([PCIE5]; [H100] states 128 GB/s for both directions) ----
# Per direction; prefetch (host->GPU) and eviction (GPU->host) run full duplex, one copy
# stream each, both at this rate (explicit prefetch "approaches the interconnect limit" [CUDF]).
PCIE5_X16_BYTES_PER_S = 32e9 * 16 * 128 / 130 / 8

# ---- the driver's fault path ([UVM] §4.3-4.4, [OBS]) ----
# Faults are fetched and serviced in batches of uvm_perf_fault_batch_count (default 256).
FAULT_BATCH_FAULTS = 256
# Time the faulting kernel stalls per serviced fault, the 64 KiB migration included: the low
# end of [OBS]'s 10-50 us (the figure most favourable to fault-driven paging).  64 KiB / 10 us
# = 6.6 GB/s, about 10x below the link's 63 GB/s, as [CUDF] reports.
FAULT_SERVICE_S = 10e-6
# When the GPU is full the driver evicts 2 MiB root chunks, least recently MIGRATED first
# (pick_root_chunk_to_evict: the USED list is ordered by allocation/migration, not access), on
# the fault path: the faulting kernel waits for the copy to the host at the link's rate.
# Discarded memory ([DISCARD]): pages discarded while on the GPU are not copied when evicted, by
# the driver or by pump, and rank first among the driver's victims.  Brought back, they are
# copied like live pages: pump's eviction is a prefetch, and a prefetch ends a discard (the
# CUDA documentation; fakecuda does the same).  Kept on the safe side where the sources allow
# better: the driver's own eviction keeps the discard, and memory discarded on the host is not
# copied on its way back; the model credits neither until bench/gpu/discard.py has measured it.

# ---- the host ([SO]) ----
# CPU time per kernel launch in the application's thread (4-5 us measured: the middle).
HOST_LAUNCH_S = 4.5e-6
# Kernels a stream queues before a launch call blocks until one finishes.
LAUNCH_QUEUE_DEPTH = 1000

# ---- pumpd (the daemon's own parameters, not physics) ----
# Launches pumpd ingests per ring read in the simulation.  pumpd sweeps the rings every 5 to
# 25 ms (daemon/pumpd/server.py, INGEST_INTERVAL_MIN/MAX) and a plan it publishes takes effect
# from the next launch on; a training job launches at the pace its kernels finish, which in the
# four bench/traces models is 61-90 us per launch on the H100 model (their roofline step time
# over their launches per step), so a sweep reads 55-410 launches.  256 is within that span:
# a sweep every 16-23 ms.
DAEMON_READ_LAUNCHES = 256


# ---- fakecuda: read from tests/fakecuda/fakecuda_model.h, never copied by hand ----
def _fakecuda_model_h() -> str:
    """fakecuda_model.h: installed next to the package, else the source tree's copy."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    installed = os.path.join(package, "fakecuda_model.h")
    if os.path.isfile(installed):
        return installed
    return os.path.join(os.path.dirname(package), "tests", "fakecuda", "fakecuda_model.h")


FAKECUDA_MODEL_H = _fakecuda_model_h()
_DEFINE = re.compile(r"^#define\s+(FAKECUDA_\w+)\s+(.+?)\s*$", re.M)


def fakecuda_constants(path: str = FAKECUDA_MODEL_H) -> dict:
    """{name: int} of fakecuda_model.h's numeric #defines; ValueError naming the file if it
    cannot be read or lacks what the simulator needs."""
    try:
        text = open(path).read()
    except OSError as exc:
        raise ValueError(f"{path}: cannot read fakecuda's model constants ({exc.strerror}); "
                         f"--model fakecuda needs the file pump installs beside its package") from None
    values = {}
    for name, expr in _DEFINE.findall(text):
        expr = re.sub(r"/\*.*?\*/", "", expr)
        if re.fullmatch(r"[0-9uUlL\s*+()<>-]+", expr):
            values[name] = int(eval(re.sub(r"(?<=\d)[uUlL]+", "", expr), {"__builtins__": {}}))
    needed = ("FAKECUDA_PAGE", "FAKECUDA_MANAGED_ALIGN", "FAKECUDA_H2D_BYTES_PER_US",
              "FAKECUDA_D2H_BYTES_PER_US", "FAKECUDA_GPU_FAULT_US", "FAKECUDA_LAUNCH_LATENCY_US")
    missing = [n for n in needed if n not in values]
    if missing:
        raise ValueError(f"{path}: no numeric #define for {', '.join(missing)}")
    return values
