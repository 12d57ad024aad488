"""The host link in the simulator's half-duplex case (constants.RANGE_CASES, worst): one copy
at a time, either direction.

A copy takes the link at the earliest time at or after it is ready when the link is free for
its whole length, in a gap between the copies placed before it if one is long enough.  Each
stream stays first in, first out (a copy is ready only after its stream's previous copy), but
a stream does not hold the link while it waits: pump's evictions wait on their victims' last
kernels (cuStreamWaitEvent on pump's eviction stream) and its prefetches on their room, and
CUDA streams wait apart, so a prefetch ready now is not queued behind an eviction whose kernel
is still running."""

import bisect


class HalfDuplexLink:
    """The link's busy intervals, sorted and disjoint."""

    def __init__(self):
        self.starts, self.ends = [], []

    def place(self, ready: float, seconds: float, floor: float) -> float:
        """Books a copy of `seconds` ready at `ready`; returns when it starts.  `floor`: no copy
        booked from now on is ready before it (intervals that end by then are forgotten)."""
        gone = bisect.bisect_right(self.ends, floor)
        if gone:
            del self.starts[:gone], self.ends[:gone]
        i, start = bisect.bisect_right(self.ends, ready), ready
        while i < len(self.starts) and self.starts[i] < start + seconds:
            start = max(start, self.ends[i])
            i += 1
        self.starts.insert(i, start)
        self.ends.insert(i, start + seconds)
        return start
