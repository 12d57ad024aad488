"""The simulator's TRUTH: which 64 KiB pages are on the GPU, and the UVM driver's GPU fault path
that puts them there, by the rules fakecuda follows (tests/test_simulate_fault_path.py
holds the two equal, rule by rule and on a replayed workload):
- a kernel touches its ranges in order (bench/replay_trace.c's order, workload.touch_order);
  within a range the driver fetches its faults (pages not on the GPU, in address order) in
  batches of `batch_faults` (uvm_perf_fault_batch_count; memory.c, fault_batch), then services
  each VA block of the batch with its fault-time prefetcher (uvm_perf_prefetch.c;
  fault_prefetch.c, prefetch_pages below): never across blocks, off below `min_faults` faults
  in the block, and by the threshold rule.  No trace sets a preferred location, so the advice
  cases (whole block on a first touch to the preferred location; off when it is elsewhere) do
  not arise here;
- a page filled into a block with no chunk on a full GPU first evicts a chunk, then is filled
  (block_populate_pages -> uvm_pmm_gpu_alloc: evict, then fill, one after the other): the
  victim is the first chunk in the driver's list order (devmem.c): wholly discarded full
  blocks, then the USED list in the order chunks were allocated, never moved on access;
- only a full 2 MiB block's chunk moves between lists: a short block (an allocation's last,
  under 2 MiB) keeps its chunk on USED where it was allocated, even when pump moves all its
  pages away (block_mark_memory_used, block_clear_resident_processor in uvm_va_block.c);
  a full block's chunk emptied by pump goes to UNUSED, evicted first at no cost, which here is
  giving it back at once.
Bytes move only for pages that exist (touched or prefetched once); a page never populated is
populated in place on the GPU."""

import collections
import copy
import functools

from pump.simulate import constants as K


@functools.lru_cache(maxsize=1 << 16)
def prefetch_pages(npages: int, counted: int, faulted: int, threshold: int) -> int:
    """The pages (a mask over a block's `npages`) the fault-time prefetcher adds to a batch's
    `faulted` pages, given the `counted` ones (faulted, or already on the GPU): for each faulted
    page, of the power-of-two regions holding it (aligned to their size, clipped to the block:
    uvm_perf_tree_iter_leaf_range) the largest with more than `threshold` percent of its pages
    counted (compute_prefetch_region: the last level that passes wins); once a region reaches
    the block's end the rest are skipped (compute_prefetch_mask).  A faulted page inside a
    region already found gets that region again (the levels above it failed for the page that
    found it and hold this one too), so it is skipped.  The faulted pages are not prefetches."""
    top = 1 << max(npages - 1, 0).bit_length()
    out = left = faulted
    while left:
        i = (left & -left).bit_length() - 1
        first = outer = i
        size = 1
        while size <= top:
            start = i // size * size
            end = min(start + size, npages)
            if ((counted >> start) & ((1 << (end - start)) - 1)).bit_count() * 100 > (end - start) * threshold:
                first, outer = start, end
            size *= 2
        region = ((1 << (outer - first)) - 1) << first
        out |= region
        if outer == npages:
            break
        left &= ~region & ~((1 << (i + 1)) - 1)
    return out & ~faulted


def lowest_pages(mask: int, n: int) -> int:
    """The n lowest set bits of mask."""
    out = 0
    for _ in range(n):
        low = mask & -mask
        out |= low
        mask ^= low
    return out


class GpuTruth:
    """Pages on the GPU and the driver's chunks; counts into `result` (engine.Result):
    bytes_d2h, bytes_discarded, driver_evictions, fault_batches, max_resident."""

    def __init__(self, workload, result, capacity: int, limits_memory: bool, fault_path: "FaultRules"):
        nb = len(workload.block_bytes)
        self.npages = [m.bit_length() for m in workload.block_pages]
        # A block's chunk: 2 MiB, or a short block's pages (devmem.c, chunk_bytes).
        self.size = [n * K.PAGE_BYTES for n in self.npages]
        self.full = [s == K.BLOCK_BYTES for s in self.size]   # a full block's chunk moves between lists
        self.r, self.capacity, self.limits, self.rules = result, capacity, limits_memory, fault_path
        self.res = [0] * nb           # resident page mask per block
        self.clean = [0] * nb         # resident pages discarded (dead): dropped, not copied, when evicted
        self.populated = [0] * nb     # pages that exist (touched or prefetched once)
        self.faults = [0] * nb        # faults to the GPU per block (the prefetcher's min_faults)
        self.chunks = collections.OrderedDict()  # blocks holding a chunk, in the driver's victim order
        self.bytes = 0                # bytes of chunks on the GPU

    def copy(self, result):
        """The same pages and chunks, counting into `result` (engine.Result) from here."""
        other = copy.copy(self)
        other.r = result
        other.res, other.clean, other.populated, other.faults = (list(x) for x in (self.res, self.clean,
                                                                                   self.populated, self.faults))
        other.chunks = collections.OrderedDict(self.chunks)
        return other

    def _release(self, b):
        del self.chunks[b]
        self.bytes -= self.size[b]

    def evict(self, b, by_driver: bool = False) -> int:
        """Block b's resident pages to the host (discarded ones move nothing); returns the
        bytes copied.  pump's eviction leaves a short block's chunk where it was."""
        mask, clean = self.res[b], self.clean[b]
        moved = (mask & ~clean).bit_count() * K.PAGE_BYTES
        self.r.bytes_discarded += (mask & clean).bit_count() * K.PAGE_BYTES
        self.r.bytes_d2h += moved
        self.res[b] = self.clean[b] = 0
        if b in self.chunks and (by_driver or self.full[b]):
            self._release(b)
        return moved

    def free(self, b):
        """The allocation is freed: its pages and chunk go, nothing is copied, and the memory a
        later allocation gets there exists nowhere until touched (the driver's va_block goes
        with the range, its fault counts too)."""
        self.res[b] = self.clean[b] = self.populated[b] = self.faults[b] = 0
        if b in self.chunks:
            self._release(b)

    def discard(self, b, mask):
        """Resident pages of `mask` become clean; a wholly discarded full block ranks first."""
        resident = self.res[b]
        clean = self.clean[b] = self.clean[b] | (mask & resident)
        if resident and not (resident & ~clean) and self.full[b]:
            self.chunks.move_to_end(b, last=False)

    def make_room(self, need: int, keep) -> int:
        """The driver evicts chunks in its order (not `keep`) until `need` more bytes fit;
        returns the bytes copied to the host."""
        moved = 0
        while self.limits and self.bytes + need > self.capacity:
            b = next((x for x in self.chunks if x != keep), None)
            if b is None:
                break
            moved += self.evict(b, by_driver=True)
            self.r.driver_evictions += 1
        return moved

    def arriving(self, b, mask) -> int:
        """The bytes of mask's pages that are not on the GPU yet (a migration's CPU work is
        per page it makes resident, copied or newly populated: fakecuda's fc_bytes_to_move)."""
        return (mask & ~self.res[b]).bit_count() * K.PAGE_BYTES

    def add(self, b, mask) -> int:
        """Pages arrive on the GPU (a chunk allocated for the block first if it has none);
        returns the bytes that moved."""
        new = mask & ~self.res[b]
        if not new:
            return 0
        if b not in self.chunks:
            self.chunks[b] = None
            self.bytes += self.size[b]
        self.res[b] |= new
        self.clean[b] &= ~mask
        moved = (new & self.populated[b]).bit_count() * K.PAGE_BYTES
        self.populated[b] |= mask
        if self.bytes > self.r.max_resident:   # max(), written out: a million times a run
            self.r.max_resident = self.bytes
        return moved

    def kernel(self, ranges):
        """A kernel touches `ranges` (each ((block, page mask), ...) in address order): returns
        (faults, bytes moved by faults, of which by the prefetcher, bytes evicted on the way)."""
        batch, res = self.rules.batch_faults, self.res
        total = [0, 0, 0, 0]
        for spans in ranges:
            pending, nf = {}, 0
            for b, left in spans:   # most of a million spans a run miss nothing
                miss = left & ~res[b]
                while miss:
                    take = miss if miss.bit_count() <= batch - nf else lowest_pages(miss, batch - nf)
                    pending[b] = pending.get(b, 0) | take
                    nf += take.bit_count()
                    left &= ~((1 << take.bit_length()) - 1)  # pages up to the last fetched are done
                    if nf == batch:
                        self._service(pending, total)
                        pending, nf = {}, 0
                    miss = left & ~res[b]
            if nf:
                self._service(pending, total)
        return tuple(total)

    def _service(self, pending, total):
        """One batch: the prefetcher plans every block of it first (from what was resident
        before the batch), then block by block in address order its faulted pages and the
        prefetcher's are filled, each after the evictions that make room for its chunk."""
        self.r.fault_batches += 1
        rules = self.rules
        plan = []
        for b, faulted in sorted(pending.items()):
            self.faults[b] += faulted.bit_count()
            extra = 0
            if rules.prefetch_threshold is not None and self.faults[b] >= rules.prefetch_min_faults:
                extra = prefetch_pages(self.npages[b], faulted | self.res[b], faulted, rules.prefetch_threshold)
                extra &= ~self.res[b]
            plan.append((b, faulted, extra))
        for b, faulted, extra in plan:
            if b not in self.chunks:
                total[3] += self.make_room(self.size[b], b)
            moved = self.add(b, faulted)
            by_prefetch = self.add(b, extra)
            total[0] += faulted.bit_count()
            total[1] += moved + by_prefetch
            total[2] += by_prefetch


FaultRules = collections.namedtuple("FaultRules", "batch_faults prefetch_threshold prefetch_min_faults")
