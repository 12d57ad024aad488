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
    """The link's busy intervals, sorted and disjoint; intervals back to back are one (a link
    behind by thousands of copies holds a few intervals, not thousands: no gap is lost, as a
    gap between two copies back to back is no gap)."""

    def __init__(self):
        self.starts, self.ends = [], []

    def place(self, ready: float, seconds: float, floor: float) -> float:
        """Books a copy of `seconds` ready at `ready`; returns when it starts.  `floor`: no copy
        booked from now on is ready before it (intervals that end by then are forgotten)."""
        starts, ends = self.starts, self.ends
        gone = bisect.bisect_right(ends, floor)
        if gone:
            del starts[:gone], ends[:gone]
        i, start = bisect.bisect_right(ends, ready), ready
        while i < len(starts) and starts[i] < start + seconds:
            if ends[i] > start:   # max(), written out: a builtin call costs ten comparisons
                start = ends[i]
            i += 1
        end = start + seconds
        after = i > 0 and ends[i - 1] == start          # it begins as interval i - 1 ends
        before = i < len(starts) and starts[i] == end    # it ends as interval i begins
        if after and before:
            ends[i - 1] = ends[i]
            del starts[i], ends[i]
        elif after:
            ends[i - 1] = end
        elif before:
            starts[i] = start
        else:
            starts.insert(i, start)
            ends.insert(i, end)
        return start
