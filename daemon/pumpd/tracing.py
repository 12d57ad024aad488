"""Jobs' trace files, written off pumpd's event loop.

A trace descriptor comes from a client, so it is hostile: a pipe nobody reads
blocks a write forever, a closed pipe or a full disk fails it, and a regular file
on FUSE or NFS can block too.  pumpd therefore takes only regular files opened
for writing, and never writes on its event loop: the loop hands each block to the
trace's bounded queue (what does not fit is counted as dropped, never waited
for), and a small fixed pool of threads writes the queues out with unbuffered
os.write calls.  Nothing is buffered inside pumpd beyond the queue, so a block
the loop read reaches the file within one write, even if pumpd is then killed.

A failure (an error from the file, or a write outstanding past WRITE_TIMEOUT)
ends that one trace: it is closed, the failure is logged once and kept as the
trace's `problem`, which `pump status` and the job's `end` reply carry to
pump-run.  Nothing else stops.
"""

import collections
import errno
import fcntl
import logging
import os
import stat
import threading
import time

from pump import trace

log = logging.getLogger("pumpd")

WRITERS = 2                   # threads writing every job's traces
QUEUE_BYTES_MAX = 32 << 20    # a trace's blocks waiting to be written; past it blocks are dropped
QUEUE_BYTES_PER_UID_MAX = 64 << 20  # all of one user's traces together (a user's files can all hang)
QUEUE_BYTES_ALL_MAX = 256 << 20     # every user's: within the service's MemoryMax (limits.memory_at_most counts it)
WRITE_TIMEOUT = 10.0          # seconds one write may take before its trace is given up
STUCK_WRITERS_MAX = 8         # writers replaced after a stuck write; past it, no more threads


class TraceRefused(ValueError):
    """A descriptor pumpd will not write a trace to; str() says why."""


def check_descriptor(fd: int):
    """Refuse anything but a regular file open for writing."""
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        raise TraceRefused("the trace descriptor is not a regular file")
    if fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE not in (os.O_WRONLY, os.O_RDWR):
        raise TraceRefused("the trace descriptor is not open for writing")


class Trace:
    """One job's trace: a queue of encoded blocks and the file they go to."""

    def __init__(self, fd: int, job: str, name: str, uid: int, pool: "WriterPool"):
        check_descriptor(fd)
        self.fd, self.uid, self.pool = fd, uid, pool
        self.queue = collections.deque()
        self.queued_bytes = 0
        self.records_written = 0     # records in blocks that reached the file
        self.records_dropped = 0     # ... that did not: queue full, or the trace failed
        self.problem = None          # why the trace ended early, for its job
        self.closing = False
        self.busy_since = None       # when a writer took this trace's current write
        self.scheduled = False       # in the pool's pending queue (guarded by the pool's lock)
        self.lock = threading.Lock()
        if not self._put(trace.header_bytes(job, name), 0):
            self.fail("pumpd holds the most unwritten trace data it takes from this user")

    def write(self, pid: int, records):
        """Queue one block (never blocks)."""
        self._put(trace.block_bytes(pid, records), len(records))

    def _put(self, data: bytes, records: int) -> bool:
        """Queue data, or count its records as dropped: past the trace's queue, past its
        user's share of every trace's queues, or once the trace has ended."""
        with self.lock:
            if self.problem is not None or self.closing:
                self.records_dropped += records
                return False
            if self.queued_bytes + len(data) > QUEUE_BYTES_MAX or not self.pool.reserve(self.uid, len(data)):
                self.records_dropped += records
                return False
            self.queue.append((data, records))
            self.queued_bytes += len(data)
        self.pool.wake(self)
        return True

    def close(self):
        """No more blocks: the file is closed once the queue is written."""
        with self.lock:
            self.closing = True
        self.pool.wake(self)

    def fail(self, problem: str):
        with self.lock:
            if self.problem is not None:
                return
            self.problem = problem
            self.records_dropped += sum(n for _, n in self.queue)
            self.queue.clear()
            self.pool.release(self.uid, self.queued_bytes)
            self.queued_bytes = 0
        log.warning("trace of a job given up: %s", problem)
        self.pool.wake(self)

    def has_work(self) -> bool:
        with self.lock:
            return self.problem is None and bool(self.queue)

    def done(self) -> bool:
        with self.lock:
            return (self.closing or self.problem is not None) and not self.queue and self.busy_since is None

    def status(self) -> dict:
        with self.lock:
            return {"records_written": self.records_written, "records_dropped": self.records_dropped,
                    "problem": self.problem}

    # ---- the writer threads' side ----
    def _take(self):
        with self.lock:
            if self.problem is not None or not self.queue or self.busy_since is not None:
                return None
            self.busy_since = time.monotonic()
            return self.queue[0]

    def _written(self, records: int, error):
        with self.lock:
            self.busy_since = None
            if self.problem is not None:  # given up while this write hung
                return
            data, _ = self.queue.popleft()
            self.queued_bytes -= len(data)
            self.pool.release(self.uid, len(data))
            if error is None:
                self.records_written += records
            else:
                self.records_dropped += records
        if error is not None:
            self.fail(error)


def _write_all(fd: int, data: bytes):
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


class WriterPool:
    """WRITERS threads writing whatever trace has blocks queued."""

    def __init__(self):
        self.traces = set()
        self.ready = threading.Condition()
        self.pending = collections.deque()
        self.stopping = False
        self.stuck = 0
        self.bytes_lock = threading.Lock()
        self.queued = {}             # uid -> bytes queued in its traces
        self.queued_all = 0
        self.writing = {}            # uid -> writers busy with its traces (at most 1 but while closing)
        self.threads = [self._start() for _ in range(WRITERS)]

    def _start(self):
        t = threading.Thread(target=self._work, name="pumpd-trace", daemon=True)
        t.start()
        return t

    def open(self, fd: int, job: str, name: str, uid: int) -> Trace:
        t = Trace(fd, job, name, uid, self)
        with self.ready:
            self.traces.add(t)
        return t

    def reserve(self, uid: int, n: int) -> bool:
        """Whether uid's traces may queue n more bytes (taken if so)."""
        with self.bytes_lock:
            mine = self.queued.get(uid, 0)
            if mine + n > QUEUE_BYTES_PER_UID_MAX or self.queued_all + n > QUEUE_BYTES_ALL_MAX:
                return False
            self.queued[uid] = mine + n
            self.queued_all += n
            return True

    def release(self, uid: int, n: int):
        with self.bytes_lock:
            left = self.queued.get(uid, 0) - n
            if left > 0:
                self.queued[uid] = left
            else:
                self.queued.pop(uid, None)
            self.queued_all -= n

    def wake(self, t: Trace):
        with self.ready:
            if not t.scheduled:
                t.scheduled = True
                self.pending.append(t)
                self.ready.notify()

    def _work(self):
        while True:
            with self.ready:
                t = self._next()
                while t is None and not self.stopping:
                    self.ready.wait()
                    t = self._next()
                if t is None:
                    return
                t.scheduled = False  # a block queued from now on schedules it again
                self.writing[t.uid] = self.writing.get(t.uid, 0) + 1
            try:
                self._serve(t)
            finally:
                with self.ready:
                    if self.writing[t.uid] == 1:
                        del self.writing[t.uid]
                    else:
                        self.writing[t.uid] -= 1
                    self.ready.notify_all()

    def _next(self):
        """The first pending trace a writer may take (under self.ready): one whose user
        has no write in progress, so a user whose files hang holds one writer at most,
        or one with nothing left to write (a trace to close)."""
        for t in self.pending:
            if t.uid not in self.writing or not t.has_work():
                self.pending.remove(t)
                return t
        return None

    def _serve(self, t: Trace):
        while True:
            item = t._take()
            if item is None:
                break
            data, records = item
            try:
                _write_all(t.fd, data)
                error = None
            except OSError as exc:
                error = f"writing it failed: {os.strerror(exc.errno) if exc.errno else exc}"
                if exc.errno == errno.ENOSPC:
                    error = "the file system is full"
            t._written(records, error)
        if t.done():
            self._finish(t)

    def _finish(self, t: Trace):
        with self.ready:
            if t not in self.traces:
                return
            self.traces.discard(t)
        try:
            os.close(t.fd)
        except OSError:
            pass

    def check_timeouts(self):
        """From the event loop: give up traces whose write hangs (FUSE, NFS), and the
        other traces of its user, which could only wait behind it; put a new writer in
        place of each thread that hangs, up to STUCK_WRITERS_MAX."""
        now = time.monotonic()
        with self.ready:
            traces = list(self.traces)
        hung = {t for t in traces if t.busy_since is not None and now - t.busy_since > WRITE_TIMEOUT}
        for t in hung:
            if t.problem is None:
                t.fail(f"a write took over {WRITE_TIMEOUT:g} s")
                if self.stuck < STUCK_WRITERS_MAX:
                    self.stuck += 1
                    self.threads.append(self._start())
        hung_uids = {t.uid for t in hung}
        for t in traces:
            if t.uid in hung_uids and t not in hung and t.problem is None:
                t.fail(f"a write to another trace of this user took over {WRITE_TIMEOUT:g} s")

    def stop(self, timeout: float = 5.0):
        """Write out what is queued (within timeout), then end the threads."""
        deadline = time.monotonic() + timeout
        with self.ready:
            traces = list(self.traces)
        for t in traces:
            t.close()
        while any(not t.done() for t in traces) and time.monotonic() < deadline:
            time.sleep(0.01)
        with self.ready:
            self.stopping = True
            self.ready.notify_all()
