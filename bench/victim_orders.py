"""victim_orders.py: which blocks a launch rule evicts, replayed on a real-client recording
(scripts/bench-victim-orders; issue 41 item 2): how many bytes each victim order moves, against
the bound's, with nothing else in the way.

The model, on bench/real_client_budget.py's steady window of a recording (its 2 MiB blocks, its
overwrites): each launch's blocks are resident together while it runs (pump's launch rule); a
block not resident is fetched, but at an overwrite (its old value dead there) it costs nothing;
room is made by evicting blocks the launch does not use, in the order's turn, until its blocks
fit the capacity; an evicted block whose value is needed later (its next use not an
overwrite) is copied out, a dead one is dropped free (discarded). The window is played from
empty, then 16 times more, counted, per step. Orders:

  lru             least recently used first (pump's launch rule where no plan is in force,
                  PUMP_ORDER_USED, less its ranking of freed tensors: residency_rank.h)
  lru_dead_first  the same, with the blocks whose old value is dead first
  min             the block whose next use is furthest first, dead ones first (Belady's MIN
                  with each launch's blocks held together: foresight of the whole step)

No timing, no driver, no pump: what the order alone costs. What pump adds or loses beside it
(dead blocks known only once freed and discarded only once the GPU has passed their frees,
faults, plans) is the distance from its measured bytes."""
import heapq

import real_client_budget as budget
from pump.simulate import bound

ORDERS = ("lru", "lru_dead_first", "min")
# Played from empty; all but the first counted: as many as the bound's MIN plays (its bound is
# on any policy's bytes over that many iterations, from whatever the GPU held).
CYCLES = bound.CYCLES + 1


def replay(window, capacity, order):
    """(bytes in, bytes out) per step of `order` on a steady_window at `capacity` bytes."""
    if order not in ORDERS:
        raise ValueError(f"order {order!r}: allowed: {', '.join(ORDERS)}")
    touched, block_bytes, step_bounds, overwritten = window[:4]
    slots = capacity // budget.BLOCK
    launches = [[b for b, _ in launch] for launch in touched]
    length, steps = len(launches), len(step_bounds) - 1
    following = bound.next_uses(launches)
    dead_at = {(pos, b) for pos in range(length) for b in overwritten[pos]}

    def dead(b, upcoming):
        """Whether b's old value is dead until its next use, at `upcoming` (an overwrite)."""
        return (upcoming % length, b) in dead_at

    def turn(b, last, upcoming):
        if order == "lru":
            return last
        return (not dead(b, upcoming), last if order == "lru_dead_first" else -upcoming)

    resident = {}                     # block -> its next use, positions over all cycles
    heap = []                         # (turn, its use, block): stale where the block was used since
    used_at = {}
    fetched = copied = 0

    def evict(count, keep):
        nonlocal copied
        aside = []
        while count and heap:
            entry = heapq.heappop(heap)
            _, at, b = entry
            if b not in resident or used_at[b] != at:
                continue
            if b in keep:
                aside.append(entry)
                continue
            if not dead(b, resident[b]):
                copied += int(block_bytes[b])
            del resident[b]
            count -= 1
        for entry in aside:
            heapq.heappush(heap, entry)

    for cycle in range(CYCLES):
        if cycle == 1:
            fetched = copied = 0      # the cold cycle is not counted
        for j, blocks in enumerate(launches):
            pos = cycle * length + j
            # A launch the room cannot hold streams through it, a block at a time (it faults).
            groups = [blocks] if len(blocks) <= slots else [[b] for b in blocks]
            for group in groups:
                need = [b for b in group if b not in resident]
                if len(resident) + len(need) > slots:
                    evict(len(resident) + len(need) - slots, set(group))
                for b in group:
                    if b not in resident and (j, b) not in dead_at:
                        fetched += int(block_bytes[b])
                    resident[b] = cycle * length + following[j, b]
                    used_at[b] = pos
                    heapq.heappush(heap, (turn(b, pos, resident[b]), pos, b))
    played = (CYCLES - 1) * steps
    return fetched / played, copied / played
