"""Foresight: the policy that learns a job's iteration and plans ahead (issue 4, item 3).

pumpd runs one Foresight per process on the batches it reads from the ring; the simulator
(pump simulate --policy lookahead) replays the same object on a trace.  What it does:
- learns each launch's key (pump_channel.h), the 2 MiB blocks it needs (those its EXTENT ranges
  touch; the blocks of the allocations its arguments point into where it has none) and its
  time (COST-derived in the simulator, pumpd's measured time per launch otherwise);
- finds the iteration: the period of the launch-key sequence, with a tolerance, so that a short
  last batch, an evaluation step or a changed shape does not derail it (a plan stays until a
  new period is found, or a shorter one the learned one is a multiple of; then it re-learns);
- plans on the learned iteration, taken as a cycle: Belady's MIN (evict what is used again
  furthest in the future) with every block of a launch resident together, under the budget
  less the room transfers in flight need (reserve_bytes(): bandwidth x the longest kernel),
  so that a prefetch rarely waits for the eviction that makes its room; each eviction is
  attached to the last launch that uses the block before its next use (ordered after that
  kernel, as early as it can be), or, where the framework frees the block between that use
  and the prefetch that needs its room, to the launch after the free: the shim discards at
  the free, so the eviction then copies nothing back (issue 28 item 3); and each prefetch
  to the launch after which its room exists, but no further ahead than the time the link needs to refill the whole budget (budget /
  bandwidth, in kernel time: so the lookahead in launches follows from bandwidth and kernel
  times).  The shim finds a trigger by launch key, so evictions and prefetches ride only on
  launches whose key occurs once per iteration (moved to the next such launch);
- per launch key, `need`: the blocks the launch touches, in the order its arguments name
  them (as the launch rule takes them; never address order, so that a plan does not depend on
  where the allocator put things).  The shim prefetches those not believed resident instead
  of the launch rule's whole allocations, and the kernel waits for them only;
- lifetime: a range the framework's allocator took back (BLOCK_FREE) is dead; discard_range()
  gives its part that may be discarded (aligned inward to 2 MiB).  Nothing else is ever
  called dead.  The shim discards at the free itself, in the freeing stream's order (pump's
  allocator, shim/hooks/torch_allocator.c), and `pump simulate` models that: a plan carries no
  discards.
Until an iteration is learned, triggers() is empty: the shim's launch-time rule applies.
"""

import bisect
import collections
import heapq

import numpy as np

from pump import channel
from pump.iteration import DEFAULT_TOLERANCE, MIN_PERIOD, IterationDetector, canonical_start

C = channel.C
BLOCK_SHIFT = 21
BLOCK = 1 << BLOCK_SHIFT          # pump_channel.h's block: residency and plan unit
KEY_CACHE_MAX = 1 << 16           # launch keys whose blocks are kept: a ring can name new keys without end
BANDWIDTH_FACTOR = 1.5            # a measured bandwidth within this factor of the one planned for changes nothing
FREED_CARRIED_MAX = 1 << 16       # blocks freed after a read's last launch kept for the next (a ring may free without launching)
HISTORY_REFS_MAX = 1 << 23        # block references a history holds (each ~40 bytes where not shared)
ITERATION_DIVISORS = 16           # a learned period's divisors tried as a shorter one (_shortest_divisor)
FREED_KEPT_MAX = 1 << 18          # freed blocks the history keeps, the newest (bert-base frees about 19,000 a step)


class Foresight:
    """The lookahead policy; see the module's docstring.

    budget_bytes: the cap on GPU-resident bytes the plan keeps to (set_budget() changes it);
    bandwidth: host<->GPU bytes per second; launch_seconds: mean time of a launch (pumpd
    measures it; set_launch_seconds() updates it), used where observe() gets no per-launch
    times."""

    order = C.PUMP_ORDER_USED

    def __init__(self, budget_bytes: int, bandwidth: float, launch_seconds: float = 10e-6,
                 tolerance: float = DEFAULT_TOLERANCE):
        if budget_bytes <= 0 or bandwidth <= 0 or launch_seconds <= 0:
            raise ValueError("budget_bytes, bandwidth and launch_seconds must be > 0")
        self.budget = int(budget_bytes)
        self.bandwidth = float(bandwidth)
        self.launch_seconds = float(launch_seconds)
        self.detector = IterationDetector(tolerance)
        self.allocations = {}         # base -> size (the job's managed allocations)
        self._bases = []              # sorted bases, for address lookups
        self.block_bytes = {}         # block address -> its bytes (a last block may be partial)
        self.blocks = []              # per launch in history: tuple of the block addresses it needs
        self.freed = []               # per launch in history: the blocks wholly freed just before it
        self._freed_next = ()         # blocks freed after the last launch seen, for the next one
        self._freed_held = collections.deque()  # (launch number, blocks) of each history launch with frees
        self._freed_kept = 0          # blocks in self.freed
        self._freed_base = 0          # the launch number of self.freed[0]
        self._blocks_of_key = {}      # launch key -> its blocks, for launches without extents
        self._cache_refs = 0          # block references the cache's tuples hold
        self.refs_max = HISTORY_REFS_MAX  # block references the history may hold (pumpd sets each
        self.cached_keys_max = KEY_CACHE_MAX  # ... process's share of these three: limit())
        self.freed_kept_max = FREED_KEPT_MAX
        self.refs = np.empty(0, np.int64)  # per launch in history: the block references it holds
        self._refs_held = 0           # their sum
        self.history_trimmed = 0      # launches forgotten early to hold refs_max
        self.need_skipped = 0         # launches whose extents were past refs_max in one batch
        self.seconds = np.empty(0)    # per launch in history: its time
        # (keys, seconds) -> seconds: kernel times known better at a plan than at observe()
        # (pumpd's GPU-timed kernels of a key arrive after its launch was read); None: none.
        self.retime = None
        self.period = 0
        self.learned_at = None        # global launch index at which the first plan was made
        self.schedule_keys = None     # the learned iteration's keys
        self._plan = {}
        self.changed = False

    @property
    def learned(self) -> bool:
        return self.period > 0

    @property
    def lookahead_seconds(self) -> float:
        """How far ahead (in kernel time) the plan prefetches: the time to refill the budget."""
        return self.budget / self.bandwidth

    def set_budget(self, budget_bytes: int):
        """A new budget (the arbiter's): the plan is made again for it."""
        if budget_bytes <= 0:
            raise ValueError(f"budget_bytes {budget_bytes}: allowed > 0")
        if int(budget_bytes) != self.budget:
            self.budget = int(budget_bytes)
            if self.learned:
                self._learn(self.period)

    def set_bandwidth(self, bandwidth: float):
        """The link's rate measured anew (pumpd: the shim's timed prefetches). Within a factor
        of BANDWIDTH_FACTOR of the rate planned for it changes nothing: samples under a budget
        spread widely on fakecuda (15.8 to 37.9 GB/s on its 25 GB/s link, the prefetches
        sharing it with evictions; at a 10% tolerance one bench-steady run planned anew twice
        after learning, 31.7 -> 87.6 -> 31.7 GB/s), a plan made anew costs up to seconds of the
        planner's time, and the launches made while pumpd rewrites the plan go without it.
        Before a plan is made every rate is taken (nothing is planned anew): the first pumpd
        hears are of the job's first, small prefetches (24.4 GB/s where later ones met 20.0 on
        fakecuda), and one held by the factor until the iteration was learned let 288 faults a
        step through a replay's plan against 320 at the later rate
        (tests/test_replay_vs_simulate.py)."""
        if not bandwidth > 0:
            raise ValueError(f"bandwidth {bandwidth}: allowed > 0")
        if not self.learned:
            self.bandwidth = float(bandwidth)
        elif max(bandwidth, self.bandwidth) > BANDWIDTH_FACTOR * min(bandwidth, self.bandwidth):
            self.bandwidth = float(bandwidth)
            self._learn(self.period)

    def set_launch_seconds(self, seconds: float):
        """pumpd's latest mean time per launch, for batches that come without kernel times."""
        if not seconds > 0:
            raise ValueError(f"launch_seconds {seconds}: allowed > 0")
        self.launch_seconds = float(seconds)

    # ---- learning ----
    def observe(self, batch: channel.Batch, kernel_seconds=None, refs_after: int = 0):
        """Learn one batch (channel.decode()); kernel_seconds: per launch, or None. refs_after:
        the block references the batches learned after this one in the same pass may name
        (extent_refs); the history would forget this batch's launches for them, so their needs
        are not made at all (pumpd's planner learns a turn's batches at once)."""
        for base, size in batch.allocs:
            self._add_allocation(base, size)
        n = 0 if batch.launch_function is None else len(batch.launch_function)
        freed = self._freed_per_launch(batch, n)
        if n:
            keys = channel.launch_keys(batch)
            if batch.extents:
                blocks, refs = self._extent_blocks(batch, n, refs_after)
            else:
                blocks, refs = self._key_blocks(batch, keys.tolist())
            self.blocks.extend(blocks)
            self.refs = np.concatenate((self.refs, refs))
            self._refs_held += int(refs.sum())
            self._hold_freed(freed)
            times = (np.full(n, self.launch_seconds) if kernel_seconds is None
                     else np.asarray(kernel_seconds, float))
            self.seconds = np.concatenate((self.seconds, times))
            self._forget_front(self.detector.extend(keys))
            self._hold_refs()
        for base, _size in batch.frees:
            self._drop_allocation(base)
        if n:
            self._maybe_learn(keys)

    def _key_blocks(self, batch, listed) -> tuple:
        """Without extents a launch's blocks follow from its key (the kernel and its
        allocations): pumpd's case, at up to a million launches a second. (blocks per launch,
        block references each holds: a tuple's length where it was made, 1 where shared)."""
        cache = self._blocks_of_key
        first = {}  # each new key's first launch (listed.index per key was quadratic)
        for i, key in enumerate(listed):
            if key not in cache:
                first.setdefault(key, i)
        if len(cache) + len(first) > self.cached_keys_max or self._cache_refs > self.refs_max:
            cache.clear()  # a cache: what pumpd holds for one session stays bounded
            self._cache_refs = 0
            first = {}  # every key of the batch is new now (one cached before would be missing)
            for i, key in enumerate(listed):
                first.setdefault(key, i)
        new = list(first.items())
        skip = self._skipped_for_refs([self._key_block_count(batch, i) for _key, i in new],
                                      self.refs_max - self._cache_refs)
        refs = np.ones(len(listed), np.int64)
        extra = {}  # new keys past the cache's room: this batch's launches share them, the cache keeps none
        room = max(0, self.cached_keys_max - len(cache))
        for key, i in new[skip:]:
            blocks = self._needed_blocks(batch, i)
            refs[i] = max(1, len(blocks))
            if room:
                cache[key] = blocks
                self._cache_refs += len(blocks)
                room -= 1
            else:
                extra[key] = blocks
        if not skip and not extra:
            return list(map(cache.__getitem__, listed)), refs
        skipped = {key for key, _i in new[:skip]}  # not cached: their next launches ask again
        self.need_skipped += sum(key in skipped for key in listed)
        return [cache.get(key) or extra.get(key, ()) for key in listed], refs

    def _key_block_count(self, batch, i) -> int:
        """At most how many blocks launch i's allocations hold (without making them)."""
        return sum(self.allocations.get(base, 0) // BLOCK + 1 for base in batch.launch_bases(i).tolist())

    def _skipped_for_refs(self, counts, room=None) -> int:
        """How many of the first of these launches (each naming at most counts[i] blocks) to
        leave without needs, so that the rest name at most `room` (refs_max): one batch cannot
        make the planner hold more than its cap even for a moment."""
        counts = np.asarray(counts, np.int64)
        room = self.refs_max if room is None else max(0, room)
        if counts.sum() <= room:
            return 0
        return len(counts) - int(np.searchsorted(np.cumsum(counts[::-1]), room, side="right"))

    def extent_refs(self, batch) -> int:
        """At most how many block references a batch's EXTENT ranges name (0 without extents)."""
        if not batch.extents or batch.launch_function is None:
            return 0
        return sum(self._extent_counts(batch, len(batch.launch_function)))

    @staticmethod
    def _extent_counts(batch, n) -> list:
        """Per launch, at most how many blocks its EXTENT ranges name."""
        return [sum(size // BLOCK + 2 for _addr, size, _w in batch.extents.get(i, ()) if size > 0) for i in range(n)]

    def _extent_blocks(self, batch, n, refs_after=0) -> tuple:
        """Each launch's blocks from its EXTENT ranges, and the references each holds. A batch
        whose ranges name more than refs_max blocks, with what later batches of the pass name
        (refs_after), keeps the needs of its last launches only (the others need nothing known:
        counted in need_skipped), so that one batch cannot make the planner hold more than its
        cap even for a moment, nor make needs that the batches after it would trim at once
        (issue 45's attack 2: 948 batches of 69 launches each over 32,768 blocks took a turn
        past its 5 s deadline; computed alone, 352 s)."""
        first = self._skipped_for_refs(self._extent_counts(batch, n), self.refs_max - refs_after)
        self.need_skipped += first
        blocks = [()] * first + [self._needed_blocks(batch, i) for i in range(first, n)]
        return blocks, np.array([max(1, len(b)) for b in blocks], np.int64)

    def _forget_front(self, drop):
        """The oldest `drop` launches leave the history (the detector's keys already have)."""
        if drop:
            del self.blocks[:drop]
            del self.freed[:drop]
            self.seconds = self.seconds[drop:]
            self._refs_held -= int(self.refs[:drop].sum())
            self.refs = self.refs[drop:]
        self._trim_freed(drop)

    def _hold_refs(self):
        """The history's block references within refs_max: past it, the oldest launches are
        forgotten until three quarters of it are held (counted in history_trimmed). A job
        whose iteration needs more than that is not learned; one that repeats a huge
        allocation's every block in each launch (issue 45, attack 2: 2.7 GB of planner in 10 s)
        cannot grow the planner without bound."""
        if self._refs_held <= self.refs_max:
            return
        excess = self._refs_held - self.refs_max * 3 // 4
        drop = min(len(self.refs), int(np.searchsorted(np.cumsum(self.refs), excess, side="left")) + 1)
        self.detector.drop_front(drop)
        self.history_trimmed += drop
        self._forget_front(drop)

    def _freed_blocks(self, addr, size) -> tuple:
        """The 2 MiB blocks wholly inside a framework's free (those the shim discards), within
        the known allocation it falls in (a ring names any range; the planner keeps only the
        blocks of allocations it was given room for), else none. A named tensor's blocks are
        all its own (names.h gives each name blocks of its own): every one dies with it, and its
        eviction after the free moves nothing (no tensor holds the name then)."""
        alloc = self._allocation_of(addr)
        if alloc is None:
            return ()
        end = min(addr + size, alloc[0] + alloc[1])
        if addr >= channel.NAMES_BASE:  # a named tensor's blocks are its own: the partial last one too
            return tuple(range(addr, end, BLOCK))
        dead = discard_range(addr, end - addr)
        return () if dead is None else tuple(range(dead[0], dead[0] + dead[1], BLOCK))

    def _hold_freed(self, freed):
        """Appends a batch's per-launch frees to the history."""
        first = self._freed_base + len(self.freed)
        self.freed.extend(freed)
        for i, blocks in enumerate(freed):
            if blocks:
                self._freed_held.append((first + i, len(blocks)))
                self._freed_kept += len(blocks)

    def _trim_freed(self, drop):
        """After `drop` launches left the history's front: at most freed_kept_max freed blocks
        are kept, the newest (a plan reads the last iteration's)."""
        self._freed_base += drop
        held = self._freed_held
        while held and (held[0][0] < self._freed_base or self._freed_kept > self.freed_kept_max):
            at, count = held.popleft()
            self._freed_kept -= count
            if at >= self._freed_base:
                self.freed[at - self._freed_base] = ()

    def _freed_per_launch(self, batch, n) -> list:
        """Per launch of the batch, the blocks freed just before it; the frees after its last
        launch (all of a batch without launches) are carried to the next batch's first."""
        freed, carried = [()] * n, self._freed_next
        later = ()
        for at, addr, size in batch.block_frees:
            if at < n:
                freed[at] += self._freed_blocks(addr, size)
            else:
                later += self._freed_blocks(addr, size)
        if n:
            freed[0] = carried + freed[0]
        else:
            later = carried + later
        self._freed_next = later[-min(FREED_CARRIED_MAX, self.freed_kept_max):]
        return freed

    def _add_allocation(self, base, size):
        self._blocks_of_key.clear()
        if base not in self.allocations:
            bisect.insort(self._bases, base)
        self.allocations[base] = size
        for b in range(base, base + size, BLOCK):
            self.block_bytes[b] = min(BLOCK, base + size - b)

    def _drop_allocation(self, base):
        self._blocks_of_key.clear()
        if self.allocations.pop(base, None) is not None:
            self._bases.pop(bisect.bisect_left(self._bases, base))

    def _allocation_of(self, address):
        i = bisect.bisect_right(self._bases, address) - 1
        if i >= 0:
            base = self._bases[i]
            if address < base + self.allocations[base]:
                return base, self.allocations[base]
        return None

    def _needed_blocks(self, batch, i) -> tuple:
        """The blocks launch i needs: those its EXTENT ranges touch, where it has them (the
        plan's `need` replaces the launch rule's whole allocations); else the blocks of the
        allocations its arguments point into (all that is known)."""
        found = []
        extents = batch.extents.get(i)
        if extents:
            for addr, size, _written in extents:
                alloc = self._allocation_of(addr)
                if alloc is not None and size > 0:
                    end = min(addr + size, alloc[0] + alloc[1])
                    found.extend(range(addr >> BLOCK_SHIFT << BLOCK_SHIFT, end, BLOCK))
        else:
            for base in batch.launch_bases(i).tolist():
                size = self.allocations.get(base)
                if size:
                    found.extend(range(base, base + size, BLOCK))
        return tuple(dict.fromkeys(found))

    def _maybe_learn(self, keys):
        if self.learned:
            missing = np.count_nonzero(~np.isin(keys, self.schedule_keys))
            if missing <= self.detector.tolerance * len(keys):
                shorter = self._shortest_divisor(self.period)
                if shorter < self.period:
                    self._learn(shorter)
                return
        period = self.detector.detect()
        if not period:
            return
        # The detector anchors on a rare key: one launch that differs every other step made it
        # find two steps, and the step it gave way to next (a plan made anew each time).
        period = self._shortest_divisor(period)
        window = self.detector.keys[-period:]
        if self.learned and period == self.period and \
                np.count_nonzero(window != self.schedule_keys) <= self.detector.tolerance * period:
            return
        self._learn(period)

    def _shortest_divisor(self, p) -> int:
        """The shortest period dividing p (by at most ITERATION_DIVISORS, or the one learned) under
        which the last p keys repeat, else p. A multiple learned once held for good, since each
        later key is in its schedule: the real client's 451-launch step, its tensors placed, was
        learned as 1,353 launches under load (its first steps' keys differed)."""
        history = self.detector.keys
        if len(history) < p:
            return p
        window = history[-p:]
        divisors = {p // k for k in range(2, ITERATION_DIVISORS + 1) if p % k == 0}
        if self.learned and self.period < p and p % self.period == 0:
            divisors.add(self.period)
        for d in sorted(divisors):
            if d >= MIN_PERIOD and np.count_nonzero(window[d:] != window[:-d]) <= self.detector.tolerance * (p - d):
                return d
        return p

    def _learn(self, period):
        start = len(self.blocks) - period
        self.period = period
        self.schedule_keys = self.detector.keys[-period:].copy()
        if self.learned_at is None:
            self.learned_at = self.detector.seen
        # The cycle from its canonical start, wherever it was learned: pumpd reads a ring in
        # pieces and the simulator whole steps, and MIN's ties break by first appearance.
        blocks = self.blocks[start:]
        first = canonical_start(self.schedule_keys, blocks)
        keys = np.roll(self.schedule_keys, -first).tolist()
        blocks = blocks[first:] + blocks[:first]
        freed = self.freed[start:]
        freed = freed[first:] + freed[:first]
        seconds = np.roll(self.seconds[start:], -first)
        if self.retime is not None:
            seconds = self.retime(np.asarray(keys, np.uint64), seconds)
        # The shim knows a launch by its key only: a key met more than once in the iteration
        # (the same kernel on the same allocations, other tensors in them) needs all of them.
        need = {}
        for key, kept in zip(keys, blocks):
            need.setdefault(key, {}).update(dict.fromkeys(kept))
        uses = [tuple(need[key]) for key in keys]
        count = collections.Counter(keys)
        prefetch, evict = plan_cycle(uses, self.block_bytes, seconds, self.budget,
                                     self.lookahead_seconds, self.reserve_bytes(period, seconds),
                                     [count[key] == 1 for key in keys], freed)
        plan = {key: ({}, {}) for key in need}
        for j, key in enumerate(keys):
            plan[key][0].update(dict.fromkeys(prefetch[j]))
            plan[key][1].update(dict.fromkeys(evict[j]))
        self._plan = {k: (self._ranges(need[k]), self._ranges(p), self._ranges(e)) for k, (p, e) in plan.items()}
        self.changed = True

    def reserve_bytes(self, period: int, seconds=None) -> int:
        """Room the plan leaves free for transfers in flight: an eviction starts only when the
        kernel that last used its block ends, and meanwhile the prefetch stream goes on moving
        up to bandwidth x that kernel's time into room the plan already counts as taken; the
        longest kernel of the iteration (seconds: its kernel times as the plan takes them; by
        default the history's last period) bounds it.  Kept under half the budget."""
        if seconds is None:
            seconds = self.seconds[-period:] if period else ()
        longest = float(np.max(seconds)) if len(seconds) else 0.0
        return min(int(self.bandwidth * longest), self.budget // 2)

    def _ranges(self, blocks) -> list:
        """Block addresses -> (address, bytes) ranges, in the order given (the shim takes a
        launch's `need` and a trigger's prefetches in that order, up to the first that does
        not fit), each block joined to the range before it when it follows it in the same
        allocation (the shim refuses a range that crosses allocations), or in the name space,
        where two names are a free block apart (shim/lookup/names.h): a named tensor dead when
        the plan is made is one range still, not one a block (a GPT-2's 393-block logits took
        393 of the 128 need ranges the shim carries).  The order never depends on where the
        allocator put things: plans made on a trace and on its replay at other addresses then
        agree."""
        out, owner = [], None
        for b in blocks:
            size = self.block_bytes.get(b, BLOCK)
            alloc = self._allocation_of(b) if b < channel.NAMES_BASE else channel.NAMES_BASE
            if out and alloc is not None and alloc == owner and out[-1][0] + out[-1][1] == b:
                out[-1] = (out[-1][0], out[-1][1] + size)
            else:
                out.append((b, size))
            owner = alloc
        return out

    # ---- output ----
    def triggers(self) -> dict:
        """{launch key: (need, prefetch, evict)}, each a list of (address, bytes) ranges, for
        pump.channel.Plan.publish(): at a launch with this key the shim prefetches the `need`
        ranges not believed resident (the kernel waits for those only), then after the kernel
        evicts `evict` and prefetches `prefetch` for the launches to come."""
        self.changed = False
        return self._plan


def discard_range(address: int, size: int):
    """The part of a dead range that may be discarded: aligned inward to 2 MiB, or None."""
    lo = -(-address // BLOCK) * BLOCK
    hi = (address + size) // BLOCK * BLOCK
    return (lo, hi - lo) if hi > lo else None


def plan_cycle(uses, block_bytes, seconds, budget, horizon_seconds, reserve=0, anchors=None, freed=None):
    """Belady's MIN on one learned iteration taken as a cycle, turned into prefetches ahead.

    uses[j]: the blocks launch j needs; seconds[j]: its time.  MIN, run on the budget less
    `reserve` (room kept for transfers in flight), decides at each use of a block not resident
    which blocks to evict (those used again furthest in the future; among those used again
    at the same launch, the one that first appears earliest in `uses`, never by address; first of
    all a named tensor's block freed since its last use: its memory went to other tensors, which
    MIN counts as blocks of their own, and its next use is its name's next tensor, whose data
    never came from it; a block of an address keeps its next use: the next tensor there is in it,
    and a discarded block brought back is copied).  A dead name gets no eviction (its free made
    the room; no tensor holds the name for the shim to move) and its next use no prefetch ahead
    (the shim would find no tensor holding it before the next one is made, by its kernels).
    Each eviction is planned
    after the victim's last use before that point (or, freed[j] naming the blocks the framework
    frees just before launch j, after the first free between that use and the anchor before
    the one needing room: a discarded block's eviction copies nothing), and the block's
    prefetch after the latest of those evictions (the room exists from then on), but no earlier than `horizon_seconds`
    of kernel time before its use.  anchors[j] (default: all) says whether launch j may carry
    evictions and prefetches: the shim finds a trigger by launch key, so a key met twice in an
    iteration would run them twice; plans move them to the next anchor.  Returns, per position
    j, the blocks to prefetch and the blocks to evict after launch j.  The cycle is played
    twice and the second pass is the plan, so that it starts from the steady state."""
    period = len(uses)
    budget = budget - reserve
    span = 3 * period
    rank = {}                        # block -> its first appearance: MIN's tie-break
    for blocks in uses:
        for b in blocks:
            rank.setdefault(b, len(rank))
    size = {b: block_bytes.get(b, BLOCK) for b in rank}   # looked up 100,000s of times a plan
    next_use, seen, never = {}, {}, float("inf")
    for pos in range(span - 1, -1, -1):
        for b in uses[pos % period]:
            next_use[pos, b] = seen.get(b, never)
            seen[b] = pos
    anchor_at = [span] * (span + 1)  # the first anchor at or after each position
    for pos in range(span - 1, -1, -1):
        anchor_at[pos] = pos if anchors is None or anchors[pos % period] else anchor_at[pos + 1]
    clock = np.concatenate(([0.0], np.cumsum(np.tile(np.asarray(seconds, float), 2))))
    frees = collections.defaultdict(list)  # block -> the positions it is freed just before
    for pos in range(span if freed is not None else 0):
        for b in freed[pos % period]:
            frees[b].append(pos)

    def first_free(v):
        """The position of the first free of v since its last use (None: none)."""
        dead = frees.get(v)
        i = bisect.bisect_right(dead, last_use[v]) if dead and v in last_use else None
        return dead[i] if i is not None and i < len(dead) else None

    def freed_before(v, need_pos):
        """The anchor after the first free of v since its last use, when it comes before
        need_pos; else None."""
        at = first_free(v)
        return anchor_at[at] if at is not None and anchor_at[at] < need_pos else None

    resident, used_bytes = {}, 0     # block -> its next use
    heap = []                        # (-next use, rank, block); stale entries skipped
    last_use = {}                    # block -> position of its last use
    room_from = 0                    # position of the latest planned eviction
    prefetch = [[] for _ in range(period)]
    evict = [[] for _ in range(period)]
    for pos in range(2 * period):
        record = pos >= period
        for b in freed[pos % period] if freed is not None else ():
            if b >= channel.NAMES_BASE and b in resident:  # a named tensor died: MIN's first victim
                resident[b] = never
                heapq.heappush(heap, (-never, rank[b], b))
        # The earliest trigger whose kernel ends within the horizon of this launch's start.
        earliest = int(np.searchsorted(clock, clock[pos] - horizon_seconds, side="left")) - 1
        for b in uses[pos % period]:
            if b in resident or size[b] > budget:
                continue
            victims, free = [], budget - used_bytes
            while free < size[b]:
                while heap and resident.get(heap[0][2]) != -heap[0][0]:
                    heapq.heappop(heap)
                if not heap or -heap[0][0] <= pos:
                    break
                v = heapq.heappop(heap)[2]
                victims.append(v)
                free += size[v]
            if free < size[b]:          # only blocks of this launch are left: it faults
                for v in victims:
                    heapq.heappush(heap, (-resident[v], rank[v], v))
                continue
            for v in victims:
                del resident[v]
                used_bytes -= size[v]
                freed_at = freed_before(v, pos)
                at = anchor_at[last_use[v]] if freed_at is None else freed_at
                room_from = max(room_from, at)
                if record and not (freed_at is not None and v >= channel.NAMES_BASE):
                    evict[at % period].append(v)  # a dead name's free made its room: no tensor holds it
            resident[b] = pos
            used_bytes += size[b]
            at = anchor_at[max(earliest, room_from, 0)]
            died = first_free(b) if b >= channel.NAMES_BASE else None
            born = died is not None and died <= pos
            if record and at < pos and not born:  # a name's next tensor: made by its kernels, not moved
                prefetch[at % period].append(b)
        for b in uses[pos % period]:
            if b in resident:
                resident[b] = next_use[pos, b]
                heapq.heappush(heap, (-resident[b], rank[b], b))
            last_use[b] = pos
    return prefetch, evict
