"""Plain device memory held for a whole run, so that a job's managed memory has less of the GPU
than it needs: real oversubscription (../shared GPU.md, "Oversubscription, two ways"), used by
train_gpt.py --filler-bytes and the GPU suite's case f (bench/README.md).

The memory comes from the driver's cuMemCreate (virtual memory management's physical memory),
through ctypes on libcuda.so.1, not from cuMemAlloc: under pump-run's managed_all (its
default) every device allocation the program makes with cuMemAlloc, by PyTorch or through
ctypes alike, becomes managed memory (shim/hooks/hooks_memory.c), which Unified Memory would evict
like the job's own.  cuMemCreate's memory stays device memory (pump says so once) and Unified
Memory cannot evict it, with or without pump.  Nothing maps it: it only has to be taken."""

import ctypes

CU_MEM_ALLOCATION_TYPE_PINNED = 1
CU_MEM_LOCATION_TYPE_DEVICE = 1
CU_MEM_ALLOC_GRANULARITY_MINIMUM = 0


class FillerFailed(Exception):
    """The driver refused a step of holding the filler; str() names the call and its CUresult."""


class _AllocationProp(ctypes.Structure):
    """cuda.h's CUmemAllocationProp (CUDA 12 and 13): type, handle types, location, Windows
    metadata, and the allocation flags, all zero but the first three."""
    _fields_ = [("type", ctypes.c_int), ("requested_handle_types", ctypes.c_int), ("location_type", ctypes.c_int),
                ("location_id", ctypes.c_int), ("win32_metadata", ctypes.c_void_p),
                ("compression_type", ctypes.c_ubyte), ("gpu_direct_rdma_capable", ctypes.c_ubyte),
                ("usage", ctypes.c_ushort), ("reserved", ctypes.c_ubyte * 4)]


class DeviceFiller:
    """`nbytes` (rounded up to the driver's granularity) of device `ordinal`'s memory, taken on
    entry and given back on exit; raises FillerFailed when the driver refuses."""

    def __init__(self, nbytes: int, ordinal: int):
        self.requested, self.ordinal = nbytes, ordinal
        self.nbytes = 0           # what is held
        self._cuda = None
        self._handle = ctypes.c_ulonglong(0)

    def _call(self, name: str, *args) -> None:
        result = getattr(self._cuda, name)(*args)
        if result != 0:
            text = ctypes.c_char_p()
            self._cuda.cuGetErrorName(result, ctypes.byref(text))
            raise FillerFailed(f"{name} failed: CUresult {result} ({(text.value or b'unknown').decode()})")

    def __enter__(self):
        try:
            self._cuda = ctypes.CDLL("libcuda.so.1")
        except OSError as exc:
            raise FillerFailed(f"no driver to ask: {exc}") from None
        # The primary context, the one PyTorch's runtime uses, current on this thread first (its
        # retain is kept: the runtime's context lives to the end of the process).
        device, context = ctypes.c_int(), ctypes.c_void_p()
        self._call("cuInit", 0)
        self._call("cuDeviceGet", ctypes.byref(device), self.ordinal)
        self._call("cuDevicePrimaryCtxRetain", ctypes.byref(context), device)
        self._call("cuCtxSetCurrent", context)
        prop = _AllocationProp(type=CU_MEM_ALLOCATION_TYPE_PINNED, location_type=CU_MEM_LOCATION_TYPE_DEVICE,
                               location_id=device.value)
        granularity = ctypes.c_size_t()
        self._call("cuMemGetAllocationGranularity", ctypes.byref(granularity), ctypes.byref(prop),
                   CU_MEM_ALLOC_GRANULARITY_MINIMUM)
        size = -(-self.requested // granularity.value) * granularity.value
        self._call("cuMemCreate", ctypes.byref(self._handle), ctypes.c_size_t(size), ctypes.byref(prop),
                   ctypes.c_ulonglong(0))
        self.nbytes = size
        return self

    def __exit__(self, *exc):
        if self.nbytes:
            self._call("cuMemRelease", self._handle)
            self.nbytes = 0
        return False
