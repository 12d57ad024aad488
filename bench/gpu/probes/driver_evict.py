#!/usr/bin/env python3
"""The driver's own eviction rate against pump's (a prefetch to the host), in the same run: what
the worst case of `pump simulate` and fakecuda assume and no run has measured. The simulator
takes the driver's evictions at the link's line rate and pump's at the measured prefetch-to-host
rate (11.24 GB/s on the first H100), which alone keeps lookahead over 2x its bound there; if the
driver's path is no faster, the bound's write-back rate is the slower one, and if it is faster,
pump should leave its evictions to the driver.

    python bench/gpu/probes/driver_evict.py [--mib M] [--rounds R]

How, within GPU.md's rule (no managed memory beyond what the card has free when it is asked
for): plain memory (cuMemAlloc) fills the card but a margin and M MiB; M MiB of managed memory,
written on the host, is prefetched to the GPU. Then per round: (pump's path) the first half is
prefetched to the host and the call and its stream timed, then brought back; (the driver's path)
a plain allocation of the free memory plus half of M is timed: RM's allocation evicts UVM's
chunks to make room (uvm_pmm_gpu.c: PMA's eviction callback, evict_root_chunk copies each
chunk's resident pages to the host), and the bytes it evicted are read from cuMemGetInfo
before and after; the allocation is freed and the managed memory brought back. Prints one JSON
line: per path the median bytes per second, and their ratio; on fakecuda also the same from the
modelled time charged to the probe's thread ("fakecuda_charged", cudrv.Stopwatch)."""

import ctypes
import statistics
import sys

import probe
from cudrv import Stopwatch, call, cu

MiB = 1 << 20
SLACK = 256 * MiB


def on_gpu(gpu, managed: int, size: int, stream) -> None:
    """All of the managed memory resident on the GPU again."""
    gpu.prefetch(managed, size, True, stream)
    gpu.synchronize(stream)


def pump_path(gpu, managed: int, half: int, stream):
    """(wall, charged) seconds (cudrv.Stopwatch) of a prefetch of the first half to the host, the
    call and its stream."""
    watch = Stopwatch(gpu)
    gpu.prefetch(managed, half, False, stream)
    gpu.synchronize(stream)
    return watch.read()


def driver_path(gpu, half: int):
    """(bytes evicted, (wall, charged) seconds) of a plain allocation of the free memory and half
    more, which the driver makes room for by evicting managed memory; the allocation is freed."""
    before, _ = gpu.memory()
    pressure_bytes = before + half
    watch = Stopwatch(gpu)
    pressure = gpu.alloc(pressure_bytes, False)
    seconds = watch.read()
    after, _ = gpu.memory()
    call("cuMemFree", pressure)
    moved = pressure_bytes - before + after   # the room the allocation's evictions made
    return moved, seconds


def rates(half: int, evicted, pump_seconds, driver_seconds, clock: int) -> dict:
    """Per path the bytes per second of each round and their median, and the driver's over pump's,
    on one of the Stopwatch's clocks (0 wall, 1 charged)."""
    pump = [half / s[clock] for s in pump_seconds]
    driver = [moved / s[clock] for moved, s in zip(evicted, driver_seconds)]
    doc = {"prefetch_to_host_bytes_per_s": statistics.median(pump), "driver_evict_bytes_per_s": statistics.median(driver),
           "prefetch_to_host_samples": pump, "driver_evict_samples": driver}
    doc["driver_over_prefetch"] = doc["driver_evict_bytes_per_s"] / doc["prefetch_to_host_bytes_per_s"]
    return doc


def main(argv=None) -> int:
    args = probe.sized_args("driver_evict.py", __doc__, argv, 1024, "managed MiB on the GPU, half evicted", 4)
    size, half = args.mib * MiB, args.mib * MiB // 2
    gpu, status = probe.start("driver_evict", size)
    if gpu is None:
        return status
    free, total = gpu.memory()
    # SLACK: what a plain allocation takes beyond its size (its page tables, the driver's rounding)
    filler_bytes = (free - probe.membudget.margin(total) - size - SLACK) // (2 * MiB) * (2 * MiB)
    if filler_bytes <= 0:
        probe.emit({"probe": "driver_evict", "refused_for_memory": f"{free} bytes free: no room to fill"})
        return 3
    stream = call("cuStreamCreate", cu.CUstream_flags.CU_STREAM_NON_BLOCKING)
    filler = gpu.alloc(filler_bytes, False)
    doc = {"probe": "driver_evict", "managed_bytes": size, "filler_bytes": filler_bytes, "rounds": args.rounds}
    managed = None
    try:
        gpu.check_fits("driver_evict's managed memory", size)
        managed = gpu.alloc(size, True)
        gpu.host_touch(managed, size)
        ctypes.memset(managed, 1, size)
        pump_seconds, driver_seconds, evicted = [], [], []
        for _ in range(args.rounds):
            on_gpu(gpu, managed, size, stream)
            pump_seconds.append(pump_path(gpu, managed, half, stream))
            on_gpu(gpu, managed, size, stream)
            moved, seconds = driver_path(gpu, half)
            evicted.append(moved)
            driver_seconds.append(seconds)
        doc.update(rates(half, evicted, pump_seconds, driver_seconds, 0), evicted_bytes_per_round=evicted)
        if gpu.fake:  # the model's own figures, exactly: what the tests check
            doc["fakecuda_charged"] = rates(half, evicted, pump_seconds, driver_seconds, 1)
    except probe.membudget.Refused as exc:
        doc["refused_for_memory"] = str(exc)
    except probe.cudrv.CudaError as exc:
        doc["finding"] = str(exc)
    finally:
        if managed is not None:
            call("cuMemFree", managed)
        call("cuMemFree", filler)
    probe.emit(doc)
    return 3 if "refused_for_memory" in doc else 0 if "finding" not in doc else 1


if __name__ == "__main__":
    sys.exit(main())
