"""The host link in the simulator's half-duplex case (constants.RANGE_CASES, worst): one copy
at a time, either direction.

A copy takes the link at the earliest time at or after it is ready when the link is free for
its whole length, in a gap between the copies placed before it if one is long enough.  Each
stream stays first in, first out (a copy is ready only after its stream's previous copy), but
a stream does not hold the link while it waits: pump's evictions wait on their victims' last
kernels (cuStreamWaitEvent on pump's eviction stream) and its prefetches on their room, and
CUDA streams wait apart, so a prefetch ready now is not queued behind an eviction whose kernel
is still running.

The copies' timing in every case: Streams times pump's moves (its driver calls on the launching
thread, host.LaunchThread, and the prefetch and eviction streams' copies on the link, with the
room a prefetch waits for); what is moved, and how many bytes, a run decides (engine._Run).
The launch rule decides from what the shim believes and what the GPU holds, never from when
anything happens, so the range's two cases (engine.range_models: the same GPU at other rates,
full or half duplex) make the same moves: a run records them (Moves), and the run of the other
case times the recording instead of searching victims and following pages again (runs.py).
Lookahead decides so up to its first plan, made from the kernels' simulated times."""

import bisect
import collections

import numpy as np


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


class Streams:
    """When pump's moves happen in one run (engine.py's module docstring, Time): the clocks of
    `thread` (host.LaunchThread), the two streams' ends, the link's busy intervals on a
    half-duplex link, evictions in flight, and per block when its last user ends and when its
    prefetch ends.  Counts prefetches' waits for room into `result`.  Every move of a launch's
    hook is timed from the launch's hook time, `now`."""

    def __init__(self, model, capacity: int, block_bytes: list, thread, result, recorder=None):
        self.rate_in, self.rate_out = model.bandwidth, model.d2h_rate   # properties, read per block moved
        self.link_out = model.link_out
        self.capacity, self.size = capacity, block_bytes
        self.thread, self.r, self.rec = thread, result, recorder
        self.last_user_end = np.zeros(len(block_bytes))   # per block: when the last kernel using it ends
        self.ready = np.zeros(len(block_bytes))           # per block: when the prefetch that brought it ends
        self.pending = collections.deque()     # evictions in flight: (end time, bytes)
        self.pending_bytes = 0
        self.pf_free = self.ev_free = 0.0
        self.link = None if model.full_duplex else HalfDuplexLink()
        self.called = False                    # a driver call was made (engine._Run._host_totals)
        self.moves = None                      # the launch's list of moves, where they are recorded (Moves)

    def evict(self, b, moved: int, holds_room: bool, now):
        """pump evicts b, `moved` bytes of it copied, on the eviction stream after b's last user;
        holds_room: b was believed resident, so its room is free only when the copy ends.
        The call waits inside the ioctl for the copy (uvm_migrate.c), as fakecuda charges it:
        the copy is that wait, on the link (later where the link is busy), and the eviction
        stream that then reaches it after b's last user has nothing left to copy.  (Here and in
        prefetch max() of two is written out: a builtin call costs ten comparisons.)"""
        if self.moves is not None:
            self.moves.append((Streams.evict, (b, moved, holds_room)))
        floor, copy = now, moved / self.rate_out
        self.called = True
        now = self.thread.call("evict", b, now, copy, moved)
        start = now - copy
        if self.ev_free > start:
            start = self.ev_free
        if self.link is not None and moved:  # one direction at a time
            start = self.link.place(start, copy, floor)
        end, last_use = start + copy, self.last_user_end.item(b)
        self.ev_free = last_use if last_use > end else end
        if self.rec is not None and moved:
            self.rec.transfer("evict", b, moved, now, start, start + copy)
        if moved and holds_room:
            self.pending.append((self.ev_free, self.size[b]))
            self.pending_bytes += self.size[b]

    def prefetch(self, b, back: int, arriving: int, moved: int, believed: int, now) -> float:
        """pump prefetches b: `back` bytes the driver evicts first to make room on the GPU,
        `arriving` bytes made resident (the call's CPU work), `moved` copied; `believed`: the
        bytes the shim believes resident with b.  Returns when b is on the GPU."""
        if self.moves is not None:
            self.moves.append((Streams.prefetch, (b, back, arriving, moved, believed)))
        self.called = True
        floor, now = now, self.thread.call("prefetch", b, now, 0.0, arriving)
        start = (self.pf_free if self.pf_free > now else now) + back / self.link_out
        # Room: evictions still in flight hold their chunks until they complete.
        pending = self.pending
        while pending and pending[0][0] <= start:
            self.pending_bytes -= pending.popleft()[1]
        while pending and believed + self.pending_bytes > self.capacity:
            end, nbytes = pending.popleft()
            self.pending_bytes -= nbytes
            self.r.prefetch_wait_seconds += end - start if end > start else 0.0
            if end > start:
                start = end
        copy = moved / self.rate_in
        if self.link is not None and moved:
            start = self.link.place(start, copy, floor)
        self.pf_free = done = start + copy
        self.ready[b] = done
        if self.rec is not None and moved:
            self.rec.transfer("prefetch", b, moved, now, start, done)
        return done

    def discards(self, blocks: list, now):
        """pump discards `blocks` (host.LaunchThread.discards): no copy, the calls' time."""
        if self.moves is not None:
            self.moves.append((Streams.discards, (blocks,)))
        self.called = True
        self.thread.discards(blocks, now)

    def replay(self, moves, now) -> float:
        """Times recorded `moves` (Moves: one launch's, before or after its kernel) from `now`;
        returns when the last prefetch among them ends (`now` if none)."""
        ready = now
        for move, args in moves:
            done = move(self, *args, now)
            if done is not None and done > ready:
                ready = done
        return ready


class Moves:
    """One run's moves, for a run of the same policy at the same capacity on the same GPU at
    other rates (runs.Runs): per launch those of its hook before the kernel, the kernel's faults
    and bytes (gpu_truth.GpuTruth.kernel), those after; per step the counts that follow from
    them (engine.DECIDED).  A run recording them stops at its first plan (lookahead): it keeps
    there what it decided so far (`state`), from which the run timing them goes on."""

    def __init__(self):
        self.before, self.kernels, self.after, self.counts = [], [], [], []
        self.until = None      # the launches recorded: all, or those before the first plan
        self.state = None      # engine._Run's decided state at `until`, where the run went on

    def stop(self, launch: int, state=None):
        self.until, self.state = launch, state
