"""A caching allocator's segments in the simulator (issue 44): a dead tensor's memory stays in
its segment, as it does in the traced job.

PyTorch's caching allocator takes a segment from the driver and hands tensors out of it; a
tensor it frees keeps its memory in the segment until a later tensor is placed there.  The shim
records the carve (shim/hooks/torch_trace.c): an ALLOC of the segment, a FREE of the same base
and size, then an ALLOC at that base no larger, the segment's first tensor; then each tensor's
ALLOC inside the segment and its FREE.  classify() finds the carve exactly as bench/replay_trace.c
does (its settle_carve, alloc_record and free_record, among the ALLOC, FREE and LAUNCH records:
the ALLOC and FREE of one base and size with no LAUNCH or other ALLOC or FREE between, then an
ALLOC at that base, no larger, as the very next record other than a launch's own EXTENT,
LAUNCH_MORE or COST), and, as it does, keeps each segment whole to the end of the trace (a
carved segment's own free is not recorded).  With segments kept (workload.load's default;
`pump simulate --no-segments` and `replay_trace --no-segments` free each dead tensor instead):

- the truth (gpu_truth.py): a dead tensor's pages stay where they are: resident ones count
  against the GPU's memory, the driver evicts them in its order and copies them out, and a
  later tensor placed over them that a kernel uses brings them back (UVM migrates a page
  whatever the kernel does to it, a first write included);
- pump's belief (engine.py, victims.py): the dead tensor's blocks stay believed resident and
  counted against the budget, and become the first victims: in the migration order they go to
  its oldest end, in the use order their last use counts for nothing (a plan's naming still
  does), as the shim's pump_residency_freed and residency_rank.c's rank_of make them.  A block
  goes dead only when no live tensor holds any of it (the simulator's blocks are 2 MiB of
  address; the shim's are each tensor's own);
- a tensor placed over dead blocks revives them: those still believed resident become the
  newest in the migration order and rank by their last use again, as the shim's record of a
  freed tensor taken over by the next tensor at its extent does (ranges.h, pump_blocks_attach);
- the peak footprint counts the segments whole (the memory the job holds), not its live tensors.

The workload's events say it: ("carve", segment base, size) where the FREE of a carve was,
("tensor_alloc", base, size) and ("tensor_free", base, size) for a tensor inside a segment, and
after a tensor_free ("dead", first block's address, bytes) over the whole blocks it left dead
(none where its neighbours hold them all).  A trace with no carve has none of these: its events,
and every run on it, are as they were.

The lower bound (bound.py) is left as it is: it counts what must move for the data, and a dead
tensor's pages are dead data whatever the allocator does with the memory (a policy that discards
them, PUMP_TORCH_DISCARDS, moves none of them).  What the segments add is a cost of the policies
that keep dead memory, not of the workload."""

import bisect

import numpy as np

from pump import channel
from pump.simulate import constants as K

KIND = channel.KIND
BLOCK = K.BLOCK_BYTES
SHIFT = BLOCK.bit_length() - 1
# A record of these kinds belongs to the LAUNCH before it: replay_trace reads it before it
# settles a FREE held back (replay(): they return first).
_LAUNCHS_OWN = (KIND["launch_more"], KIND["extent"], KIND["cost"])
# What classify() tags each ALLOC and FREE record as.
PLAIN, CARVE, TENSOR_ALLOC, TENSOR_FREE = 0, 1, 2, 3
EVENT_OF = {(KIND["alloc"], PLAIN): "alloc", (KIND["free"], PLAIN): "free", (KIND["free"], CARVE): "carve",
            (KIND["alloc"], TENSOR_ALLOC): "tensor_alloc", (KIND["free"], TENSOR_FREE): "tensor_free"}
# The events a run acts on here (run_event); the bound reads "carve" and "tensor_free" as frees.
RUN_EVENTS = frozenset(("free", "dead", "tensor_alloc"))


def classify(records) -> tuple:
    """(per record: PLAIN, CARVE, TENSOR_ALLOC or TENSOR_FREE, or None where nothing was carved;
    the segments kept, [(base, size)]), bench/replay_trace.c's reading of the same records."""
    kind = records["kind"]
    alloc_or_free = (kind == KIND["alloc"]) | (kind == KIND["free"])
    at = np.flatnonzero(alloc_or_free)
    if not len(at):
        return None, []
    # Between two ALLOC or FREE records: a LAUNCH (ends "the last record was an ALLOC"), or any
    # record a held-back FREE is settled by (all but a launch's own).
    launches = np.r_[0, np.cumsum(kind == KIND["launch"])]
    settles = np.r_[0, np.cumsum(~alloc_or_free & ~np.isin(kind, _LAUNCHS_OWN))]
    launch_between = (launches[at[1:]] - launches[at[:-1] + 1] > 0).tolist() + [True]
    settled_between = (settles[at[1:]] - settles[at[:-1] + 1] > 0).tolist() + [True]
    is_alloc = (kind[at] == KIND["alloc"]).tolist()
    args = records["arg"][at, :2].tolist()
    tags = [PLAIN] * len(at)
    live, bases = {}, []            # trace base -> (size, tensor), and the bases sorted
    segments = []                   # [(base, size)], never freed
    last_alloc = None               # (base, size) of an ALLOC that may be carved next
    pending = None                  # the FREE held back: (its index in `at`, base, size)

    def holding(addr):
        j = bisect.bisect_right(bases, addr) - 1
        return bases[j] if j >= 0 and addr < bases[j] + live[bases[j]][0] else None

    def drop(base):
        del live[base]
        bases.pop(bisect.bisect_left(bases, base))

    for i, alloc in enumerate(is_alloc):
        base, size = args[i]
        if alloc:
            if pending is not None:
                j, cbase, csize = pending
                if base == cbase and size <= csize:
                    tags[j] = CARVE
                    segments.append((cbase, csize))
                drop(cbase)     # made a segment, or freed
                pending = None
            last_alloc = None
            old = holding(base)
            if old == base:
                drop(base)      # freed unseen: the base is used again
                old = None
            seg = next((s for s in segments if s[0] <= base < s[0] + s[1]), None) if segments else None
            if old is not None:
                pass            # overlaps a live allocation (replay_trace refuses the trace)
            elif seg is not None and size <= seg[0] + seg[1] - base:
                tags[i] = TENSOR_ALLOC
                live[base] = (size, True)
                bisect.insort(bases, base)
            else:
                live[base] = (size, False)
                bisect.insort(bases, base)
                last_alloc = (base, size)
        else:
            if pending is not None:
                drop(pending[1])    # freed: the next record carved nothing
                pending = None
            after_its_alloc = last_alloc == (base, size)
            last_alloc = None
            if holding(base) != base:
                pass                # unknown: nothing to free
            elif live[base][1]:
                tags[i] = TENSOR_FREE
                drop(base)
            elif after_its_alloc:
                pending = (i, base, size)
            else:
                drop(base)
        if launch_between[i]:
            last_alloc = None
        if settled_between[i] and pending is not None:
            drop(pending[1])
            pending = None
    if not segments:
        return None, []
    out = np.full(len(kind), PLAIN, np.int8)
    out[at] = tags
    return out, segments


def dead_blocks(base, size, allocations, sorted_bases):
    """(first address, bytes) of the whole 2 MiB blocks the tensor [base, base + size) leaves
    dead, once it is out of `allocations` (base -> size, the live ones, sorted in
    `sorted_bases`): those of its blocks no live allocation reaches into; None if none."""
    lo, hi = base // BLOCK * BLOCK, -(-(base + size) // BLOCK) * BLOCK
    j = bisect.bisect_left(sorted_bases, base)
    if j > 0 and sorted_bases[j - 1] + allocations[sorted_bases[j - 1]] > lo:
        lo += BLOCK
    if j < len(sorted_bases) and sorted_bases[j] < hi:
        hi -= BLOCK
    return (lo, hi - lo) if hi > lo else None


def run_event(run, what, addr, size):
    """An allocator's event in a run (engine._Run): a free (the memory gone, its pages nowhere),
    a segment's dead blocks (kept, the first victims), a tensor placed in a segment (its dead
    blocks revived)."""
    blocks = map(run.w.block_of.get, range(addr >> SHIFT, (addr + size + BLOCK - 1) >> SHIFT))
    if what == "free":
        for b in blocks:
            if b is not None:
                run._forget(b)
                run.gpu.free(b)
                run.dead[b] = 0
    elif what == "dead":
        for b in blocks:
            if b is not None:
                run.used.bury(b)
                if b in run.migrated:
                    run.migrated.move_to_end(b, last=False)
    else:   # tensor_alloc
        for b in blocks:
            if b is not None and run.used.is_buried(b):
                if b in run.migrated:
                    run.migrations += 1
                    run.migrated.move_to_end(b)
                    run.used.revive(b, run.migrations)
                else:
                    run.used.revive(b, None)
