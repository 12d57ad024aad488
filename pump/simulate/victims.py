"""The orders in which the simulated shim picks its victims (engine.py), and the search through
them that a launch's hook makes: the migration order (an ordered dict of the believed blocks)
and the use order (UseOrder, the shim's PUMP_ORDER_USED).  Both are walked many times per launch
on a large model (gpt2-medium at half its footprint evicts half a million blocks over a run), so
each is kept for the walk: tests/test_simulate_speed.py holds them equal to the plain heap and
scan they replaced."""

import copy
import heapq
import itertools

import numpy as np


class VictimSearch:
    """The victim searches of one launch's hook, in `order` (the migration order, an ordered
    dict, or the use order, a UseOrder) past the blocks in `protect`, which stay resident
    through the hook: each protected block is passed once per hook, not once per victim (a
    launch of the optimizer's names a thousand blocks and evicts hundreds).  Nothing is put
    before a protected block while the hook runs (blocks are believed at the order's end and
    only victims leave), so the protected blocks seen first stay first.  close() gives the use
    order its protected entries back."""

    def __init__(self, order, use_order, protect):
        self.order, self.protect, self.aside = order, protect, []
        self.by_use = order is use_order
        self.passed = 0                   # leading keys of the ordered dict known protected

    def next(self):
        """The first block in the order not protected (left in place), or None."""
        if self.by_use:
            return self.order.first_not_in(self.protect, self.aside)
        for b in itertools.islice(self.order, self.passed, None):
            if b not in self.protect:
                return b
            self.passed += 1
        return None

    def close(self):
        if self.by_use:
            self.order.restore(self.aside)


_LAUNCH = -1   # a heap entry's block field: the entry stands for a launch's blocks (UseOrder.use)
STALE_SLACK = 4096   # heap entries beyond 4 per believed block before the stale ones are dropped


class UseOrder:
    """The shim's PUMP_ORDER_USED (shim/policy/residency.c, make_room) over the believed blocks: a
    block ranks by the later of its allocation's last use (a launch's number: the shim keeps
    one per allocation, so every block of an allocation a launch is given counts as used by
    it) and the launch whose plan trigger last named it, ties by migration order, oldest
    first.  A heap of (rank, migration, block) with stale entries skipped.

    A launch ranks all its blocks at once, hundreds on a large model, most of which a later
    launch ranks again before any victim search reaches them: so use() pushes one entry for
    the launch (rank, -1, _LAUNCH), which sorts before every block of that rank, and only when a
    search reaches it are the blocks still ranked by that launch pushed, each as its own entry.
    A block pushed so that a plain heap would not have (believed again since, with the same
    rank) equals the entry its add() pushed: a victim leaves the order at its first, and a
    protected block's copies are set aside and given back together."""

    def __init__(self, blocks: int):
        self.used = np.zeros(blocks, np.int64)   # per block: the last launch given its allocation
        self.named = np.zeros(blocks, np.int64)  # per believed block: the last trigger that named it
        self.migrated = [0] * blocks   # per believed block: its place in migration order
        self.members = set()
        self.member = np.zeros(blocks, bool)     # the same, as a mask
        self.heap = []                 # (rank, migrated, block) or (launch, -1, _LAUNCH)
        self.launches = {}             # launch -> the blocks it ranked (an int array)
        self.buried = {}               # a dead tensor's block (segments.py) -> its last use before

    def copy(self):
        """The same order, changed apart from this one from here."""
        other = copy.copy(self)
        other.used, other.named, other.member = self.used.copy(), self.named.copy(), self.member.copy()
        other.migrated, other.members, other.heap = list(self.migrated), set(self.members), list(self.heap)
        other.launches = dict(self.launches)   # its arrays are never changed
        other.buried = dict(self.buried)
        return other

    def _rank(self, b) -> int:
        return int(max(self.used[b], self.named[b]))

    def _push(self, b):
        heapq.heappush(self.heap, (self._rank(b), self.migrated[b], b))

    def add(self, b, migrated):
        self.migrated[b], self.named[b] = migrated, 0
        self.members.add(b)
        self.member[b] = True
        heapq.heappush(self.heap, (self.used.item(b), migrated, b))   # _push: named is 0, used never below

    def remove(self, b):
        self.members.discard(b)
        self.member[b] = False

    def absent(self, blocks: np.ndarray) -> np.ndarray:
        """Those of `blocks` not in the order (not believed resident), in their order: a
        launch names hundreds of blocks, of which a few are missing."""
        return blocks[~self.member[blocks]]

    def use(self, blocks: np.ndarray, launch):
        """Launch number `launch` (later than every launch before it) is given `blocks`."""
        if not len(blocks):
            return
        self.used[blocks] = launch
        self.launches[launch] = blocks
        heapq.heappush(self.heap, (launch, -1, _LAUNCH))
        if len(self.heap) > 4 * len(self.members) + STALE_SLACK:  # drop the stale entries
            self.heap = [(self._rank(b), self.migrated[b], b) for b in self.members]
            heapq.heapify(self.heap)
            self.launches = {}

    def _expand(self, launch):
        """The blocks still ranked by `launch`, believed, pushed each as its own entry."""
        blocks = self.launches.pop(launch, None)
        if blocks is None:   # dropped with the stale entries: its blocks were pushed then
            return
        keep = blocks[self.member[blocks] & (np.maximum(self.used[blocks], self.named[blocks]) == launch)]
        for b in keep.tolist():
            heapq.heappush(self.heap, (launch, self.migrated[b], b))

    def name(self, b, launch):
        self.named[b] = launch
        self._push(b)

    def bury(self, b):
        """b's memory is dead, kept in its segment (segments.py): its last use counts for nothing,
        so it ranks by a plan's naming alone (residency_rank.c, rank_of)."""
        self.buried[b] = max(self.buried.get(b, 0), self.used.item(b))
        self.used[b] = 0
        if self.member[b]:
            self._push(b)

    def is_buried(self, b) -> bool:
        return b in self.buried

    def revive(self, b, migrated):
        """A tensor is placed over b: it ranks by its last use again; `migrated`: its new place in
        migration order, if believed (None: not)."""
        self.used[b] = max(self.used.item(b), self.buried.pop(b))
        if migrated is not None:
            self.migrated[b] = migrated
            self._push(b)

    def first_not_in(self, protect, aside):
        """The least recently used block not in `protect` (left in place), or None; the
        protected ones met on the way go to `aside`, for restore()."""
        heap, used, named, members, migrated_at = self.heap, self.used, self.named, self.members, self.migrated
        while heap:
            rank, migrated, b = heap[0]
            if b == _LAUNCH:
                heapq.heappop(heap)
                self._expand(rank)
                continue
            if b in members and migrated == migrated_at[b]:
                # _rank(b), with max() written out: half a million times a run
                used_at, named_at = used.item(b), named.item(b)
                if rank == (named_at if named_at > used_at else used_at):
                    if b not in protect:
                        return b
                    aside.append(heapq.heappop(heap))
                    continue
            heapq.heappop(heap)   # stale
        return None

    def restore(self, aside):
        for entry in aside:
            heapq.heappush(self.heap, entry)
