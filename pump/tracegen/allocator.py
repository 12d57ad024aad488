"""A model of PyTorch's CUDA caching allocator (c10/cuda/CUDACachingAllocator.cpp,
native backend, default settings, one stream), so that generated traces reuse freed
memory at the addresses PyTorch would.

The rules modelled, as the source has them:
  - a request is rounded up to a multiple of 512 bytes (kMinBlockSize; at least 512);
  - rounded requests of at most 1 MiB (kSmallSize) are served from the small pool, the
    rest from the large pool; a block never moves between pools;
  - the free block chosen is the smallest that fits, ties broken by the lower address
    (the pool is a set ordered by (stream, size, address); lower_bound);
  - with no block that fits, a new segment is allocated: 2 MiB (kSmallBuffer) for the
    small pool; 20 MiB (kLargeBuffer) for requests under 10 MiB (kMinLargeAlloc);
    otherwise the request rounded up to 2 MiB (kRoundLarge);
  - a block is split, the front handed out and the rest returned to the pool, when
    what remains is at least 512 bytes (small pool) or more than 1 MiB (large pool);
  - a freed block merges with its free neighbours in the same segment;
  - segments are never given back (no empty_cache, no out-of-memory retry: the model
    has as much memory as the program asks for).
Segment bases are 2 MiB aligned and laid out one after the other, as cuMemAllocManaged
gives them.
"""

import bisect
import dataclasses

MIN_BLOCK = 512                 # kMinBlockSize
SMALL_REQUEST_MAX = 1 << 20     # kSmallSize
SMALL_SEGMENT = 2 << 20         # kSmallBuffer
LARGE_SEGMENT = 20 << 20        # kLargeBuffer
LARGE_REQUEST_MIN = 10 << 20    # kMinLargeAlloc: from here a request gets a segment of its own size
LARGE_ROUNDING = 2 << 20        # kRoundLarge
SEGMENT_ALIGNMENT = 2 << 20     # cuMemAllocManaged's alignment
FIRST_SEGMENT = 0x7f0000000000  # where the modelled address space starts (2 MiB aligned)


def round_request(nbytes: int) -> int:
    """The block size a request of ``nbytes`` asks the pool for."""
    return max(MIN_BLOCK, -(-nbytes // MIN_BLOCK) * MIN_BLOCK)


def segment_size(rounded: int) -> int:
    """The size of the segment allocated for a rounded request no free block fits."""
    if rounded <= SMALL_REQUEST_MAX:
        return SMALL_SEGMENT
    if rounded < LARGE_REQUEST_MIN:
        return LARGE_SEGMENT
    return -(-rounded // LARGE_ROUNDING) * LARGE_ROUNDING


@dataclasses.dataclass(eq=False)
class Block:
    address: int
    size: int
    segment: int                # base of the segment holding it
    small: bool                 # which pool it belongs to
    allocated: bool = False
    prev: "Block" = None        # neighbours in the same segment
    next: "Block" = None


class CachingAllocator:
    """malloc() and free() as PyTorch's caching allocator serves them."""

    def __init__(self, first_segment: int = FIRST_SEGMENT):
        assert first_segment % SEGMENT_ALIGNMENT == 0
        self.next_segment = first_segment
        self.segments = {}           # base -> size, in the order they were made
        self.free_blocks = {True: [], False: []}   # small? -> sorted [(size, address)]
        self.blocks = {}             # address -> Block, every block of every segment
        self.allocated_bytes = 0     # in blocks handed out
        self.peak_allocated_bytes = 0

    @property
    def reserved_bytes(self) -> int:
        return sum(self.segments.values())

    def malloc(self, nbytes: int):
        """(block address, block size, new segment (base, size) or None) for ``nbytes`` > 0."""
        if nbytes <= 0:
            raise ValueError(f"malloc of {nbytes} bytes: the allocator serves positive sizes only")
        rounded = round_request(nbytes)
        small = rounded <= SMALL_REQUEST_MAX
        pool = self.free_blocks[small]
        i = bisect.bisect_left(pool, (rounded, 0))
        segment = None
        if i < len(pool):
            block = self.blocks[pool.pop(i)[1]]
        else:
            size = segment_size(rounded)
            base = self.next_segment
            self.next_segment += -(-size // SEGMENT_ALIGNMENT) * SEGMENT_ALIGNMENT
            self.segments[base] = size
            block = Block(base, size, base, small)
            self.blocks[base] = block
            segment = (base, size)
        remaining = block.size - rounded
        if remaining >= MIN_BLOCK if small else remaining > SMALL_REQUEST_MAX:
            rest = Block(block.address + rounded, remaining, block.segment, small, prev=block, next=block.next)
            if block.next is not None:
                block.next.prev = rest
            block.next = rest
            block.size = rounded
            self.blocks[rest.address] = rest
            bisect.insort(pool, (rest.size, rest.address))
        block.allocated = True
        self.allocated_bytes += block.size
        self.peak_allocated_bytes = max(self.peak_allocated_bytes, self.allocated_bytes)
        return block.address, block.size, segment

    def free(self, address: int) -> int:
        """Take back the block at ``address``; returns its size (what was handed out)."""
        block = self.blocks.get(address)
        if block is None or not block.allocated:
            raise ValueError(f"free of 0x{address:x}: not a block the allocator handed out")
        freed = block.size
        block.allocated = False
        self.allocated_bytes -= freed
        pool = self.free_blocks[block.small]
        for neighbour in (block.prev, block.next):
            if neighbour is not None and not neighbour.allocated:
                pool.pop(bisect.bisect_left(pool, (neighbour.size, neighbour.address)))
                del self.blocks[max(block.address, neighbour.address)]
                if neighbour is block.prev:
                    neighbour.size += block.size
                    neighbour.next = block.next
                    if block.next is not None:
                        block.next.prev = neighbour
                    block = neighbour
                else:
                    block.size += neighbour.size
                    block.next = neighbour.next
                    if neighbour.next is not None:
                        neighbour.next.prev = block
        bisect.insort(pool, (block.size, block.address))
        return freed
