"""A Python stand-in for the shim's side of the channels, for testing pumpd alone.

It attaches over the socket like libpump, maps the ring and plan pumpd hands
back, and writes records the way the shim does (reserve, fill, publish seq
last).  One producer thread; the real shim's many-thread path is tested with
the real shim.
"""

import mmap
import os
import time
import socket

import numpy as np

from pump import channel, protocol


class FakeShim:
    def __init__(self, path: str, job: str = "", name: str = "fake", policy: str = "launch"):
        self.client = protocol.Client(path)
        self.reply = self.client.request({"op": "attach", "job": job, "name": name, "policy": policy})
        self.ring_fd, self.plan_fd = self.client.received_fds
        size = os.fstat(self.ring_fd).st_size
        self.ring_mm = mmap.mmap(self.ring_fd, size)
        self.header = channel.ffi.cast(channel.RING_HEADER + " *", channel.ffi.from_buffer(self.ring_mm))
        self.capacity = self.header.capacity
        self.records = np.frombuffer(self.ring_mm, channel.EVENT, self.capacity, channel.HEADER_SIZE)
        self.plan_mm = mmap.mmap(self.plan_fd, channel.PLAN_SIZE, mmap.MAP_SHARED, mmap.PROT_READ)
        for offset in range(0, channel.PLAN_SIZE, mmap.PAGESIZE):  # as the shim makes the plan's pages
            self.plan_mm[offset]
        self.plan = channel.ffi.cast("struct pump_plan *", channel.ffi.from_buffer(self.plan_mm))

    @property
    def job(self) -> str:
        return self.reply["job"]

    def emit(self, kind: str, *args, count: int = 0, device: int = 0) -> bool:
        """Write one record; False (and dropped counted) if the ring is full."""
        head = self.header.head
        if head + 1 - self.header.tail > self.capacity:
            self.header.dropped += 1
            return False
        rec = self.records[head % self.capacity]
        rec["kind"], rec["count"], rec["device"] = channel.KIND[kind], count, device
        rec["time_ns"] = time.monotonic_ns()
        rec["arg"] = list(args) + [0] * (5 - len(args))
        self.header.head = head + 1
        rec["seq"] = head + 1
        self.header.written += 1
        return True

    def emit_many(self, records: np.ndarray) -> int:
        """Write prepared records (EVENT dtype) in bulk; returns how many fit."""
        head, n = self.header.head, len(records)
        n = min(n, self.capacity - (head - self.header.tail))
        if n <= 0:
            self.header.dropped += len(records)
            return 0
        pos = np.arange(head, head + n, dtype=np.uint64)
        batch = records[:n].copy()
        batch["seq"] = pos + 1
        self.records[pos % self.capacity] = batch
        self.header.head = head + n
        self.header.written += n
        self.header.dropped += len(records) - n
        return n

    def launch(self, function: int, *bases, stream: int = 0):
        more = list(bases[3:])
        self.emit("launch", function, stream, *bases[:3], count=len(bases))
        while more:
            self.emit("launch_more", *more[:5], count=len(more[:5]))
            more = more[5:]

    def plan_triggers(self) -> dict:
        """{launch key: (need, prefetch, evict)}, each a list of (address, bytes)."""
        p = self.plan
        out = {}
        for slot in range(channel.PLAN_SLOTS):
            t = p.trigger[slot]
            if t.key:
                ranges = [(p.range[t.first + i].address, p.range[t.first + i].bytes)
                          for i in range(t.need + t.prefetch + t.evict)]
                out[t.key] = (ranges[:t.need], ranges[t.need:t.need + t.prefetch], ranges[t.need + t.prefetch:])
        return out

    def close(self):
        self.header = self.plan = None
        self.records = None
        self.ring_mm.close()
        self.plan_mm.close()
        os.close(self.ring_fd)
        os.close(self.plan_fd)
        self.client.close()


def launch_records(functions, bases_per_launch: int = 2) -> np.ndarray:
    """LAUNCH records for a sequence of function ids, each naming bases derived from it."""
    recs = np.zeros(len(functions), channel.EVENT)
    recs["kind"] = channel.KIND["launch"]
    recs["count"] = bases_per_launch
    f = np.asarray(functions, dtype=np.uint64)
    recs["arg"][:, 0] = f
    for i in range(min(bases_per_launch, 3)):
        recs["arg"][:, 2 + i] = (f << np.uint64(24)) + np.uint64(i << 21)
    return recs


def raw_connect(path: str) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(5)
    s.connect(path)
    return s
