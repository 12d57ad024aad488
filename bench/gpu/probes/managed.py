#!/usr/bin/env python3
"""Managed memory as pump uses it, call by call: allocation (cuMemAllocManaged, and a managed
pool's cuMemAllocFromPoolAsync as managed_all and pump's PyTorch allocator use), prefetch (one
range, cuMemPrefetchAsync; a batch, cuMemPrefetchBatchAsync) to the GPU and to the host,
discard (cuMemDiscardBatchAsync), advice (cuMemAdvise), and the device's concurrent managed
access.  Each call's answer is recorded; a refusal is a finding (issue 27 risks 1 and 6).

    python bench/gpu/probes/managed.py [--mib M]

Prints one JSON line: {"probe": "managed", "concurrent_managed_access", "results": {memory:
{call: "ok" | "refused: ..."}}, "pool_prefetchable": true | false | null}.  Refuses (exit 3)
before allocating when the card cannot hold 2 x M MiB with membudget's margin."""

import argparse
import sys

import probe
from cudrv import call, cu, _location


def attribute(gpu, name: str):
    return probe.attempt(call, "cuDeviceGetAttribute", getattr(cu.CUdevice_attribute, name), gpu.device)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="managed.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--mib", type=int, default=64, help="MiB per allocation (default 64)")
    args = ap.parse_args(argv)
    size = args.mib * probe.membudget.MiB
    gpu, status = probe.start("managed", 2 * size)
    if gpu is None:
        return status
    stream = call("cuStreamCreate", cu.CUstream_flags.CU_STREAM_NON_BLOCKING)
    doc = {"probe": "managed", "bytes": size,
           "concurrent_managed_access": attribute(gpu, "CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS"),
           "pageable_memory_access": attribute(gpu, "CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS"), "results": {}}
    memories = {"cuMemAllocManaged": lambda: gpu.alloc(size, managed=True)}

    def pool_alloc():
        pool = call("cuMemGetDefaultMemPool", _location(True, gpu.ordinal),
                    cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_MANAGED)
        ptr = int(call("cuMemAllocFromPoolAsync", size, pool, stream))
        call("cuStreamSynchronize", stream)
        return ptr
    memories["managed pool"] = pool_alloc
    for memory, alloc in memories.items():
        res = doc["results"][memory] = {}
        ptr = probe.attempt(alloc)
        res["alloc"] = "ok" if isinstance(ptr, int) else ptr
        if not isinstance(ptr, int):
            continue
        gpu.host_touch(ptr, size)
        for to_device, where in ((True, "gpu"), (False, "host")):
            res[f"prefetch to {where}"] = probe.attempt(
                lambda: (gpu.prefetch(ptr, size, to_device, stream), gpu.synchronize(stream)) and None)
            res[f"batch prefetch to {where}"] = probe.attempt(
                lambda: (call("cuMemPrefetchBatchAsync", [cu.CUdeviceptr(ptr)], [size], 1,
                              [_location(to_device, gpu.ordinal)], [0], 1, 0, stream),
                         gpu.synchronize(stream)) and None)
        res["discard"] = probe.attempt(
            lambda: (call("cuMemDiscardBatchAsync", [cu.CUdeviceptr(ptr)], [size], 1, 0, stream),
                     gpu.synchronize(stream)) and None)
        res["advise preferred location gpu"] = probe.attempt(
            call, "cuMemAdvise", ptr, size, cu.CUmem_advise.CU_MEM_ADVISE_SET_PREFERRED_LOCATION,
            _location(True, gpu.ordinal))
        # The H100 refused the preferred location on pool memory (801); is read-mostly refused too?
        res["advise read mostly"] = probe.attempt(
            call, "cuMemAdvise", ptr, size, cu.CUmem_advise.CU_MEM_ADVISE_SET_READ_MOSTLY,
            _location(True, gpu.ordinal))
        res["free"] = probe.attempt(call, "cuMemFree", ptr)
    pool = doc["results"].get("managed pool", {})
    moves = [v for k, v in pool.items() if "prefetch" in k or k == "discard"]
    doc["pool_prefetchable"] = (all(v == "ok" for v in moves) if moves else None)
    probe.emit(doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
