"""The bytes that must move per step, for the GPU suite's lower bound
max(compute time, bytes that must move / measured prefetch bandwidth), from a `pump-run --trace`
of the run: pump's own bound machinery (pump/simulate/bound.py) on the learned iteration, with
one addition for memory the host writes every step.

bound.py counts Belady's MIN over the blocks the kernels touch, repeated for ever.  A block the
host rewrites every step is not reusable from one step to the next: its copy on the GPU is stale
after the write, so it must come over again whatever the capacity.  Here such blocks get a new
identity every step of the unrolled iteration, and MIN runs on that reference string; without
host-written memory the count is bound.py's must_move_bytes exactly (the suite's tests check it).
"""

import numpy as np

from pump.simulate import bound, engine, workload
from pump.simulate import constants as K


class NoIteration(Exception):
    """The trace holds no repeating iteration to bound; str() says why."""


def host_written_blocks(w, ranges) -> set:
    """Block ids of w that lie in any of `ranges` ((address, bytes) the host writes every step)."""
    addresses = w.block_address.astype(np.int64)
    hit = np.zeros(len(addresses), bool)
    for address, size in ranges:
        hit |= (addresses >= address) & (addresses < address + size)
    return set(np.flatnonzero(hit).tolist())


def must_move(trace_path: str, capacity: int, host_written=(), cycles: int = bound.CYCLES) -> dict:
    """{"must_move_bytes" per step, "steps_per_cycle", "launches_per_cycle", "host_written_blocks"}
    for a GPU holding `capacity` bytes; raises NoIteration or workload.WorkloadError."""
    w = workload.load(trace_path)
    if not w.period and len(engine._step_bounds(w)) < 2:
        raise NoIteration(f"{trace_path}: pump learned no iteration from its {w.launches} launches "
                          f"and it holds no step markers")
    lo, hi, steps = bound._cycle(w)
    fresh = host_written_blocks(w, host_written)
    nblocks = len(w.block_bytes)
    per_step = max(1, (hi - lo) // steps)
    # Unrolled: `cycles` copies of the iteration; a host-written block is a new block each step.
    refs = []
    for c in range(cycles):
        for j in range(lo, hi):
            renamed = (c * steps + min((j - lo) // per_step, steps - 1) + 1) * nblocks
            refs.extend((b + renamed if b in fresh else b,) for b, _mask in w.touched[j])
    block_bytes = np.tile(w.block_bytes, cycles * steps + 1)
    slots = capacity // K.BLOCK_BYTES
    _, nbytes = bound.min_fetches(refs, block_bytes, slots, cycles=1)
    # What the GPU held before the first cycle saves at most its capacity, and only blocks that
    # are reused: a host-written block is never valid on the GPU beforehand.
    reusable = sum(int(w.block_bytes[b]) for b in {b for j in range(lo, hi) for b, _ in w.touched[j]} - fresh)
    per_cycle = max(0.0, (nbytes - min(slots * K.BLOCK_BYTES, reusable)) / cycles)
    return {"must_move_bytes": int(per_cycle / steps), "steps_per_cycle": steps,
            "launches_per_cycle": hi - lo, "host_written_blocks": len(fresh)}
