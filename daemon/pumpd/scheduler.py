"""Fair ingest: pumpd reads rings and plans in slices of a few milliseconds, shared
between users, so that no user's rings hold the event loop.

Any process can keep its ring full of valid records, and each record costs pumpd time
(copy, decode, tables, the lookahead planner) on the one event loop that also answers
every user's requests and feeds systemd's watchdog. So:

- Ring reading runs in slices of at most SLICE_SECONDS; between slices the loop serves
  whatever else waits (requests, accepts, the watchdog).  A ring is read in chunks sized
  to take about CHUNK_SECONDS (measured per session), never parting a launch from the
  records that extend it (channel.Ring.read).
- Slices are shared between owners (a job's uid) by deficit round-robin on the time
  spent: an owner with work gets QUANTUM_SECONDS of credit at its turn, spends it on
  its sessions in turn, and one that overran (a chunk dearer than its credit) waits
  until its turns have paid the debt back.  K processes of one user get one user's
  share, not K shares.
- The lookahead planner's work (learning an iteration and planning it: up to seconds
  for a long one) runs in the planner's own process (pumpd/planner.py), one batch at a
  time, sent and awaited by its own thread; its CPU time is charged to its owner,
  and the session's ring is not read meanwhile.  On a thread of pumpd's process that
  work held the GIL, and so the loop, for up to seconds on a busy 2-core machine.
- Nothing here runs inside a request: `end` and the liveness check wait for a
  process's ring to be read (:meth:`Scheduler.drain`) instead of reading it themselves.
"""

import asyncio
import collections
import sys
import time

from pumpd.planner import Planner

SLICE_SECONDS = 0.004     # the most one slice holds the loop (a chunk may overrun it)
QUANTUM_SECONDS = 0.002   # an owner's credit per turn
CHUNK_SECONDS = 0.001     # what a chunk of one ring should cost
CHUNK_MIN = 256           # records per chunk, at the dearest ...
CHUNK_MAX = 1 << 16       # ... and at the cheapest (a whole default ring)
GIL_SWITCH_SECONDS = 0.001  # pumpd's other threads (/proc reads, traces) hand the loop the GIL this often (5 ms default)
DRAIN_POLL = 0.005        # seconds between looks while waiting for a ring to be read


class Scheduler:
    """Deficit round-robin over owners; ``host`` (the Daemon) does the work:
    ``read_chunk(job, session, limit) -> (records, batch)``, ``plan_due(job, session)``,
    ``publish_plan(job, session)`` and ``planned(job, session)``."""

    def __init__(self, host, errors):
        self.host, self.errors = host, errors
        self.credit = {}                  # owner -> seconds of credit (negative: a debt)
        self.turns = collections.deque()  # owners with work, in round order
        self.cursor = collections.Counter()  # owner -> which of its sessions goes first
        self.planner = Planner()          # the lookahead planner's process and thread
        sys.setswitchinterval(GIL_SWITCH_SECONDS)
        self.planning = None              # the planner's batch in flight
        self.spent = collections.Counter()  # owner -> seconds of loop and planner time
        self.fill = 0.0                   # the largest share of a ring one chunk read
        self.backlog = False              # work was left when the last slice ended

    def _runnable(self, jobs) -> dict:
        """owner -> deque of (job, session) with work now."""
        ready = {}
        for job in list(jobs):
            for session in list(job.sessions.values()):
                if session.planning or session.closed:
                    continue
                planner = session.lookahead
                records = int(session.ring.header.head) != session.ring.tail
                if planner is not None and (records or planner.pending):
                    if self.planning is not None:
                        continue  # its batch would wait for the planner thread
                elif not records and not self.host.plan_due(job, session):
                    continue
                ready.setdefault(job.uid, []).append((job, session))
        for owner, work in ready.items():
            turn = self.cursor[owner] % len(work)
            ready[owner] = collections.deque(work[turn:] + work[:turn])
            self.cursor[owner] += 1
        return ready

    def run_slice(self, jobs) -> int:
        """One slice of at most about SLICE_SECONDS; the records read."""
        start = time.perf_counter()
        ready = self._runnable(jobs)
        waiting = set(self.turns)
        self.turns.extend(owner for owner in ready if owner not in waiting)
        total, self.fill = 0, 0.0
        while self.turns and time.perf_counter() - start < SLICE_SECONDS:
            owner = self.turns[0]
            queue = ready.get(owner)
            if not queue:  # nothing left to do: it leaves the round, keeping a debt
                self.turns.popleft()
                credit = self.credit.pop(owner, 0.0)
                if credit < 0:
                    self.credit[owner] = credit
                continue
            if self.credit.get(owner, 0.0) <= 0:
                self.credit[owner] = self.credit.get(owner, 0.0) + QUANTUM_SECONDS
                self.turns.rotate(-1)
                continue
            job, session = queue.popleft()
            began = time.perf_counter()
            records, more = self._serve(owner, job, session)
            cost = time.perf_counter() - began
            self.credit[owner] -= cost
            self.spent[owner] += cost
            total += records
            self.fill = max(self.fill, records / session.ring.capacity)
            if more:
                queue.append((job, session))
        self.backlog = any(ready.get(owner) for owner in self.turns)
        return total

    def _serve(self, owner, job, session) -> tuple:
        """One chunk of one session's work: (records read, more left to read)."""
        planner = session.lookahead
        if planner is not None and self.planning is not None:  # its batch would wait for the thread
            if self.host.plan_due(job, session):
                self.host.publish_plan(job, session)
            return 0, False
        records, batch = 0, None
        if int(session.ring.header.head) != session.ring.tail:
            began = time.perf_counter()
            records, batch = self.host.read_chunk(job, session, session.chunk or CHUNK_MIN)
            if records:
                per_record = max(time.perf_counter() - began, 1e-6) / records
                session.chunk = max(CHUNK_MIN, min(CHUNK_MAX, int(CHUNK_SECONDS / per_record)))
        if session.closed:
            return records, False
        if planner is not None and (records or planner.pending):
            self._plan(owner, job, session, batch if records else None)
            return records, False
        if self.host.plan_due(job, session):
            self.host.publish_plan(job, session)
        return records, records > 0 and int(session.ring.header.head) != session.ring.tail

    def _plan(self, owner, job, session, batch):
        """The planner's process learns the batch; the session's ring waits until it has."""
        planner = session.lookahead

        def done(future):
            self.planning = None
            session.planning = False
            if future.cancelled():
                return
            failed = future.exception()  # retrieved, or asyncio logs it when the future goes
            if self.planner.stopped:  # at pumpd's stop its process ends: nothing to report
                return
            if failed is not None:
                self.errors.error("lookahead planner", failed)  # a planner bug ends no task
                return
            planned = future.result()
            self.credit[owner] = self.credit.get(owner, 0.0) - planned.cost
            self.spent[owner] += planned.cost
            planner.learned(planned)
            if not session.closed:
                self.host.planned(job, session)

        session.planning = True
        self.planning = asyncio.wrap_future(self.planner.submit(planner, batch))
        self.planning.add_done_callback(done)

    async def drain(self, sessions, timeout: float) -> bool:
        """Wait until what each session's ring holds now has been read and planned (or
        the session closed); False if that took over ``timeout`` seconds."""
        targets = [(s, int(s.ring.header.head)) for s in sessions if not s.closed]
        deadline = time.monotonic() + timeout
        while any(not s.closed and (s.ring.tail < head or s.planning) for s, head in targets):
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(DRAIN_POLL)
        return True

    def flush(self, jobs, seconds: float):
        """At pumpd's stop: what the rings hold still reaches traces (no planning), for at
        most ``seconds``."""
        deadline = time.monotonic() + seconds
        for job in list(jobs):
            for session in list(job.sessions.values()):
                while not session.closed and time.monotonic() < deadline:
                    if not self.host.read_chunk(job, session, CHUNK_MAX)[0]:
                        break

    def stop(self):
        self.planner.stop()
