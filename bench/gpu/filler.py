"""Case f's filler: real oversubscription (../../shared GPU.md, "Oversubscription, two ways").
train_gpt.py --filler-bytes first takes plain device memory that Unified Memory cannot evict,
so that what the card has left for the job's managed memory is a fraction of its working set;
the driver's own faults, prefetcher and evictions then run as users meet them.  This module
sizes the filler and refuses what the rules forbid, before every run, from the card's free
memory read just before (NVML); it asks nothing of a GPU itself (tests/test_bench_gpu_filler.py).

The rules: a few GiB stay free beside the managed room (HEADROOM_BYTES); the job's managed
memory, which pump-run's --capacity caps, is at most half the host's RAM (HOST_SHARE), since the
host holds what the card cannot; a probe at a small ratio (PROBE_RATIO) runs first, and the
case's runs only if it finished (suite.py)."""

import os

import membudget

GiB, MiB = membudget.GiB, membudget.MiB
BLOCK = 2 * MiB          # the filler's unit: the driver's allocation granularity on current GPUs
# Left beside the managed room for what is not managed memory and must find room after the
# filler: the CUDA context with PyTorch's kernels loaded (about 1 GiB: membudget's margin), the
# kernels loaded later, the driver's page tables for the managed memory (under managed_all
# cuBLAS's workspaces are PyTorch's, managed).  What they leave of it the driver gives to managed
# memory, so the real ratio lies between working set / (room + HEADROOM_BYTES) and RATIO.
HEADROOM_BYTES = 3 * GiB
RATIO = 2.0              # the case's runs: working set / the room the filler leaves for managed memory
PROBE_RATIO = 1.2        # the probe before them: a mild oversubscription
HOST_SHARE = 0.5         # the job's managed memory at most this share of the host's RAM


def host_ram() -> int:
    """The host's physical memory in bytes."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def room(working_set: int, ratio: float) -> int:
    """The managed room, in whole blocks (at least one), that makes working_set `ratio` times it."""
    return max(BLOCK, int(working_set / ratio) // BLOCK * BLOCK)


def size(what: str, working_set: int, managed_bytes: int, ratio: float, free: int, ram: int) -> dict:
    """The filler for a job whose steps touch `working_set` bytes and whose managed memory may
    reach `managed_bytes`, on a card with `free` bytes free now and a host of `ram` bytes: it
    leaves room(working_set, ratio) + HEADROOM_BYTES.  Raises membudget.Refused, naming the
    figures, past half the host's RAM or where the card has nothing to fill."""
    if managed_bytes > ram * HOST_SHARE:
        raise membudget.Refused(f"REFUSED {what}: its managed memory may reach {managed_bytes / GiB:.2f} GiB, more "
                                f"than half the host's {ram / GiB:.2f} GiB of RAM, which holds what the GPU cannot "
                                f"(lower --scale)")
    managed_room = room(working_set, ratio)
    filler = (free - managed_room - HEADROOM_BYTES) // BLOCK * BLOCK
    if filler < BLOCK:
        raise membudget.Refused(f"REFUSED {what}: the GPU has {free / GiB:.2f} GiB free, no more than the "
                                f"{managed_room / GiB:.2f} GiB of room for a working set of {working_set / GiB:.2f} "
                                f"GiB at {ratio}x and {HEADROOM_BYTES / GiB:.0f} GiB of headroom: nothing to fill")
    # The working set over what is left for managed memory: all the filler leaves, at least; the
    # room alone, where the rest took all the headroom.
    left = free - filler
    return {"filler_bytes": filler, "free_bytes": free, "left_bytes": left, "room_bytes": managed_room,
            "headroom_bytes": HEADROOM_BYTES, "working_set_bytes": working_set, "managed_bytes": managed_bytes,
            "ratio": ratio, "ratio_range": [working_set / left, working_set / managed_room]}
