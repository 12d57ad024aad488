"""Trace files: what pumpd ingested for one job (layout: pump_channel.h).

pump-run opens the file (with the user's own permissions) and hands the open
descriptor to pumpd with the job's registration; pumpd appends one block per
process per ring read.  read() checks everything it reads and names what is
wrong with a corrupt or truncated file.
"""

import os
import time

import numpy as np

from pump import channel

ffi, C = channel.ffi, channel.C
HEADER = "struct pump_trace_header"
BLOCK = "struct pump_trace_block"


class TraceError(Exception):
    """A trace file that cannot be read; str() names the file and what is wrong."""


class TraceWriter:
    def __init__(self, fd: int, job: str, name: str):
        self.file = os.fdopen(fd, "wb", buffering=1 << 20)
        header = ffi.new(HEADER + " *")
        header.magic, header.version = C.PUMP_TRACE_MAGIC, C.PUMP_PROTOCOL_VERSION
        header.record_size = channel.RECORD_SIZE
        header.start_ns = time.monotonic_ns()
        header.job = job.encode()[: len(header.job) - 1]
        header.name = name.encode()[: len(header.name) - 1]
        self.file.write(ffi.buffer(header))

    def write(self, pid: int, records: np.ndarray):
        block = ffi.new(BLOCK + " *")
        block.magic, block.pid, block.records = C.PUMP_TRACE_BLOCK_MAGIC, pid, len(records)
        self.file.write(ffi.buffer(block))
        self.file.write(records.tobytes())

    def close(self):
        self.file.close()


def read(path):
    """(header dict, [(pid, records)]) of a trace file; TraceError if it is bad."""
    try:
        data = open(path, "rb").read()
    except OSError as exc:
        raise TraceError(f"{path}: cannot read: {exc.strerror}") from None
    hsize, bsize = ffi.sizeof(HEADER), ffi.sizeof(BLOCK)
    if len(data) < hsize:
        raise TraceError(f"{path}: truncated: {len(data)} bytes, a trace header is {hsize}")
    buf = ffi.from_buffer(data)  # kept alive while the casts below point into it
    h = ffi.cast(HEADER + " *", buf)
    if h.magic != C.PUMP_TRACE_MAGIC:
        raise TraceError(f"{path}: not a pump trace (magic 0x{h.magic:08x})")
    if h.version != C.PUMP_PROTOCOL_VERSION or h.record_size != channel.RECORD_SIZE:
        raise TraceError(f"{path}: trace version {h.version} with {h.record_size}-byte records; "
                         f"this pump reads version {C.PUMP_PROTOCOL_VERSION}, {channel.RECORD_SIZE}-byte")
    header = {"job": ffi.string(h.job).decode(errors="replace"), "name": ffi.string(h.name).decode(errors="replace"),
              "start_ns": h.start_ns}
    blocks, offset = [], hsize
    while offset < len(data):
        if len(data) - offset < bsize:
            raise TraceError(f"{path}: truncated block header at byte {offset}")
        b = ffi.cast(BLOCK + " *", buf + offset)
        if b.magic != C.PUMP_TRACE_BLOCK_MAGIC:
            raise TraceError(f"{path}: bad block magic 0x{b.magic:08x} at byte {offset}")
        n, pid = b.records, b.pid
        offset += bsize
        if n > (len(data) - offset) // channel.RECORD_SIZE:
            raise TraceError(f"{path}: truncated: block at byte {offset - bsize} promises {n} records")
        blocks.append((pid, np.frombuffer(data, channel.EVENT, n, offset).copy()))
        offset += n * channel.RECORD_SIZE
    return header, blocks
