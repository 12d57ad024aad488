"""A stand-in for nvidia-ml-py's pynvml, answered by fakecuda, for scripts/gpu-check's dry run
(`--fakecuda DIR` puts this folder first on PYTHONPATH).  fakecuda has no NVML; the suite and
gpu-check read the card's name, driver and free memory through NVML before they allocate, so
on the dry run the same questions go to fakecuda's driver calls.  Only what gpu-check and
bench/gpu ask is here.  It refuses to answer for a real driver: the free-memory rule on a GPU
must come from NVML itself."""

import ctypes

__version__ = "fakecuda"


class NVMLError(Exception):
    pass


class _Memory(ctypes.Structure):
    _fields_ = [("free", ctypes.c_ulonglong), ("total", ctypes.c_ulonglong)]


_lib = None


def _call(name, *args):
    rc = getattr(_lib, name)(*args)
    if rc:
        raise NVMLError(f"fakecuda's {name} answered CUresult {rc}")


def nvmlInit():
    global _lib
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError as exc:
        raise NVMLError(f"no libcuda.so.1 ({exc})") from None
    if not hasattr(lib, "fakecuda_register_kernel"):
        raise NVMLError("the stand-in NVML answers only for fakecuda, and libcuda.so.1 is a real driver")
    _lib = lib
    _call("cuInit", 0)


def nvmlShutdown():
    pass


def nvmlDeviceGetCount():
    n = ctypes.c_int()
    _call("cuDeviceGetCount", ctypes.byref(n))
    return n.value


def nvmlDeviceGetHandleByIndex(index):
    dev = ctypes.c_int()
    _call("cuDeviceGet", ctypes.byref(dev), index)
    return dev.value


def nvmlDeviceGetName(handle):
    buf = ctypes.create_string_buffer(256)
    _call("cuDeviceGetName", buf, 256, handle)
    return buf.value.decode()


def nvmlSystemGetDriverVersion():
    return "fakecuda"


def nvmlSystemGetCudaDriverVersion():
    v = ctypes.c_int()
    _call("cuDriverGetVersion", ctypes.byref(v))
    return v.value


def nvmlDeviceGetMemoryInfo(handle):
    """cuMemGetInfo in the device's primary context (made current, then released)."""
    ctx, free, total = ctypes.c_void_p(), ctypes.c_size_t(), ctypes.c_size_t()
    _call("cuDevicePrimaryCtxRetain", ctypes.byref(ctx), handle)
    try:
        _call("cuCtxPushCurrent_v2", ctx)
        try:
            _call("cuMemGetInfo_v2", ctypes.byref(free), ctypes.byref(total))
        finally:
            _call("cuCtxPopCurrent_v2", ctypes.byref(ctypes.c_void_p()))
    finally:
        _call("cuDevicePrimaryCtxRelease_v2", handle)
    return _Memory(free.value, total.value)
