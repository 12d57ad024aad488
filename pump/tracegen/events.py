"""The records of a generated trace, encoded as the shim encodes its own
(pump_channel.h; FUNCTION/NAME as shim/channel/channel.c writes them): one process's
event stream, built in memory and written as one trace block."""

import time

import numpy as np

from pump import channel, trace

C = channel.C
K = channel.KIND
NAME_FIRST_BYTES, NAME_MORE_BYTES = 32, 40   # name bytes in a FUNCTION record, in each NAME record
BASES_INLINE, BASES_PER_MORE = 3, 5
STREAM = 1                                   # every launch goes to one stream
DEVICE = 0
TIME_STEP_NS = 1000                          # records are spaced this far apart in time


def _words(data: bytes, n: int) -> list:
    """``data`` as ``n`` little-endian 64-bit words, zero-padded."""
    return np.frombuffer(data.ljust(8 * n, b"\0"), "<u8").tolist()


class EventStream:
    """Records in order; seq and time_ns are set from their position when written."""

    def __init__(self):
        self.rows = []                # (kind, count, arg0..arg4)
        self.function_ids = {}        # kernel name -> function id
        self.launches = 0

    def _add(self, kind: int, count: int, *args: int):
        self.rows.append((kind, count, *args, *(0,) * (5 - len(args))))

    def function(self, name: str) -> int:
        """The function id of kernel ``name``, announcing it (FUNCTION + NAME) the first time."""
        fid = self.function_ids.get(name)
        if fid is None:
            fid = 0x10000 + 16 * (len(self.function_ids) + 1)
            self.function_ids[name] = fid
            data = name.encode()[: C.PUMP_FUNCTION_NAME_MAX]
            self._add(K["function"], len(data), fid, *_words(data[:NAME_FIRST_BYTES], 4))
            for at in range(NAME_FIRST_BYTES, len(data), NAME_MORE_BYTES):
                part = data[at:at + NAME_MORE_BYTES]
                self._add(K["name"], len(part), *_words(part, 5))
        return fid

    def alloc(self, base: int, size: int):
        self._add(K["alloc"], 0, base, size, 1)   # 1: CU_MEM_ATTACH_GLOBAL

    def block_alloc(self, address: int, nbytes: int):
        self._add(K["block_alloc"], 0, address, nbytes)

    def block_free(self, address: int, nbytes: int):
        self._add(K["block_free"], 0, address, nbytes)

    def step(self, index: int):
        self._add(K["step"], 0, index)

    def launch(self, name: str, bases: list, extents: list, flops: int, nbytes: int):
        """A kernel launch: ``bases`` the segments it touches (at most LAUNCH_BASES_MAX),
        ``extents`` its exact (address, bytes, written) ranges, then its cost."""
        assert 0 < len(bases) <= channel.LAUNCH_BASES_MAX and extents
        fid = self.function(name)
        self._add(K["launch"], len(bases), fid, STREAM, *bases[:BASES_INLINE])
        for at in range(BASES_INLINE, len(bases), BASES_PER_MORE):
            part = bases[at:at + BASES_PER_MORE]
            self._add(K["launch_more"], len(part), *part)
        for at in range(0, len(extents), 2):
            pair = extents[at:at + 2]
            written = sum(1 << i for i, (_, _, w) in enumerate(pair) if w)
            flat = [v for address, size, _ in pair for v in (address, size)]
            self._add(K["extent"], len(pair), *flat, *(0,) * (4 - len(flat)), written)
        self._add(K["cost"], 0, flops, nbytes, 0)
        self.launches += 1

    def records(self, time_base_ns: int = 0) -> np.ndarray:
        out = np.zeros(len(self.rows), channel.EVENT)
        if not self.rows:
            return out
        table = np.array(self.rows, dtype=np.uint64)
        position = np.arange(1, len(self.rows) + 1, dtype=np.uint64)
        out["seq"] = position
        out["kind"] = table[:, 0]
        out["count"] = table[:, 1]
        out["device"] = DEVICE
        out["time_ns"] = time_base_ns + position * TIME_STEP_NS
        out["arg"] = table[:, 2:]
        return out

    def write(self, fd: int, job: str, name: str):
        """Write the stream as a trace file to ``fd`` (closed after): one block, pid 0."""
        writer = trace.TraceWriter(fd, job, name)
        try:
            # Times start after the header's start_ns, so readers show them from 0 ms on.
            writer.write(0, self.records(time.monotonic_ns()))
        finally:
            writer.close()
