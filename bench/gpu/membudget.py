"""The GPU benchmarks' one rule for memory (../../shared GPU.md): never ask for more managed memory
than the card has free.  A program that does can hang the GPU itself, so every case and every
program of the suite checks here, before it allocates, and refuses loudly.

A margin stays free beside the request: CUDA contexts, cuBLAS workspaces, PyTorch's caching and
other processes take memory that no request counts."""

GiB = 1 << 30
MiB = 1 << 20
MARGIN_MIN_BYTES = 2 * GiB   # a CUDA context with PyTorch, cuBLAS and cuDNN loaded: about 1 GiB
MARGIN_FRACTION = 0.05       # of the card's total memory, when that is more


class Refused(Exception):
    """A request the card cannot hold with its margin; str() says what, how much and the limit."""


def margin(total_bytes: int) -> int:
    """Bytes left free beside any request on a card of total_bytes."""
    return max(MARGIN_MIN_BYTES, int(total_bytes * MARGIN_FRACTION))


def allowed(free_bytes: int, total_bytes: int) -> int:
    """The most managed memory one case may ask for now (0 when not even the margin is free)."""
    return max(0, free_bytes - margin(total_bytes))


def check(what: str, request_bytes: int, free_bytes: int, total_bytes: int) -> None:
    """Raise Refused unless request_bytes fits the card's free memory with the margin."""
    if request_bytes < 0:
        raise ValueError(f"{what}: a request of {request_bytes} bytes")
    limit = allowed(free_bytes, total_bytes)
    if request_bytes > limit:
        raise Refused(f"REFUSED {what}: it would ask for {request_bytes / GiB:.2f} GiB of managed memory; "
                      f"the GPU has {free_bytes / GiB:.2f} GiB free of {total_bytes / GiB:.2f} GiB and "
                      f"{margin(total_bytes) / GiB:.2f} GiB stay free as a margin, so at most "
                      f"{limit / GiB:.2f} GiB is allowed (lower --scale)")


def nvml_memory(index: int = 0):
    """(free, total) bytes of GPU `index` from NVML, which creates no CUDA context; raises
    RuntimeError naming the cause when NVML or the GPU is missing."""
    try:
        import pynvml
    except ImportError as exc:
        raise RuntimeError(f"pynvml is not importable ({exc}): install nvidia-ml-py") from None
    try:
        pynvml.nvmlInit()
        try:
            info = pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(index))
        finally:
            pynvml.nvmlShutdown()
    except pynvml.NVMLError as exc:
        raise RuntimeError(f"NVML cannot read GPU {index}'s memory: {exc}") from None
    return int(info.free), int(info.total)
