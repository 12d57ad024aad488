"""The CUDA driver through cuda-python (cuda.bindings.driver), as the GPU benchmarks' programs use
it: checked calls (a failure names the call and its CUresult), device 0's primary context, kernel
launches from ctypes values, and on pump's CPU model of the driver (fakecuda, found through
LD_LIBRARY_PATH) the example kernels as host functions, so the same programs run in CI.

The kernels are examples/managed_saxpy.py's hand-written PTX (saxpy: y = a*x + y; scale: x *= s);
the driver JIT-compiles it for the GPU at hand."""

import argparse
import ctypes
import os
import pathlib
import sys
import time

import membudget

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "examples"))
import managed_saxpy  # noqa: E402  (PTX, fakecuda's kernels and counters; import has no side effects)

try:
    import cuda.bindings
    from cuda.bindings import driver as cu
except ImportError as exc:  # pragma: no cover - said once, where the suite starts
    sys.exit(f"the GPU benchmarks need cuda-python's cuda.bindings (pip install cuda-bindings): {exc}")

if int(cuda.bindings.__version__.split(".")[0]) < 13:
    sys.exit(f"the GPU benchmarks need cuda-bindings 13 or newer (CUDA 13's cuMemPrefetchAsync); "
             f"found {cuda.bindings.__version__}")

THREADS = 256
MAX_BLOCKS = 4096  # grid-stride kernels: any grid covers any n


class CudaError(RuntimeError):
    """A driver call that failed; str() names the call and the CUresult."""


def call(name: str, *args):
    """cu.<name>(*args), checked; returns its outputs (None, one value, or a tuple)."""
    out = getattr(cu, name)(*args)
    err, rest = out[0], out[1:]
    if err != cu.CUresult.CUDA_SUCCESS:
        _, text = cu.cuGetErrorName(err)
        raise CudaError(f"{name} failed: CUresult {int(err)} ({(text or b'?').decode()})")
    if not rest:
        return None
    return rest[0] if len(rest) == 1 else rest


def _location(to_device: bool, ordinal: int):
    loc = cu.CUmemLocation()
    loc.type = (cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE if to_device
                else cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_HOST)
    loc.id = ordinal if to_device else 0
    return loc


class Gpu:
    """Device 0 with its primary context current; on fakecuda, the example kernels registered."""

    def __init__(self):
        call("cuInit", 0)
        self.device = call("cuDeviceGet", 0)
        self.ordinal = 0
        self.context = call("cuDevicePrimaryCtxRetain", self.device)
        call("cuCtxSetCurrent", self.context)
        self.name = call("cuDeviceGetName", 256, self.device).split(b"\0")[0].decode()
        # cuda.bindings opened libcuda.so.1 already: this is the same library, for fakecuda's extras
        # (under bench/gpu/probes/handle_kind.c's wrapper, the driver it forwards to).
        self.lib = ctypes.CDLL(os.environ.get("HANDLE_PROBE_DRIVER") or "libcuda.so.1")
        self.fake = hasattr(self.lib, "fakecuda_register_kernel")
        if self.fake:
            managed_saxpy.register_fake_kernels(self.lib)
            self.lib.fakecuda_thread_host_ns.restype = ctypes.c_uint64
        self.module = call("cuModuleLoadData", managed_saxpy.PTX.encode() + b"\0")
        self.functions = {name: call("cuModuleGetFunction", self.module, name.encode())
                          for name in ("saxpy", "scale")}

    def memory(self):
        """(free, total) bytes on the device, as the driver reports them."""
        free, total = call("cuMemGetInfo")
        return int(free), int(total)

    def check_fits(self, what: str, request_bytes: int) -> None:
        """membudget's rule, with the driver's view of free memory, before allocating."""
        membudget.check(what, request_bytes, *self.memory())

    def alloc(self, size: int, managed: bool) -> int:
        ptr = (call("cuMemAllocManaged", size, cu.CUmemAttach_flags.CU_MEM_ATTACH_GLOBAL) if managed
               else call("cuMemAlloc", size))
        return int(ptr)

    def host_alloc(self, size: int) -> int:
        """Pinned host memory (what the explicit-copy variant copies from)."""
        return int(call("cuMemHostAlloc", size, 0))

    def host_touch(self, ptr: int, size: int) -> None:
        """Before the host reads or writes managed memory: fakecuda cannot see CPU page faults,
        so it is told (on a GPU the MMU does this itself)."""
        if self.fake:
            self.lib.fakecuda_host_touch(ctypes.c_void_p(ptr), ctypes.c_size_t(size))

    def launch(self, kernel: str, n: int, stream, *params) -> None:
        """One launch of `kernel` over n elements; params are ctypes values of its exact C types."""
        slots = (ctypes.c_void_p * len(params))(*(ctypes.addressof(p) for p in params))
        blocks = min((n + THREADS - 1) // THREADS, MAX_BLOCKS)
        call("cuLaunchKernel", self.functions[kernel], blocks, 1, 1, THREADS, 1, 1, 0, stream,
             ctypes.addressof(slots), 0)

    def prefetch(self, ptr: int, size: int, to_device: bool, stream) -> None:
        call("cuMemPrefetchAsync", ptr, size, _location(to_device, self.ordinal), 0, stream)

    def synchronize(self, stream) -> None:
        call("cuStreamSynchronize", stream)
        if managed_saxpy.KERNEL_ERRORS:  # fakecuda's kernels raise here, not inside C
            raise managed_saxpy.KERNEL_ERRORS[0]

    def charged_ns(self):
        """On fakecuda, the modelled host ns charged to the calling thread so far (its calls, the
        evictions its plain allocations made, the copies its moves to the host waited for); None
        on a GPU, which has no model to read."""
        return int(self.lib.fakecuda_thread_host_ns()) if self.fake else None

    def fake_counters(self) -> dict:
        """fakecuda's counters (GPU faults, bytes moved), or {} on a real GPU."""
        if not self.fake:
            return {}
        st = managed_saxpy.FakeStats()
        self.lib.fakecuda_get_stats(ctypes.byref(st))
        return {name: getattr(st, name) for name, _ in st._fields_}


def link_benchmark(prog: str, doc: str, argv, buffers: int, default_mib: int, mib_help: str, rounds_help: str):
    """The start of a link microbenchmark (prefetch_bw.py, discard.py): its --mib and --rounds,
    device 0, and the free-memory check for `buffers` buffers of --mib MiB.  Returns (args, gpu,
    bytes per buffer), or None when refused (said on stderr: the program exits 3)."""
    ap = argparse.ArgumentParser(prog=prog, description=doc.split("\n\n")[0])
    ap.add_argument("--mib", type=int, default=default_mib, help=f"{mib_help} (default {default_mib})")
    ap.add_argument("--rounds", type=int, default=5, help=f"{rounds_help} (default 5)")
    args = ap.parse_args(argv)
    if args.mib < 1 or args.rounds < 1:
        ap.error("--mib and --rounds must be at least 1")
    size = args.mib * membudget.MiB
    gpu = Gpu()
    try:
        gpu.check_fits(f"{prog} ({buffers} x {args.mib} MiB)" if buffers > 1 else f"{prog} ({args.mib} MiB)",
                       buffers * size)
    except membudget.Refused as exc:
        print(exc, file=sys.stderr)
        return None
    return args, gpu, size


class Stopwatch:
    """Seconds since it was made on the wall clock, and on fakecuda also the modelled seconds
    charged to this thread meanwhile (None on a GPU). The wall clock is what a GPU run reports; on
    fakecuda it is the model plus a loaded machine's scheduling, either way: a thread's late
    wake-up is credited to its next sleep (up to 1 ms, fakecuda/stats.c), so a 1.3 ms call
    can read 0.8 ms. The charged seconds are the model's own, exactly: what a test checks."""

    def __init__(self, gpu: Gpu):
        self.gpu = gpu
        self.charged0 = gpu.charged_ns()
        self.wall0 = time.perf_counter()

    def read(self):
        """(wall seconds, charged seconds or None) since the stopwatch was made."""
        wall = time.perf_counter() - self.wall0
        charged = self.gpu.charged_ns()
        return wall, None if charged is None else (charged - self.charged0) * 1e-9


class PrefetchTimer:
    """Times one cuMemPrefetchAsync on a stream with a pair of events; returns seconds, and keeps
    in `charged` what fakecuda charged the calling thread from the first event to the stream's
    end (Stopwatch; None on a GPU)."""

    def __init__(self, gpu: Gpu, stream):
        self.gpu, self.stream = gpu, stream
        self.start, self.end = call("cuEventCreate", 0), call("cuEventCreate", 0)
        self.charged = None

    def __call__(self, ptr: int, size: int, to_device: bool) -> float:
        watch = Stopwatch(self.gpu)
        call("cuEventRecord", self.start, self.stream)
        self.gpu.prefetch(ptr, size, to_device, self.stream)
        call("cuEventRecord", self.end, self.stream)
        self.gpu.synchronize(self.stream)
        self.charged = watch.read()[1]
        return float(call("cuEventElapsedTime", self.start, self.end)) * 1e-3
