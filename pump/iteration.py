"""The iteration of a launch-key sequence: its period, found with a tolerance, and where a learned
one starts whatever launch it was learned at (pump/foresight.py learns and plans a job's iteration
with them; `pump trace stats` and the simulator's workloads find theirs).
"""

import bisect

import numpy as np

DEFAULT_TOLERANCE = 0.05          # the share of an iteration's launches that may differ
MIN_PERIOD = 2
MAX_HISTORY = 1 << 20             # launches kept; iterations longer than half of it are not learned
ANCHORS = 16                      # recent launches considered as the period's anchor
MATCH_WINDOW = 1024               # recent launches a period must explain (fewer while the history is short)
CANDIDATES = 64                   # periods tried per detection


class IterationDetector:
    """The period of a launch-key sequence, found with a tolerance.

    Cheap enough to run on every batch pumpd reads (a few hundred launches every 5-25 ms):
    keys live in a growing array (no copy of the history per batch) and each key's positions
    are indexed as they arrive, so finding candidate periods costs the anchor's occurrences,
    not a pass over the history."""

    def __init__(self, tolerance: float = DEFAULT_TOLERANCE):
        if not 0 <= tolerance < 0.5:
            raise ValueError(f"tolerance {tolerance}: allowed 0 <= tolerance < 0.5")
        self.tolerance = tolerance
        self._buf = np.empty(1024, np.uint64)
        self._len = 0
        self.offset = 0               # global launch index of keys[0]
        self._where = {}              # key -> global indices at which it occurs (may hold dropped ones)
        self.history_max = MAX_HISTORY  # launches kept (pumpd sets each process's share)

    @property
    def keys(self) -> np.ndarray:
        return self._buf[:self._len]

    @property
    def seen(self) -> int:
        return self.offset + self._len

    def extend(self, keys: np.ndarray) -> int:
        """Append keys; returns how many old ones were dropped from the front."""
        keys = np.asarray(keys, np.uint64)
        if self._len + len(keys) > len(self._buf):
            grown = np.empty(max(2 * len(self._buf), self._len + len(keys)), np.uint64)
            grown[:self._len] = self.keys
            self._buf = grown
        # Positions per distinct key, in order: a batch repeats few keys many times.
        order = np.argsort(keys, kind="stable")
        distinct, starts = np.unique(keys[order], return_index=True)
        positions = (order + self.seen).tolist()
        for k, start, end in zip(distinct.tolist(), starts.tolist(), starts[1:].tolist() + [len(keys)]):
            self._where.setdefault(k, []).extend(positions[start:end])
        self._buf[self._len:self._len + len(keys)] = keys
        self._len += len(keys)
        drop = self._len - self.history_max
        if drop <= 0 or drop < self.history_max // 8:  # trim in chunks: a trim copies the history
            return 0
        self.drop_front(drop)
        return drop

    def drop_front(self, drop: int):
        """Forget the oldest `drop` keys (the history's front)."""
        drop = min(drop, self._len)
        self._buf[:self._len - drop] = self._buf[drop:self._len].copy()
        self._len -= drop
        self.offset += drop
        for k in list(self._where):
            kept = self._where[k][bisect.bisect_left(self._where[k], self.offset):]
            if kept:
                self._where[k] = kept
            else:
                del self._where[k]

    def detect(self) -> int:
        """The smallest period P for which the last W keys match the W before them shifted by P
        in at least (1 - tolerance) of the places, where W is P or MATCH_WINDOW, whichever is
        longer (but no more than the history past its first P); 0 if there is none.  Matching
        only P keys took any short run inside an iteration for one: on the H100, saxpy and scale
        alternating four times in a 32-launch step, and a GPT-2 step of 1,258 launches, were
        both learned as "an iteration of 2 launches" (bench/results/gpu-20261124-*)."""
        h = self.keys
        n = len(h)
        if n < 2 * MIN_PERIOD:
            return 0
        # Anchor: the rarest of the last few keys (fewest candidate periods to try).
        tail = dict.fromkeys(h[-ANCHORS:].tolist())
        occurrences = {k: self._where[k][bisect.bisect_left(self._where[k], self.offset):] for k in tail}
        for key in sorted(occurrences, key=lambda k: len(occurrences[k])):
            where = occurrences[key]
            if len(where) < 2:
                continue
            last = where[-1]
            tried = 0
            for earlier in reversed(where[:-1]):
                p = last - earlier
                if 2 * p > n or tried == CANDIDATES:
                    break
                if p < MIN_PERIOD:
                    continue
                tried += 1
                w = max(p, min(MATCH_WINDOW, n - p))
                if np.count_nonzero(h[n - w:] != h[n - w - p:n - p]) <= self.tolerance * w:
                    return p
            return 0
        return 0


def canonical_start(keys, blocks) -> int:
    """Where a learned iteration (a cycle: its launch keys, and each launch's blocks) starts,
    whichever launch it was learned at and wherever the allocator put its memory: at the least
    rotation of its launches' shapes.  A launch's shape is the distance to its key's next
    launch and its blocks' distances to their next uses, in the order it names them.  Keys and
    blocks are addresses (a kernel's handle, its allocations), which differ from run to run and
    between a trace and its replay; the shapes do not.  MIN's ties, the room for transfers in
    flight and the prefetches' anchors follow from where the cycle starts: started at its least
    key (a hash of addresses), a replay's plan let 192, 256 or 320 faults a step through from
    run to run against the model's 320 (tests/test_replay_vs_simulate.py)."""
    period = len(keys)
    if period == 0:
        return 0
    keys = np.asarray(keys)
    listed = keys.tolist()
    key_next, block_next = {}, {}     # the position of each key's and block's next use
    shapes = [None] * period
    for pos in range(2 * period - 1, -1, -1):
        j = pos % period
        key = listed[j]
        if pos < period:
            shapes[j] = (key_next[key] - pos,
                         tuple(block_next[b] - pos for b in blocks[j]))
        key_next[key] = pos
        for b in blocks[j]:
            block_next[b] = pos
    order = {shape: rank for rank, shape in enumerate(sorted(set(shapes)))}
    rank = np.fromiter(map(order.__getitem__, shapes), np.int64, period)
    # Prefix doubling: after each round, rank[i] orders the rotations starting at i by their
    # first `width` shapes; it ends when every rotation differs or the widths cover the cycle.
    width, distinct = 1, len(order)
    while width < period and distinct < period:
        pairs = rank * period + np.roll(rank, -width)
        rank = np.unique(pairs, return_inverse=True)[1]
        distinct = int(rank.max()) + 1
        width *= 2
    # Least rotations alike (a cycle of the same shapes over other blocks, as forward and
    # backward passes over layers of one size): their plans differ only in which blocks
    # move, so the least key picks one wherever the reads cut the stream.
    least = np.flatnonzero(rank == rank.min())
    return int(least[np.argmin(keys[least])])
