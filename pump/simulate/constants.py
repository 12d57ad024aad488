"""Every constant of pump's simulator, named, with its source (issue 4: "every constant of
the model lives in one file").  Change one only with new evidence, never to pass a target.

Two models share the engine:
- a GPU preset (GPU_PRESETS; the default an NVIDIA H100 PCIe card on a PCIe Gen5 x16 link): its
  datasheet's figures, and the UVM driver's fault path and eviction as read from its source
  (../shared/research/PREFETCHING.md §4-5), the same for every preset.
- ``FAKECUDA``: fakecuda's CPU model, its constants read from fakecuda_model.h (not
  copied), used to predict what a replay on fakecuda counts (faults and bytes, not time).

Sources cited below:
  [H100]  NVIDIA H100 Tensor Core GPU datasheet (nvidia.com, 2022; the two-column edition,
          "H100 SXM" and "H100 PCIe"; its table reproduced at archive-lib.hpctech.co.jp/gpuproduct/
          nvidia-h100.html; "* Shown with sparsity. Specifications 1/2 lower without sparsity"):
          PCIe: FP32 51 TFLOPS, TF32 Tensor Core 756*, BF16 1,513*, 80 GB HBM2e at 2,000 GB/s;
          SXM: FP32 67, TF32 989*, BF16 1,979*, 80 GB HBM3 at 3,350 GB/s; both PCIe Gen5 128 GB/s
          (both directions together).  The PCIe card's product brief PB-11133-001_v02 (November
          2022) agrees on the card ("greater than 2,000 gigabytes per second").
  [H200]  NVIDIA H200 Tensor Core GPU datasheet (nvidia.com, 2024), column "H200 SXM": FP32 67
          TFLOPS, TF32 989*, BF16 1,979* (sparse), 141 GB HBM3e at 4.8 TB/s, PCIe Gen5 128 GB/s
          (as reproduced at lzwjava.github.io/nvidia-h200-gpu-specs-en and saulelectric.com).
  [A100-40] NVIDIA A100 Tensor Core GPU datasheet (nvidia.com, 2020 edition, columns "A100 40GB
          PCIe" / "A100 40GB SXM"): FP32 19.5 TFLOPS, TF32 156 (312 sparse), BF16 312 (624
          sparse), 40 GB HBM2 at 1,555 GB/s, PCIe Gen4 64 GB/s (as reproduced at
          glennklockwood.com/garden/processors/A100 and thundercompute.com's A100 specifications).
  [A100-80] NVIDIA A100 datasheet nvidia-a100-datasheet-us-nvidia-1758950-r4-web (nvidia.com,
          2021), column "A100 80GB PCIe": the same FLOPs, 80 GB HBM2e at 1,935 GB/s, PCIe Gen4
          64 GB/s (as reproduced at thundercompute.com's A100 specifications).
  [L4]    NVIDIA L4 Tensor Core GPU datasheet (nvidia.com, 2023): FP32 30.3 TFLOPS, TF32 120*,
          BF16 242* (sparse), 24 GB GDDR6 at 300 GB/s, PCIe Gen4 x16 64 GB/s (as reproduced at
          store.sourcecode.com's L4 listing and aiwiki.ai/wiki/nvidia_l4).
  [V100]  NVIDIA Tesla V100 GPU Accelerator datasheet (nvidia.com, 2018 edition with the 32 GB
          cards), column "V100 PCIe": single precision 14 TFLOPS, Tensor Performance 112 TFLOPS
          (FP16 in, FP32 accumulate: Volta has no TF32), 32 GB HBM2 at 900 GB/s, PCIe 32 GB/s
          (Gen3 x16, both directions together; as reproduced at io-tech.fi's V100 PCIe article).
  [TF32]  PyTorch documentation, "CUDA semantics", section "TensorFloat-32 (TF32) on Ampere
          (and later) devices": torch.backends.cuda.matmul.allow_tf32 defaults to False (since
          PyTorch 1.12), torch.backends.cudnn.allow_tf32 to True.
  [PCIE]  PCI Express Base Specifications 3.0, 4.0, 5.0 (PCI-SIG 2010, 2017, 2019): 8, 16, 32 GT/s
          per lane, 128b/130b encoding; x16 carries 15.75, 31.5, 63.0e9 bytes/s each way.
  [UVM]   NVIDIA open-gpu-kernel-modules 595.45.04, kernel-open/nvidia-uvm/ (PREFETCHING.md §4):
          uvm_va_block_types.h, uvm_pmm_gpu.h, uvm_gpu_replayable_faults.c, uvm_pmm_gpu.c.
  [OBS]   ObservUVM §II, citing prior work (PREFETCHING.md §4.4): "10-50 us per fault
          serviced; 64 KiB migrated per fault".
  [CUDF]  G. Kimball (NVIDIA), facebookincubator/velox#15022 (PREFETCHING.md §5): "Driver
          paging is about 10x lower throughput than explicit prefetching (which approaches
          the interconnect limit)": a cross-check of [OBS] and [PCIE], not an input.
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

import dataclasses
import math
import os
import re

# A PCIe link's line rate per direction ([PCIE]), shared with pumpd's planning.
from pump.link import PCIE5_X16_BYTES_PER_S, pcie_bytes_per_s  # noqa: F401

KIB, MIB = 1 << 10, 1 << 20

# ---- units of managed memory ([UVM] §4.1; pump's shim and fakecuda use the same) ----
# The fault and migration unit: the big page, UVM_BIG_PAGE_SIZE.
PAGE_BYTES = 64 * KIB
# The VA block (UVM_VA_BLOCK_BITS 21) and the GPU root chunk (UVM_CHUNK_SIZE_MAX): the unit of
# residency accounting, of eviction by the driver, and of pump's plans.
BLOCK_BYTES = 2 * MIB
PAGES_PER_BLOCK = BLOCK_BYTES // PAGE_BYTES

# ---- where PyTorch runs fp32 work ([TF32]) ----
# The traces are fp32 training (pump trace generate), and PyTorch's defaults decide where fp32
# FLOPs run: matrix multiplies on the FP32 units (torch.backends.cuda.matmul.allow_tf32 is False
# by default), convolutions on TF32 tensor cores (torch.backends.cudnn.allow_tf32 is True by
# default) where the GPU has them: Volta has none, so there they run on the FP32 units too.



@dataclasses.dataclass(frozen=True)
class FaultPath:
    """The UVM driver's fault path: no datasheet gives it (see FAULT_PATH)."""
    name: str
    service_seconds: float      # the faulting kernel's stall per serviced fault, 64 KiB included
    batch_faults: int           # faults fetched and serviced per batch
    prefetch_threshold: int     # the fault-time prefetcher's threshold, percent (None: off)
    prefetch_min_faults: int    # faults in a block before the prefetcher acts on it


@dataclasses.dataclass(frozen=True)
class GpuPreset:
    """One GPU as `pump simulate --gpu NAME` models it: its datasheet's figures (dense, not
    sparse, at the clocks the datasheet states), its host link, and the fault path it shares."""
    name: str
    title: str
    source: str                 # the datasheet, its version, and the column read
    fp32_flops: float           # FP32 units (non-tensor), dense
    tf32_flops: float           # TF32 tensor cores, dense; 0: none (fp32 convolutions use FP32 units)
    bf16_flops: float           # BF16/FP16 tensor cores, dense (mixed-precision work; a profile's scale)
    memory_bytes: int           # device memory, decimal as the datasheet states it
    memory_kind: str
    memory_bytes_per_s: float   # device memory bandwidth: the roofline's memory roof
    pcie_generation: int        # the host link
    pcie_lanes: int
    fault_path: FaultPath

    @property
    def link_bytes_per_s(self) -> float:
        """The host link's line rate per direction."""
        return pcie_bytes_per_s(self.pcie_generation, self.pcie_lanes)

    def conv_flops(self) -> float:
        """Where PyTorch runs fp32 convolutions: TF32 tensor cores, else the FP32 units."""
        return self.tf32_flops or self.fp32_flops


# ---- the driver's fault path ([UVM] §4.3-4.4, [OBS]) ----
# Faults are fetched and serviced in batches of uvm_perf_fault_batch_count (default 256).
FAULT_BATCH_FAULTS = 256
# Time the faulting kernel stalls per serviced fault, the 64 KiB migration included: the low
# end of [OBS]'s 10-50 us (the figure most favourable to fault-driven paging).  64 KiB / 10 us
# = 6.6 GB/s, about 10x below the Gen5 link's 63 GB/s, as [CUDF] reports.  Published fault-
# driven rates lie on both sides of it: issue 16 cites 2.4-5.6 GB/s measured on A100 and GTX 1080
# cards, below it: on those figures the model services faults faster than measured, which
# favours the naive baseline (pump's gains over naive are understated, not inflated);
# PREFETCHING.md §5 reads 8.2 GB/s for a naive kernel on a GTX 1080 (PCIe 3), above it, but
# that figure counts an array never in host memory: the same run's 2 GiB faulted in over
# 386.6 ms is 5.55 GB/s (bench/published: pascal-um.naive-kernel, pascal-um.migrated-bytes),
# below the model as well.
FAULT_SERVICE_S = 10e-6
# Every preset shares this fault path: it is the driver's software (fault buffer fetch, VA
# block locking, page-table updates, replay: the same open-gpu-kernel-modules code for Volta
# to Hopper), not the card; [OBS]'s 10-50 us is not given per GPU; and the 64 KiB a fault moves
# takes 1-4 us of the 10 on every link here (Gen5 x16 to Gen3 x16), so one figure for all is
# within the source's own spread.  A GPU-specific measurement would replace it per preset.
# The fault-time prefetcher (uvm_perf_prefetch.c; its rule in gpu_truth.prefetch_pages): on by
# default (uvm_perf_prefetch_enable 1), UVM_PREFETCH_THRESHOLD_DEFAULT 51 percent,
# UVM_PREFETCH_MIN_FAULTS_DEFAULT 1 ([UVM], and 580.142 alike; fakecuda_model.h names the
# same defaults, tests/test_simulate_fault_path.py holds them equal).
PREFETCH_THRESHOLD_PERCENT = 51
PREFETCH_MIN_FAULTS = 1
FAULT_PATH = FaultPath("uvm-driver", FAULT_SERVICE_S, FAULT_BATCH_FAULTS, PREFETCH_THRESHOLD_PERCENT,
                       PREFETCH_MIN_FAULTS)

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

# ---- the GPU presets (`pump simulate --gpu NAME`) ----
# Each figure from the datasheet named, dense (the datasheets' starred figures are with 2:4
# sparsity: halved here), at the boost clock the datasheet states; memory in decimal GB as
# printed.  Every one is a PCIe x16 host link (SXM modules too: their NVLink is GPU to GPU).
_GB, _TB, _T = 10**9, 10**12, 1e12
GPU_PRESETS = {p.name: p for p in (
    GpuPreset("h100-pcie", "NVIDIA H100 PCIe 80 GB (HBM2e)", "[H100] column H100 PCIe",
              51 * _T, 756 * _T / 2, 1513 * _T / 2, 80 * _GB, "HBM2e", 2.0 * _TB, 5, 16, FAULT_PATH),
    GpuPreset("h100-sxm", "NVIDIA H100 SXM5 80 GB (HBM3)", "[H100] column H100 SXM",
              67 * _T, 989 * _T / 2, 1979 * _T / 2, 80 * _GB, "HBM3", 3.35 * _TB, 5, 16, FAULT_PATH),
    GpuPreset("h200", "NVIDIA H200 SXM 141 GB (HBM3e)", "[H200] column H200 SXM",
              67 * _T, 989 * _T / 2, 1979 * _T / 2, 141 * _GB, "HBM3e", 4.8 * _TB, 5, 16, FAULT_PATH),
    GpuPreset("a100-40gb", "NVIDIA A100 PCIe 40 GB (HBM2)", "[A100-40] column A100 40GB PCIe",
              19.5 * _T, 156 * _T, 312 * _T, 40 * _GB, "HBM2", 1555 * _GB, 4, 16, FAULT_PATH),
    GpuPreset("a100-80gb", "NVIDIA A100 PCIe 80 GB (HBM2e)", "[A100-80] column A100 80GB PCIe",
              19.5 * _T, 156 * _T, 312 * _T, 80 * _GB, "HBM2e", 1935 * _GB, 4, 16, FAULT_PATH),
    GpuPreset("l4", "NVIDIA L4 24 GB (GDDR6)", "[L4]",
              30.3 * _T, 120 * _T / 2, 242 * _T / 2, 24 * _GB, "GDDR6", 300 * _GB, 4, 16, FAULT_PATH),
    GpuPreset("v100", "NVIDIA V100 PCIe 32 GB (HBM2)", "[V100] column V100 PCIe",
              14 * _T, 0.0, 112 * _T, 32 * _GB, "HBM2", 900 * _GB, 3, 16, FAULT_PATH),
)}
DEFAULT_GPU = "h100-pcie"


# ---- achieved fractions of peak, per kind of operator (workload.kernel_seconds) ----
# Real kernels run below the datasheet's peak; the model runs each kind at a fraction of it
# measured on real cards, one figure for every preset (none of the sources covers them all).
# Where the sources leave a choice, the higher fraction: faster kernels leave less compute to
# hide transfers behind, the side that makes pump look worse.
@dataclasses.dataclass(frozen=True)
class Achieved:
    compute: float              # of the kind's FLOPs peak
    memory: float               # of the memory bandwidth
    source: str


# [SGEMM] cuBLAS fp32 GEMM at 4096^3 measured at 23.25 TFLOPS on an RTX A6000 (38.7 TFLOPS FP32
# peak: 60%), siboehm/SGEMM_CUDA README; and at 11.9-12.2 TFLOPS for 1024^3 to 4096^3 on an L4
# (30.3 peak: 40%), rtferraz/cuda-kernel-engineering profiles/04-tiled-gemm-benchmark.csv.
# [JIA18] Z. Jia, M. Maggioni, B. Staiger, D. Scarpazza, "Dissecting the NVIDIA Volta GPU
# Architecture via Microbenchmarking" (arXiv 1804.06826, 2018): global memory throughput
# measured at 750 GB/s on a V100 against 900 GB/s theoretical (83%).
_COMPUTE, _MEMORY = 0.60, 0.83
ACHIEVED = {
    "matmul": Achieved(_COMPUTE, _MEMORY, "[SGEMM] (compute), [JIA18] (memory)"),
    # cuDNN runs convolutions as implicit GEMMs; no per-layer TF32 measurement was found, so
    # the GEMM figure (applied to the TF32 peak where there is one).
    "conv": Achieved(_COMPUTE, _MEMORY, "[SGEMM] as for matmul (implicit GEMM), [JIA18]"),
    # Softmax, layer and batch norm, reductions: memory-bound; no separate measurement found,
    # so [JIA18]'s streaming figure (favouring them: they re-read their input).
    "normalization": Achieved(_COMPUTE, _MEMORY, "[JIA18]"),
    "elementwise": Achieved(_COMPUTE, _MEMORY, "[JIA18]"),
}

# ---- explicit migrations: a range, not one figure, direction by direction ----
# One measured cudaMemPrefetchAsync rate is known (bench/published, lab5.prefetch-rate): 11.25
# GB/s host->GPU on an RTX 2060, PCIe 3.0 x16 (nvprof's copy time in kamilgw/CUDA-Lab
# Report5.md), 71% of the line rate.  What else is measured: explicit prefetch is "nearly as
# fast as a cudaMemcpyAsync" between host and device ([UMBLOG]: NVIDIA's "Maximizing Unified
# Memory Performance in CUDA", 2017, as cited in kokkos/kokkos#2915) and "approaches the
# interconnect limit" ([CUDF]); so host<->device copies measured on the presets' own cards
# bound what a prefetch or an eviction gets.  Measured (bench/published, the link.* entries),
# as fractions of each host's line rate:
#   [NVBW24] NVIDIA/nvbandwidth#24 (2024): 8 H100s, PCIe Gen5 x16, SM (kernel) copies, one
#            direction at a time: host->device 35.03-35.39 GB/s (56%), device->host 52.76-52.78
#            (84%); "similar" on H20 and H800.
#   [MLP31]  mlcommons/inference_results_v3.1, closed/NVIDIA/documentation/start_from_device/
#            dgx-h100.md: "approximately 49 GB/s per GPU" NIC->GPU on DGX-H100 (Gen5 x16, 78%).
#   [NVBW11] NVIDIA/nvbandwidth#11 (2023): A100, PCIe Gen4 x16, copy engines: "around 25-26GB/s"
#            each way alone (79%); both at once host->device "only 12-13GB/s" (38%) while
#            device->host holds "around 24GB/s" (76%); nvbandwidth's bidirectional test copies
#            twice the bytes device->host (testcases_ce.cpp, as the issue reads it).
#   [NVBW53] NVIDIA/nvbandwidth#53 (2025): 8 A100-SXM4-80GB, PCIe 4.0: both at once host->device
#            "~11 GB/s" (35%) while device->host "~25 GB/s" (79%).
#   [H100PF] pump's own first GPU run (bench/results/gpu-20261124-nvidia-h100-80gb-hbm3,
#            preflight.json, probes.prefetch_bandwidth): cuMemPrefetchAsync of 1 GiB on an H100
#            80GB HBM3, PCIe Gen5 x16, driver 580: host->device 49.84 GB/s (79%), device->host
#            11.24 GB/s (18%; five samples 11.2 to 18.0 GB/s): the driver's prefetch to the host,
#            the path pump's evictions take, is far below a copy engine's copy.
# So two cases, each covering every figure (tests/test_published.py holds them to it):
# - the best: both directions at the line rate, full duplex: no measurement is above it;
# - the worst: each direction alone at the lowest fraction measured for it (host->device
#   [NVBW24]'s 35.03 GB/s, device->host [H100PF]'s 11.24 GB/s), and half duplex: copies in and out
#   take turns, so with both at once each direction gets less than alone.  Under nvbandwidth's
#   2:1 bidirectional load that is 23% host->device and 46% device->host (link_rates_both()),
#   below [NVBW11]'s and [NVBW53]'s 35% and 76%.  The UVM driver also notes false dependencies
#   between concurrent transfers in and out (issue 16).
H2D_WORST_FRACTION = 35.03e9 / pcie_bytes_per_s(5, 16)
D2H_WORST_FRACTION = 11.24e9 / pcie_bytes_per_s(5, 16)
# (case, host->device fraction of the line rate, device->host fraction, full duplex)
RANGE_CASES = (("best", 1.0, 1.0, True), ("worst", H2D_WORST_FRACTION, D2H_WORST_FRACTION, False))
# Where measured machines fall in that range: pump's own GPU runs (bench/results/gpu-*/
# preflight.json; tests/test_simulate_presets.py holds these to the files), cuMemPrefetchAsync of
# 1 GiB each way (probes.prefetch_bandwidth: host->device, device->host bytes/s) and both at
# once (probes.concurrent_moves: whether the two overlapped; None: not probed that run).
# (machine, run's folder, host->device, device->host, full duplex)
MEASURED_LINKS = (
    ("NVIDIA H100 80GB HBM3", "gpu-20261124-nvidia-h100-80gb-hbm3", 49.84e9, 11.24e9, None),
    ("NVIDIA H100 80GB HBM3", "gpu-20261126-nvidia-h100-80gb-hbm3", 50.49e9, 16.96e9, False),
    ("NVIDIA H200", "gpu-20261126-nvidia-h200", 50.60e9, 16.05e9, False),
    ("NVIDIA H200", "gpu-20261127-nvidia-h200", 48.22e9, 10.49e9, False),
)


def nearer_worst(h2d: float, d2h: float, full_duplex, line: float = PCIE5_X16_BYTES_PER_S) -> bool:
    """Whether a link measured at these rates (full_duplex None: not probed) is nearer the
    range's worst case than its best: by the direction further below the line rate, on a log
    scale, or by taking turns."""
    (_, *best), (_, *worst) = RANGE_CASES  # (host->device fraction, device->host fraction, full duplex)
    fractions = (h2d / line, d2h / line)
    which = 0 if fractions[0] < fractions[1] else 1
    f = fractions[which]
    return abs(math.log(f / worst[which])) < abs(math.log(f / best[which])) or full_duplex is False


# nvbandwidth's bidirectional tests copy this many device->host bytes per host->device byte.
BIDIRECTIONAL_D2H_PER_H2D = 2


def link_rates_both(h2d: float, d2h: float, full_duplex: bool, d2h_per_h2d: float = BIDIRECTIONAL_D2H_PER_H2D):
    """(host->device, device->host) bytes/s while both directions have copies queued, with
    d2h_per_h2d device->host bytes per host->device byte: each its own rate on a full-duplex
    link; on a half-duplex one they take turns, each direction's bytes over the time of both."""
    if full_duplex:
        return h2d, d2h
    turn = 1 / h2d + d2h_per_h2d / d2h
    return 1 / turn, d2h_per_h2d / turn


# ---- capacity planning (`pump simulate --sweep`) ----
# What a training job cannot give its tensors of the card's memory: a stated figure, not a
# measured one (it varies with the driver, the libraries and the job).  1 GiB: the CUDA context
# and loaded kernel modules (several hundred MiB for a PyTorch process before any tensor; CUDA
# lazy loading, the default since CUDA 11.7, lowers it), cuBLAS workspaces (PyTorch's default
# CUBLAS_WORKSPACE_CONFIG ":4096:8", 8 x 4 MiB, per stream and handle), cuDNN's workspaces for
# the chosen algorithms (tens to hundreds of MiB), and NCCL's buffers for data parallelism
# (NCCL_BUFFSIZE, 4 MiB by default, per channel and peer).  --reserve changes it.
RESERVE_BYTES = 1 << 30
# Within how much of the unlimited-memory step the sweep's one-line answer asks lookahead to stay.
SWEEP_TOLERANCES = (0.10, 0.25)

# ---- pumpd (the daemon's own parameters, not physics) ----
# Launches pumpd ingests per ring read in the simulation.  pumpd sweeps the rings every 5 to
# 25 ms (daemon/pumpd/server.py, INGEST_INTERVAL_MIN/MAX) and a plan it publishes takes effect
# from the next launch on; a training job launches at the pace its kernels finish, which in the
# four bench/traces models is 61-90 us per launch on the H100 model (their roofline step time
# over their launches per step), so a sweep reads 55-410 launches.  256 is within that span:
# a sweep every 16-23 ms.
DAEMON_READ_LAUNCHES = 256


# ---- fakecuda: read from fakecuda/fakecuda_model.h, never copied by hand ----
def _fakecuda_model_h() -> str:
    """fakecuda_model.h: installed next to the package, else the source tree's copy."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    installed = os.path.join(package, "fakecuda_model.h")
    if os.path.isfile(installed):
        return installed
    return os.path.join(os.path.dirname(package), "fakecuda", "fakecuda_model.h")


FAKECUDA_MODEL_H = _fakecuda_model_h()
_DEFINE = re.compile(r"^#define\s+(FAKECUDA_\w+)\s+(.+?)\s*$", re.M)


def fakecuda_constants(path: str = FAKECUDA_MODEL_H) -> dict:
    """{name: int} of fakecuda_model.h's numeric #defines; ValueError naming the file if it
    cannot be read or lacks what the simulator needs."""
    try:
        text = open(path).read()
    except OSError as exc:
        raise ValueError(f"{path}: cannot read fakecuda's model constants ({exc.strerror}); "
                         f"--gpu fakecuda needs the file pump installs beside its package") from None
    values = {}
    for name, expr in _DEFINE.findall(text):
        expr = re.sub(r"/\*.*?\*/", "", expr)
        if re.fullmatch(r"[0-9uUlL\s*+()<>-]+", expr):
            values[name] = int(eval(re.sub(r"(?<=\d)[uUlL]+", "", expr), {"__builtins__": {}}))
    needed = ("FAKECUDA_PAGE", "FAKECUDA_MANAGED_ALIGN", "FAKECUDA_H2D_BYTES_PER_US",
              "FAKECUDA_D2H_BYTES_PER_US", "FAKECUDA_PREFETCH_D2H_BYTES_PER_US", "FAKECUDA_EVICT_D2H_BYTES_PER_US",
              "FAKECUDA_GPU_FAULT_US",
              "FAKECUDA_LAUNCH_LATENCY_US",
              "FAKECUDA_IOCTL_NS", "FAKECUDA_BLOCK_PASS_NS", "FAKECUDA_MIGRATE_BLOCK_NS")
    missing = [n for n in needed if n not in values]
    if missing:
        raise ValueError(f"{path}: no numeric #define for {', '.join(missing)}")
    return values
