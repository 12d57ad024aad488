"""The lower bound `pump simulate` measures every policy against, for one steady step at a
capacity C:

    lower bound = max(compute time, B / bandwidth_in, W / line rate)        full duplex
    lower bound = max(compute time, B / bandwidth_in + W / line rate)       half duplex

- compute time: the step's kernel times summed (kernels run one after another on the GPU; the
  ideal policy's step takes at least this).
- B, the host->GPU bytes that must move per steady step: the bytes Belady's MIN fetches per
  iteration when the learned iteration (the trace's last `period` launches, else its last step)
  repeats for ever, in 2 MiB blocks, over the blocks the kernels actually touch (EXTENT ranges;
  whole allocations where a launch has none), with room for floor(C / 2 MiB) blocks; divided by
  the steps the iteration holds.
- W, the GPU->host bytes that must move per steady step: max(0, D_live - C), D_live the most
  bytes live at once across a cut of the iteration: pages written in it (EXTENT ranges marked
  written) whose next access after the cut is a read (live_written_bytes).
- bandwidth_in: explicit migrations host->GPU; the line rate: the fastest GPU->host copy in the
  model (the driver's evictions; pump's run at or below it).

Why no policy moves fewer bytes host->GPU:
- MIN (evict the block whose next use is furthest; Belady 1966, proved optimal for uniform
  pages by Mattson, Gecsei, Slutz and Traiger 1970) makes the fewest fetches of any
  demand-paging policy on a reference string.
- A prefetching policy does no better: delay each prefetch to the reference that needs the
  block, and drop it if the block is never used while resident; the result is a
  demand-paging schedule with no more fetches, using no more memory at any time (the usual
  conversion argument; see Cao, Felten, Karlin and Li, SIGMETRICS 1995).
- Steady state: any N iterations of a policy, from whatever the GPU held before them, fetch at
  least MIN_cold(N) - C bytes, MIN_cold(N) being MIN's bytes from an empty GPU (fetching what
  the GPU held first turns them into a schedule from empty).  So every policy's long-run
  bytes per iteration are at least (MIN_cold(N) - C) / N, for every N; the bound takes
  N = CYCLES.  (MIN's count per iteration need not settle to one value: on a loop larger than
  memory it alternates.)
- The kernels of one launch touching blocks at the same time only make it harder, so treating
  each launch's blocks as one after another keeps it a lower bound.

Why no policy moves fewer bytes GPU->host (W):
- A kernel writes a page on the GPU, so after the write the only current copy is there.  Take
  a cut t between two launches and the pages written in the iteration before t whose next
  access after t is a read (neither a write, which may overwrite it, nor a free, after which
  it is dead): each is needed after t, so at t it is either on the GPU or was copied back after
  its write.  At most C bytes are on the GPU at t, so at least D_live(t) - C bytes were copied
  back between the writes and t, inside the iteration ending at t; the cuts t + i x period of
  successive iterations count disjoint copies.  Dead data (freed, or next overwritten) can be
  discarded and needs none.  MIN's victims being dirty or not does not enter: a policy that
  evicts clean blocks first writes back less than MIN would ("MIN's fetches plus the blocks MIN
  evicts dirty" is not a bound; minimising both together is NP-hard in general), but never less
  than W.  The UVM driver does not track dirtiness: it copies back every resident page it
  evicts (only unused and discarded ones are dropped), so its own GPU->host bytes are its
  evicted bytes, at least W.
- Both bounds hold at once, so a step moves at least B in and W out.  On a full-duplex link
  they overlap (the larger time counts); on a half-duplex one a copy in waits for a copy out
  (constants.py, RANGE_CASES), so their times add.  The model charges faults on the kernel,
  not on the link: fault-driven bytes (slower than explicit ones, 64 KiB per FAULT_SERVICE_S)
  are counted as if they crossed the link at bandwidth_in.
- Without EXTENT records nothing is known written: W is 0 there (a bound still, a weaker one).
- tests/test_bound_exhaustive.py holds both parts against every demand-paging schedule
  (each choice of victim, dirty or clean) on small loops, where they are met.
The model behind this bound moves and keeps memory in whole 2 MiB blocks, as the budget is
counted (shim/policy/residency.c). A policy moving only the 64 KiB pages a kernel touches could
move less where a block is touched in part. In the four bench traces, the touched pages are
over 99% of the touched blocks' bytes.

Beside it, not a bound on every policy: the bytes MIN moves when each launch's blocks must be
resident together (whole_launch_must_move_bytes), as they are for a policy that prefetches a
kernel's blocks before it runs (pump's launch and lookahead).  A kernel that faults can stream
through more memory than it holds; the optimizer's multi-tensor kernels touch up to 3 GB each.

Beside those, for the same policies (each launch's blocks resident while its kernel runs): the
chain bound (whole_launch_chain_seconds), which counts when bytes must move, not only how many.
When kernel e starts, the GPU holds e's blocks W_e and at most C - |W_e| bytes of others; so of
the blocks D that kernels e+1 .. k-1 touch, at least |D - W_e| - (C - |W_e|) bytes cross the link
after kernel e starts and before kernel k starts.  Kernels run one after another, so one
iteration lasts at least max(compute(e .. k-1), those bytes / bandwidth) + compute(k .. e+period-1),
for every e and k (cyclically).  It exceeds the bytes bound where an iteration's traffic bunches
up behind a stretch of compute that holds the memory: ViT-B/16's forward pass needs 4.9 GiB
across the link between its optimizer step and its launch 220.

A caching allocator's segments (segments.py) leave the bound as it is: a tensor's FREE kills
its pages whether its memory stays in its segment or not ("carve" and "tensor_free" count as
frees), since what must move is the data's, and a dead tensor's data needs no copy (a policy
that discards it, PUMP_TORCH_DISCARDS, moves none of it).  The bound stays the lower bound with
dead memory free; what the policies that keep dead memory move for it (evicted stale, brought
back stale for the next tensor there) is their cost, in their distance from the bound.

The old, weaker figure is kept next to it: the touched bytes beyond capacity (T - C), since at
most C of a step's T touched bytes can be on the GPU when it starts.  Training touches
weights and activations forward and again backward, in reverse order. Under that mirror-order
reuse, MIN fetches nearly the whole footprint each step at half capacity, about twice T - C.
"""

import heapq

import numpy as np

from pump.simulate import constants as K
from pump.simulate import engine

# Cycles MIN is played for: the bound (MIN(N) - C) / N comes within (first cycle's excess) / N
# of MIN's steady count; 16 puts it within 0.5% on the four bench traces, in about a second.
CYCLES = 16


def next_uses(launches) -> dict:
    """(position, block) -> the position of the block's next use after it, `launches` (tuples of
    block ids) repeated: past the last position where the next use is in the next round."""
    length = len(launches)
    following, later = {}, {}
    for pos in range(2 * length - 1, -1, -1):
        for b in launches[pos % length]:
            if pos < length:
                following[pos, b] = later[b]
            later[b] = pos
    return following


def min_fetches(launches, block_bytes, slots: int, cycles: int = CYCLES, creations=frozenset()):
    """(fetches, bytes) of Belady's MIN from an empty GPU on `launches` (tuples of block ids,
    each launch's blocks resident together) repeated `cycles` times, with room for `slots`
    blocks.  One block per tuple: plain MIN.

    `creations`: the (position, block) uses that overwrite the block whole (what it held before
    is dead there): such a use fetches nothing, and until it the block's old value is needed by
    no one, so MIN drops it first.  Taking each creation for a new block, whose first use is
    free, this is MIN on those blocks: the fewest fetches of a policy that discards dead data
    (tests/test_bound_exhaustive.py).

    What MIN does next depends on what it holds and each held block's next use alone (the
    heap's stale entries are of uses already past, below every live one), so once a cycle
    begins where an earlier one began (the same blocks, their next uses a whole number of
    cycles on), the cycles between repeat for ever: the rest are counted from them, not
    played.  tests/test_simulate_speed.py holds this to playing all of them."""
    length = len(launches)
    dead = length * (cycles + 2)              # past every real next use: a dead block goes first
    # (position, block) -> distance to its next use, cyclic
    gap = {(pos, b): after - pos + (dead if (after % length, b) in creations else 0)
           for (pos, b), after in next_uses(launches).items()}
    resident, heap = {}, []                   # block -> its next use; (-next use, block)
    fetches = nbytes = 0
    began = {}                                # a cycle's starting state -> that cycle
    counts = []                               # per cycle played: (fetches, bytes) before it
    for cycle in range(cycles):
        state = frozenset((b, use - cycle * length) for b, use in resident.items())
        if state in began:
            first = began[state]
            loops, rest = divmod(cycles - cycle, cycle - first)   # of the repeating cycles, to come
            (f0, b0), (f_rest, b_rest) = counts[first], counts[first + rest]
            return (fetches + loops * (fetches - f0) + f_rest - f0,
                    nbytes + loops * (nbytes - b0) + b_rest - b0)
        began[state] = cycle
        counts.append((fetches, nbytes))
        for j, blocks in enumerate(launches):
            pos = cycle * length + j
            for b in blocks:
                if b in resident:
                    continue
                if (j, b) not in creations:
                    fetches += 1
                    nbytes += int(block_bytes[b])
                while len(resident) >= slots and heap:
                    far, victim = heapq.heappop(heap)
                    if -far <= pos:           # all in use by this launch: over capacity
                        heapq.heappush(heap, (far, victim))
                        break
                    if resident.get(victim) == -far:
                        del resident[victim]
                resident[b] = pos
            for b in blocks:
                resident[b] = pos + gap[j, b]
                heapq.heappush(heap, (-resident[b], b))
    return fetches, nbytes


def steady_bytes_per_cycle(launches, block_bytes, slots: int, cycles: int = CYCLES, creations=frozenset()) -> float:
    """A lower bound on the host->GPU bytes per cycle of any policy running `launches` for ever
    with room for `slots` blocks: (MIN's bytes over `cycles` cycles from empty - the room) /
    cycles (see the module's docstring; `creations` as min_fetches takes them)."""
    _, nbytes = min_fetches(launches, block_bytes, slots, cycles, creations)
    return max(0.0, (nbytes - slots * K.BLOCK_BYTES) / cycles)


def chain_seconds(launches, block_bytes, seconds, capacity: int, bandwidth: float) -> float:
    """The chain bound on one iteration of `launches` (tuples of block ids, repeated for ever;
    seconds: per launch) with `capacity` bytes of room (see the module's docstring).  For each e,
    arriving[p] holds the bytes of the blocks, not e's own, first touched after e at launch p;
    moving e on changes only the entries of the blocks of launches e and e + 1."""
    length = len(launches)
    size = np.asarray(block_bytes).tolist().__getitem__   # plain ints: half a million look-ups
    clock = np.concatenate(([0.0], np.cumsum(np.tile(np.asarray(seconds, float), 2))))
    next_use, later = {}, {}
    for pos in range(2 * length - 1, -1, -1):
        for b in launches[pos % length]:
            next_use[pos, b] = later.get(b)
            later[b] = pos
    own = set(launches[0])
    arriving = np.zeros(2 * length + 1)
    for b, pos in later.items():
        if b not in own:
            arriving[pos] += size(b)
    best = 0.0
    for e in range(length):
        # k = e+1 .. e+length: the bytes first touched by launches e+1 .. k-1
        touched = np.concatenate(([0.0], np.cumsum(arriving[e + 1:e + length])))
        moved = np.maximum(0.0, touched - (capacity - sum(size(b) for b in own)))
        k = np.arange(e + 1, e + length + 1)
        span = np.maximum(clock[k] - clock[e], moved / bandwidth) + (clock[e + length] - clock[k])
        best = max(best, float(span.max()))
        following = set(launches[(e + 1) % length])
        for b in following - own:        # first touched at e + 1, now e + 1's own
            arriving[e + 1] -= size(b)
        for b in own - following:        # no longer own: first touched at its next use
            arriving[next_use[e, b]] += size(b)
        own = following
    return best


READ, WRITE, KILL = 0, 1, 2


def _accesses(workload, lo: int, hi: int):
    """Every page access of launches lo..hi-1 as arrays, in program order (a launch's frees
    before its kernel's touches): (page number, position in the iteration, READ/WRITE/KILL)."""
    written = workload.written or [()] * workload.launches
    blocks, masks, where, kinds = [], [], [], []
    for k in range(lo, hi):
        pos = k - lo
        for what, addr, size in workload.events.get(k, ()):
            if what in ("free", "block_free", "carve", "tensor_free"):   # dead from here: no write-back needed
                for b, mask in workload.page_masks(addr, size):
                    blocks.append(b), masks.append(mask), where.append(pos), kinds.append(KILL)
        writes = dict(written[k])
        for b, mask in workload.touched[k]:
            w = writes.get(b, 0) & mask
            for part, kind in ((w, WRITE), (mask & ~w, READ)):   # a page is one or the other
                if part:
                    blocks.append(b), masks.append(part), where.append(pos), kinds.append(kind)
    # Each mask's pages, lowest first, one row per access.
    bit = np.arange(K.PAGES_PER_BLOCK, dtype=np.uint64)
    entry, page = np.nonzero((np.asarray(masks, np.uint64)[:, None] >> bit) & np.uint64(1))
    pages = np.asarray(blocks, np.int64)[entry] * K.PAGES_PER_BLOCK + page
    return pages, np.asarray(where, np.int64)[entry], np.asarray(kinds, np.int8)[entry]


def live_written_bytes(workload, lo: int, hi: int) -> int:
    """D_live of the iteration of launches lo..hi-1 repeated for ever (see the module's
    docstring): the most bytes, over the cuts between its launches, of pages written in the
    iteration whose next access after the cut is a read."""
    profile = live_written_profile(workload, lo, hi)
    return int(profile.max()) if len(profile) else 0


def live_written_profile(workload, lo: int, hi: int):
    """Per cut before launch lo + i of the iteration lo..hi-1 repeated for ever, the bytes of
    pages written in the iteration whose next access after the cut is a read (an array of
    hi - lo; empty where nothing is touched).  A page's write at launch w followed
    by reads only, up to its last read r before the next write or free, is live at the cuts
    w+1 .. r (cyclically).  Vectorised over the pages' access sequences (a 26 GiB model's
    iteration holds millions of page accesses): tests/test_simulate_speed.py holds it equal to
    the page-by-page walk."""
    length = hi - lo
    pages, where, kinds = _accesses(workload, lo, hi)
    n = len(pages)
    if not n:
        return np.zeros(0, dtype=np.int64)
    order = np.argsort(pages, kind="stable")      # each page's accesses together, in program order
    pages, where, kinds = pages[order], where[order], kinds[order]
    index = np.arange(n)
    first = np.flatnonzero(np.r_[True, pages[1:] != pages[:-1]])
    count = np.diff(np.r_[first, n])
    begin, end = np.repeat(first, count), np.repeat(first + count, count)   # each access's page's sequence
    # The next access that is not a read, at or after each index (n past the last).
    not_read = np.where(kinds != READ, index, n)
    next_not_read = np.minimum.accumulate(not_read[::-1])[::-1]
    following = np.r_[next_not_read[1:], n]       # strictly after each index
    wrapped = following >= end                     # none left in the sequence: round to its start
    stop = np.where(wrapped, next_not_read[begin], following)   # the write itself at the latest
    writes = np.flatnonzero(kinds == WRITE)
    wrapped, stop = wrapped[writes], stop[writes]
    # The access before `stop`, cyclically: the sequence's last where the stop is its first.
    last = np.where(wrapped & (stop == begin[writes]), end[writes] - 1, stop - 1)
    reads = np.where(wrapped, (end[writes] - writes - 1) + (stop - begin[writes]), stop - writes - 1)
    live = reads > 0
    writes, last = writes[live], last[live]
    # Past the sequence's end, the read is in the next round of the iteration.
    last_pos = where[last] + np.where(last < writes, length, 0)
    diff = np.bincount(where[writes] + 1, minlength=2 * length + 1)[:2 * length + 1] \
        - np.bincount(last_pos + 1, minlength=2 * length + 1)[:2 * length + 1]
    live_pages = np.cumsum(diff)[:2 * length]
    return (live_pages[:length] + live_pages[length:]) * K.PAGE_BYTES


def _cycle(workload):
    """(first launch, end launch, steps it holds) of the iteration the bound repeats."""
    bounds = engine._step_bounds(workload)
    last_lo, last_hi = bounds[engine.steady_steps(workload)[-1]]
    period = workload.period
    if 0 < period <= last_hi:
        return last_hi - period, last_hi, max(1, round(period / (last_hi - last_lo)))
    return last_lo, last_hi, 1


def _capacity_free(workload) -> dict:
    """The iteration, its launches' blocks, D_live and the touched bytes: what no capacity and no
    rate changes, computed once per workload (a sweep asks at a dozen capacities)."""
    known = workload.__dict__.get("_bound_capacity_free")
    if known is not None:
        return known
    lo, hi, steps = _cycle(workload)
    weak = []
    bounds = engine._step_bounds(workload)
    for s in engine.steady_steps(workload):
        slo, shi = bounds[s]
        pages = {}
        for k in range(slo, shi):
            for b, mask in workload.touched[k]:
                pages[b] = pages.get(b, 0) | mask
        weak.append(sum(m.bit_count() for m in pages.values()) * K.PAGE_BYTES)
    known = workload.__dict__["_bound_capacity_free"] = {
        "cycle": (lo, hi, steps), "launches": [tuple(b for b, _mask in workload.touched[k]) for k in range(lo, hi)],
        "live": live_written_bytes(workload, lo, hi), "touched": float(np.median(weak))}
    return known


def _bytes(workload, capacity: int) -> dict:
    """The bound's byte counts, which no rate changes: computed once per workload and capacity
    (a run over the range of rates, or a plot's capacities, asks again with other rates)."""
    cache = workload.__dict__.setdefault("_bound_bytes", {})
    if capacity in cache:
        return cache[capacity]
    free = _capacity_free(workload)
    launches, steps = free["launches"], free["cycle"][2]
    slots = capacity // K.BLOCK_BYTES
    must = steady_bytes_per_cycle([(b,) for blocks in launches for b in blocks], workload.block_bytes,
                                  slots) / steps
    together = steady_bytes_per_cycle(launches, workload.block_bytes, slots) / steps
    cache[capacity] = dict(free, must=must, together=together)
    return cache[capacity]


def lower_bound(workload, capacity: int, model: engine.Model) -> dict:
    """The bound for one steady step (see the module's docstring), and its parts."""
    kernel_s = workload.kernel_seconds(model.gpu)
    b = _bytes(workload, capacity)
    (lo, hi, steps), must, live, touched = b["cycle"], b["must"], b["live"], b["touched"]
    compute = float(kernel_s[lo:hi].sum()) / steps
    chain = chain_seconds(b["launches"], workload.block_bytes, kernel_s[lo:hi], capacity, model.bandwidth) / steps
    write_back = max(0, live - capacity) / steps
    fetch_s, write_s = must / model.bandwidth, write_back / model.link_out
    link_s = max(fetch_s, write_s) if model.full_duplex else fetch_s + write_s
    beyond = max(0.0, touched - capacity)
    return {"compute_seconds": compute, "touched_bytes": int(touched),
            "must_move_bytes": int(must), "whole_launch_must_move_bytes": int(b["together"]),
            "live_written_bytes": live, "must_write_back_bytes": int(write_back),
            "whole_launch_chain_seconds": chain,
            "lower_bound_seconds": max(compute, link_s),
            "touched_beyond_capacity_bytes": int(beyond),
            "weak_lower_bound_seconds": max(compute, beyond / model.bandwidth)}
