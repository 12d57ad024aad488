#!/usr/bin/env python3
"""A small Unified Memory job, to see what pump does.

    python examples/managed_saxpy.py             # plain Unified Memory: kernels fault pages in
    pump-run python examples/managed_saxpy.py    # pump prefetches each launch's buffers

It drives the CUDA driver API through ctypes (standard library only), as a real program
would: four managed buffers (two x, y pairs) written by the host, then steps that each run
saxpy (y = 2x + y) and scale (y *= 0.5) on one pair. Without a GPU it runs on pump's CPU
model of the driver (fakecuda), whose GPU fault count shows what pump changed.
"""
import argparse
import array
import ctypes
import os
import pathlib
import subprocess
import sys
import time
from ctypes import POINTER, byref, c_char_p, c_float, c_int, c_size_t, c_uint, c_uint64, c_void_p

REPO = pathlib.Path(__file__).resolve().parent.parent
# fakecuda: this checkout's test build (scripts/build-tests; the tests keep it current with the
# sources), else the copy installed with pump (pip install . builds it into the package).
BUILT_FAKECUDA_DIR = REPO / "build" / "tests" / "plain"
MARKER = "PUMP_EXAMPLE_FAKECUDA"  # set when this script re-ran itself on fakecuda
MiB = 1 << 20
MARGIN = 512 * MiB  # left free on the GPU for the context, modules and other processes
CUDA_ERROR_NO_DEVICE, CU_MEM_ATTACH_GLOBAL = 100, 1

# Hand-written PTX (ISA 6.0, sm_60 and later: the driver JIT-compiles it for the GPU at hand).
# Grid-stride loops, so any grid covers any n; fma.rn/mul.rn round as the host check does.
PTX = r"""
.version 6.0
.target sm_60
.address_size 64

.visible .entry saxpy(.param .f32 a, .param .u64 x, .param .u64 y, .param .u64 n)
{
    .reg .pred %p;  .reg .f32 %f<5>;  .reg .b32 %r<5>;  .reg .b64 %rd<10>;
    ld.param.f32 %f1, [a];  ld.param.u64 %rd1, [x];  ld.param.u64 %rd2, [y];  ld.param.u64 %rd3, [n];
    cvta.to.global.u64 %rd1, %rd1;  cvta.to.global.u64 %rd2, %rd2;
    mov.u32 %r1, %ctaid.x;  mov.u32 %r2, %ntid.x;  mov.u32 %r3, %tid.x;  mov.u32 %r4, %nctaid.x;
    mul.wide.u32 %rd4, %r1, %r2;  cvt.u64.u32 %rd5, %r3;  add.u64 %rd4, %rd4, %rd5;   // i
    mul.wide.u32 %rd6, %r4, %r2;                                                     // stride
SAXPY_LOOP:
    setp.ge.u64 %p, %rd4, %rd3;  @%p bra SAXPY_DONE;
    shl.b64 %rd7, %rd4, 2;  add.u64 %rd8, %rd1, %rd7;  add.u64 %rd9, %rd2, %rd7;
    ld.global.f32 %f2, [%rd8];  ld.global.f32 %f3, [%rd9];
    fma.rn.f32 %f4, %f1, %f2, %f3;  st.global.f32 [%rd9], %f4;
    add.u64 %rd4, %rd4, %rd6;  bra SAXPY_LOOP;
SAXPY_DONE:
    ret;
}

.visible .entry scale(.param .u64 x, .param .f32 s, .param .u64 n)
{
    .reg .pred %p;  .reg .f32 %f<4>;  .reg .b32 %r<5>;  .reg .b64 %rd<9>;
    ld.param.u64 %rd1, [x];  ld.param.f32 %f1, [s];  ld.param.u64 %rd3, [n];
    cvta.to.global.u64 %rd1, %rd1;
    mov.u32 %r1, %ctaid.x;  mov.u32 %r2, %ntid.x;  mov.u32 %r3, %tid.x;  mov.u32 %r4, %nctaid.x;
    mul.wide.u32 %rd4, %r1, %r2;  cvt.u64.u32 %rd5, %r3;  add.u64 %rd4, %rd4, %rd5;
    mul.wide.u32 %rd6, %r4, %r2;
SCALE_LOOP:
    setp.ge.u64 %p, %rd4, %rd3;  @%p bra SCALE_DONE;
    shl.b64 %rd7, %rd4, 2;  add.u64 %rd8, %rd1, %rd7;
    ld.global.f32 %f2, [%rd8];  mul.rn.f32 %f3, %f2, %f1;  st.global.f32 [%rd8], %f3;
    add.u64 %rd4, %rd4, %rd6;  bra SCALE_LOOP;
SCALE_DONE:
    ret;
}
"""

# ctypes passes bare Python ints as 32-bit C ints: pointers and sizes need prototypes.
PROTOTYPES = {
    "cuInit": [c_uint], "cuDeviceGet": [POINTER(c_int), c_int],
    "cuDevicePrimaryCtxRetain": [POINTER(c_void_p), c_int], "cuCtxSetCurrent": [c_void_p],
    "cuMemGetInfo_v2": [POINTER(c_size_t), POINTER(c_size_t)],
    "cuMemAllocManaged": [POINTER(c_uint64), c_size_t, c_uint], "cuMemFree_v2": [c_uint64],
    "cuModuleLoadData": [POINTER(c_void_p), c_char_p],
    "cuModuleGetFunction": [POINTER(c_void_p), c_void_p, c_char_p],
    "cuStreamCreate": [POINTER(c_void_p), c_uint], "cuStreamSynchronize": [c_void_p],
    "cuLaunchKernel": [c_void_p] + [c_uint] * 7 + [c_void_p, POINTER(c_void_p), POINTER(c_void_p)],
    "cuGetErrorName": [c_int, POINTER(c_char_p)],
}


def check(lib, call, rc):
    if rc != 0:
        name = c_char_p()
        lib.cuGetErrorName(rc, byref(name))
        sys.exit(f"managed_saxpy: {call} failed: CUresult {rc} ({(name.value or b'?').decode()})")


class Driver:
    """libcuda.so.1 whose cu* calls are checked: a failure names the call and its CUresult."""

    def __init__(self, lib):
        self.lib, self.fake = lib, hasattr(lib, "fakecuda_register_kernel")
        for name, argtypes in PROTOTYPES.items():
            getattr(lib, name).argtypes = argtypes

    def __getattr__(self, name):
        return lambda *args: check(self.lib, name, getattr(self.lib, name)(*args))


def installed_fakecuda_dir():
    """The fakecuda installed with pump (pump/fakecuda in its package), or None."""
    try:
        import pump  # the package, not this checkout's source: pump-run's own
    except ImportError:
        return None
    folder = pathlib.Path(pump.__file__).resolve().parent / "fakecuda"
    return folder if (folder / "libcuda.so.1").exists() else None


def fakecuda_dir():
    """The directory of the fakecuda to run on (built now, with its progress shown, if none is)."""
    if (BUILT_FAKECUDA_DIR / "libcuda.so.1").exists():
        return BUILT_FAKECUDA_DIR
    installed = installed_fakecuda_dir()
    if installed is not None:
        return installed
    print("building it once with scripts/build-tests (a minute or two) ...", flush=True)
    # Its progress, and the compiler's errors, go to stderr as they come.
    build = subprocess.run([str(REPO / "scripts" / "build-tests"), "--progress"], stdout=subprocess.PIPE,
                           text=True, env=dict(os.environ, PYTHON=sys.executable))
    if build.returncode != 0:
        sys.exit("managed_saxpy: building fakecuda failed (it needs cmake, a C compiler and "
                 "CUDA's headers: pip install nvidia-cuda-runtime)")
    return BUILT_FAKECUDA_DIR


def open_driver(force_fakecuda=False):
    """The CUDA driver, initialised; without one (or without a GPU, or forced), re-run on fakecuda."""
    try:
        lib = None if force_fakecuda and not os.environ.get(MARKER) else ctypes.CDLL("libcuda.so.1")
    except OSError:
        lib = None
    if lib is not None:
        rc = lib.cuInit(0)
        if rc != CUDA_ERROR_NO_DEVICE or os.environ.get(MARKER):
            check(lib, "cuInit", rc)
            return Driver(lib)
    if os.environ.get(MARKER):
        sys.exit("managed_saxpy: cannot load fakecuda's libcuda.so.1")
    print("no CUDA driver here: running on pump's CPU model of the driver (fakecuda)" if not force_fakecuda
          else "--fakecuda: running on pump's CPU model of the driver (fakecuda)",
          flush=True)  # flushed: execve would drop it
    # The dynamic loader reads LD_LIBRARY_PATH only at process start: hence a fresh process.
    # LD_PRELOAD and PUMP_* are inherited, so under pump-run it is still under pump.
    path = [str(fakecuda_dir())] + [p for p in [os.environ.get("LD_LIBRARY_PATH")] if p]
    env = dict(os.environ, LD_LIBRARY_PATH=os.pathsep.join(path), **{MARKER: "1"})
    os.execve(sys.executable, [sys.executable, os.path.abspath(__file__), *sys.argv[1:]], env)


# ---- fakecuda only: the kernels as host functions (a CPU model has no PTX to run) ----
class FakeStats(ctypes.Structure):
    _fields_ = [(name, c_uint64) for name in (  # struct fakecuda_stats, in order
        "gpu_faults cpu_faults pages_touched_by_kernels bytes_prefetched_h2d bytes_prefetched_unused "
        "bytes_faulted_h2d bytes_d2h kernels_run launches prefetch_calls batch_prefetch_calls "
        "device_resident_bytes device_resident_peak bytes_discarded allocations_reused driver_host_ns "
        "driver_evictions bytes_evicted_d2h bytes_evicted_h2d va_lock_wait_ns pool_bytes_reserved "
        "pool_bytes_released gpu_fault_batches gpu_fault_stall_ns bytes_fault_prefetched_h2d bytes_h2d "
        "bytes_d2h_all launches_by_function launches_by_kernel launches_given_uses launch_uses_missing "
        "launch_uses_mismatched discard_races bytes_lost_to_discard_races lookups_above_driver bytes_read_discarded "
        "gpu_faults_unpointed bytes_dead_h2d bytes_dead_d2h").split()]


KERNEL_FN = ctypes.CFUNCTYPE(None, POINTER(c_void_p), c_void_p)  # (void **params, dims)
CALLBACKS = []      # fakecuda keeps raw pointers to these: they must outlive every launch
KERNEL_ERRORS = []  # an exception cannot cross back into C: kept here, raised after sync


def register_fake_kernels(lib):
    def args(params, *ctypes_):
        return [ctypes.cast(params[i], POINTER(t))[0] for i, t in enumerate(ctypes_)]

    def chunked(out, nbytes, compute, *inputs):
        # Python floats are slow: 1 MiB at a time, through array('f') (float32 rounding).
        for off in range(0, nbytes, MiB):
            size = min(MiB, nbytes - off)
            cols = [array.array("f", ctypes.string_at(p + off, size)) for p in inputs]
            ctypes.memmove(out + off, array.array("f", compute(*cols)).tobytes(), size)

    def saxpy(params):
        a, x, y, n = args(params, c_float, c_uint64, c_uint64, c_uint64)
        lib.fakecuda_touch(c_void_p(x), c_size_t(4 * n))  # counts GPU faults, moves pages
        lib.fakecuda_touch(c_void_p(y), c_size_t(4 * n))
        chunked(y, 4 * n, lambda xs, ys: [a * xi + yi for xi, yi in zip(xs, ys)], x, y)

    def scale(params):
        x, s, n = args(params, c_uint64, c_float, c_uint64)
        lib.fakecuda_touch(c_void_p(x), c_size_t(4 * n))
        chunked(x, 4 * n, lambda xs: [s * xi for xi in xs], x)

    for name, fn, sizes in (("saxpy", saxpy, (4, 8, 8, 8)), ("scale", scale, (8, 4, 8))):
        def kernel(params, dims, fn=fn):
            try:
                fn(params)
            except BaseException as exc:
                KERNEL_ERRORS.append(exc)
        CALLBACKS.append(KERNEL_FN(kernel))
        layout = (c_size_t * len(sizes))(*sizes)  # sizes and alignments (equal here)
        if lib.fakecuda_register_kernel(name.encode(), CALLBACKS[-1], len(sizes), layout, layout):
            sys.exit(f"managed_saxpy: fakecuda_register_kernel({name}) failed")


# ---- the job ----
def pattern(seed):
    """1 MiB of float32 (multiples of 1/8, exact), copied over a buffer with memmove."""
    return array.array("f", ((i * seed) % 251 / 8 for i in range(MiB // 4))).tobytes()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=10, help="steps of saxpy + scale (default 10)")
    ap.add_argument("--mib", type=int, help="MiB per buffer (default 64; 16 on fakecuda)")
    ap.add_argument("--fakecuda", action="store_true",
                    help="run on pump's CPU model of the driver even where there is a GPU")
    opts = ap.parse_args()
    if opts.steps < 1 or (opts.mib is not None and opts.mib < 1):
        ap.error("--steps and --mib must be at least 1")

    cu = open_driver(opts.fakecuda)
    lib = cu.lib
    mib = opts.mib or (16 if cu.fake else 64)
    if cu.fake and not opts.mib:
        print("fakecuda's kernels are Python: buffers are 16 MiB instead of 64 (--mib to change)")
    n = mib * MiB // 4
    nbytes = 4 * n

    dev, ctx, free, total = c_int(), c_void_p(), c_size_t(), c_size_t()
    cu.cuDeviceGet(byref(dev), 0)
    cu.cuDevicePrimaryCtxRetain(byref(ctx), dev)
    cu.cuCtxSetCurrent(ctx)
    cu.cuMemGetInfo_v2(byref(free), byref(total))
    if free.value < 4 * nbytes + MARGIN:  # pump's rule: never ask for more than the GPU has free
        sys.exit(f"managed_saxpy: the GPU has {free.value // MiB} MiB free; this job needs "
                 f"{4 * nbytes // MiB} MiB + {MARGIN // MiB} MiB margin: try a smaller --mib")

    if cu.fake:
        register_fake_kernels(lib)
    module, saxpy, scale, stream = c_void_p(), c_void_p(), c_void_p(), c_void_p()
    cu.cuModuleLoadData(byref(module), PTX.encode())
    cu.cuModuleGetFunction(byref(saxpy), module, b"saxpy")
    cu.cuModuleGetFunction(byref(scale), module, b"scale")
    cu.cuStreamCreate(byref(stream), 0)

    def host_access(ptr, size):
        if cu.fake:  # fakecuda cannot see the CPU's page faults: the host says what it touches
            lib.fakecuda_host_touch(c_void_p(ptr), c_size_t(size))

    pats = [pattern(seed) for seed in (1, 3, 5, 7)]  # x0, y0, x1, y1
    bufs = []
    for pat in pats:
        ptr = c_uint64()
        cu.cuMemAllocManaged(byref(ptr), nbytes, CU_MEM_ATTACH_GLOBAL)
        host_access(ptr.value, nbytes)
        for off in range(0, nbytes, len(pat)):
            ctypes.memmove(ptr.value + off, pat, min(len(pat), nbytes - off))
        bufs.append(ptr.value)
    pairs = [(bufs[0], bufs[1]), (bufs[2], bufs[3])]

    def launch(func, *params):
        # kernelParams: one pointer per kernel parameter, to a value of its exact C type.
        ptrs = (c_void_p * len(params))(*(ctypes.addressof(p) for p in params))
        cu.cuLaunchKernel(func, min((n + 255) // 256, 4096), 1, 1, 256, 1, 1, 0, stream, ptrs, None)

    start = time.perf_counter()
    for step in range(opts.steps):
        t0 = time.perf_counter()
        x, y = pairs[step % 2]  # like a model's layers: consecutive steps use other memory
        launch(saxpy, c_float(2.0), c_uint64(x), c_uint64(y), c_uint64(n))
        launch(scale, c_uint64(y), c_float(0.5), c_uint64(n))
        cu.cuStreamSynchronize(stream)
        if KERNEL_ERRORS:
            raise KERNEL_ERRORS[0]
        print(f"step {step}: saxpy + scale on pair {step % 2}: {(time.perf_counter() - t0) * 1e3:.1f} ms")
    wall = time.perf_counter() - start
    if cu.fake:  # what pump changes: kernels' GPU faults (64 KiB pages not yet there), in batches
        st = FakeStats()
        lib.fakecuda_get_stats(byref(st))
        # What the driver moved (pages not already on the GPU); pump-run's summary counts what pump asked.
        print(f"fakecuda: {st.gpu_faults} GPU faults in {st.gpu_fault_batches} batches, "
              f"{st.bytes_prefetched_h2d / MiB:.1f} MiB moved by prefetches, "
              f"{st.bytes_faulted_h2d / MiB:.1f} MiB moved by faults")

    # Check sampled elements of both y buffers against the same float32 arithmetic on the host.
    f32 = lambda v: array.array("f", [v])[0]  # noqa: E731
    vals = [array.array("f", pat) for pat in pats]
    checksum, samples = 0.0, sorted({i * (n - 1) // 99 for i in range(100)})
    for p, (x, y) in enumerate(pairs):
        got = (c_float * n).from_address(y)
        for i in samples:
            host_access(y + 4 * i, 4)
            xi, want = vals[2 * p][i % len(vals[0])], vals[2 * p + 1][i % len(vals[0])]
            for _ in range(p, opts.steps, 2):  # the steps that ran on pair p
                want = f32(f32(2.0 * xi + want) * 0.5)
            if abs(got[i] - want) > 1e-5 * max(1.0, abs(want)):
                sys.exit(f"managed_saxpy: WRONG RESULT: y{p}[{i}] = {got[i]!r}, expected {want!r}")
            checksum += got[i]
    print(f"checksum {checksum:.6f} ({2 * len(samples)} samples match the host), "
          f"{4 * mib} MiB managed, {opts.steps} step(s) in {wall:.2f} s")
    for ptr in bufs:
        cu.cuMemFree_v2(ptr)


if __name__ == "__main__":
    main()
