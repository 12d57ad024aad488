#!/usr/bin/env python3
"""What a host write of managed memory costs in each state pump can leave the memory in (issue 41,
item 2): case a of the GPU suite rewrites its inputs from the host every step, and where they
were left on the GPU each write first brings the stale page back. The states:
- host: resident on the host (the write's own pages);
- gpu: prefetched to the GPU (the driver migrates each page back before the write);
- read_mostly: advised CU_MEM_ADVISE_SET_READ_MOSTLY and prefetched to the GPU, a read duplicate
  there (the write invalidates the GPU's copies: a CPU fault and an unmap, no copy);
- discarded: prefetched to the GPU, then discarded there (cuMemDiscardBatchAsync: nothing to bring
  back; the driver may still take a fault a page).
Case a's target and fakecuda's cost of a host write in each state are to come from these figures.

    python bench/gpu/probes/host_writes.py [--mib M] [--rounds R]

M MiB of managed memory, written from the host first (every page populated). Per round and state:
the memory put in that state and the stream synchronised, then every byte written from the host
(memset), timed on the host's clock. Prints one JSON line: per state the median seconds and bytes
per second, and its time over the host state's; a refused driver call is a finding."""

import ctypes
import statistics
import sys
import time

import probe
from cudrv import call, cu

MiB = 1 << 20
STATES = ("host", "gpu", "read_mostly", "discarded")


def advise_read_mostly(gpu, ptr: int, size: int, on: bool) -> None:
    advice = (cu.CUmem_advise.CU_MEM_ADVISE_SET_READ_MOSTLY if on else
              cu.CUmem_advise.CU_MEM_ADVISE_UNSET_READ_MOSTLY)
    call("cuMemAdvise", ptr, size, advice, probe.cudrv._location(True, gpu.ordinal))


def put(gpu, state: str, ptr: int, size: int, stream) -> None:
    """The memory in `state`, its moves done."""
    if state == "read_mostly":
        advise_read_mostly(gpu, ptr, size, True)
    if state != "host":
        gpu.prefetch(ptr, size, True, stream)
    if state == "discarded":
        call("cuMemDiscardBatchAsync", [cu.CUdeviceptr(ptr)], [size], 1, 0, stream)
    gpu.synchronize(stream)


def host_write(gpu, ptr: int, size: int) -> float:
    """Seconds the host takes to write every byte."""
    start = time.perf_counter()
    gpu.host_touch(ptr, size)
    ctypes.memset(ptr, 2, size)
    return time.perf_counter() - start


def main(argv=None) -> int:
    args = probe.sized_args("host_writes.py", __doc__, argv, 256, "managed MiB written from the host", 2)
    size = args.mib * MiB
    gpu, status = probe.start("host_writes", size)
    if gpu is None:
        return status
    stream = call("cuStreamCreate", cu.CUstream_flags.CU_STREAM_NON_BLOCKING)
    doc = {"probe": "host_writes", "bytes": size, "rounds": args.rounds, "fakecuda": gpu.fake}
    buffers = []
    with probe.measuring(doc, buffers):
        managed = gpu.alloc(size, True)
        buffers.append(managed)
        gpu.host_touch(managed, size)
        ctypes.memset(managed, 1, size)
        samples = {state: [] for state in STATES}
        for _ in range(args.rounds):
            for state in STATES:
                put(gpu, state, managed, size, stream)
                samples[state].append(host_write(gpu, managed, size))
                if state == "read_mostly":
                    advise_read_mostly(gpu, managed, size, False)
        host = statistics.median(samples["host"])
        doc["states"] = {state: {"seconds": statistics.median(s), "bytes_per_s": size / statistics.median(s),
                                 "over_host": statistics.median(s) / host, "samples_seconds": s}
                         for state, s in samples.items()}
    probe.emit(doc)
    return 0 if "finding" not in doc else 1


if __name__ == "__main__":
    sys.exit(main())
