"""Fair ingest: pumpd reads rings and plans in slices of a few milliseconds, shared
between users, so that no user's rings hold the event loop.

Any process can keep its ring full of valid records, and each record costs pumpd time
(copy, decode, tables) on the one event loop that also answers every user's requests
and feeds systemd's watchdog. So:

- Ring reading runs in slices of at most SLICE_SECONDS; between slices the loop serves
  whatever else waits (requests, accepts, the watchdog).  A ring is read in chunks sized
  to take about CHUNK_SECONDS (measured per session), never parting a launch from the
  records that extend it (channel.Ring.read).
- Slices are shared between owners (a job's uid) by deficit round-robin on the time
  spent: an owner with work gets QUANTUM_SECONDS of credit at its turn, spends it on
  its sessions in turn, and one that overran (a chunk dearer than its credit) waits
  until its turns have paid the debt back.  K processes of one user get one user's
  share, not K shares.
- Rings are read whatever the planner does (issue 45 item 1): a lookahead session's
  batches wait for its next planning turn in its backlog (pumpd/backlog.py, bounded), so
  its trace and tables are whole and its ring is never left to fill.
- The lookahead planner's work (learning an iteration and planning it: up to seconds
  for a long one) runs in the planner's own process (pumpd/planner.py), one session's
  turn at a time.  Turns go to owners by deficit round-robin on the planner's CPU time
  (PLAN_QUANTUM_SECONDS), so one user's dear plans delay another's by at most one turn.
  A turn has a CPU deadline (limits.PLAN_DEADLINE_SECONDS): one that meets it leaves
  the published plan in force and the process waits twice as long for each overrun
  (PLAN_BACKOFF_SECONDS, doubling); after limits.PLAN_OVERRUNS_MAX of them the process
  falls back to the shim's launch rule, said in `pump status` and pump-run's end line.
- Nothing here runs inside a request: `end` and the liveness check wait for a
  process's ring to be read (:meth:`Scheduler.drain`) instead of reading it themselves.
"""

import asyncio
import collections
import sys
import time

from pump import channel
from pumpd import limits
from pumpd.planner import Planner

SLICE_SECONDS = 0.004     # the most one slice holds the loop (a chunk may overrun it)
QUANTUM_SECONDS = 0.002   # an owner's credit per turn
CHUNK_SECONDS = 0.001     # what a chunk of one ring should cost
CHUNK_MIN = 256           # records per chunk, at the dearest ...
CHUNK_MAX = 1 << 16       # ... and at the cheapest (a whole default ring)
GIL_SWITCH_SECONDS = 0.001  # pumpd's other threads (/proc reads, traces) hand the loop the GIL this often (5 ms default)
DRAIN_POLL = 0.005        # seconds between looks while waiting for a ring to be read
PLAN_QUANTUM_SECONDS = 0.05  # an owner's credit of planner time per turn of the planner's round
PLAN_BACKOFF_SECONDS = 1.0   # a process's wait for its next turn after its first overrun (doubling)


class Scheduler:
    """Deficit round-robin over owners; ``host`` (the Daemon) does the work:
    ``read_chunk(job, session, limit) -> records read``, ``plan_due(job, session)``,
    ``publish_plan(job, session)`` and ``planned(job, session)``."""

    def __init__(self, host, errors):
        self.host, self.errors = host, errors
        self.credit = {}                  # owner -> seconds of credit (negative: a debt)
        self.turns = collections.deque()  # owners with work, in round order
        self.cursor = collections.Counter()  # owner -> which of its sessions goes first
        self.planner = Planner()          # the lookahead planner's process and thread
        sys.setswitchinterval(GIL_SWITCH_SECONDS)
        self.planning = None              # the planner's turn in flight
        self.plan_credit = {}             # owner -> planner seconds of credit (negative: a debt)
        self.plan_turns = collections.deque()  # owners waiting for the planner, in round order
        self.plan_cursor = collections.Counter()  # owner -> which of its sessions plans next
        self.overruns = collections.Counter()  # owner -> planning turns that met their deadline
        self.spent = collections.Counter()  # owner -> seconds of loop and planner time
        self.fill = 0.0                   # the largest share of a ring one chunk read
        self.backlog = False              # work was left when the last slice ended

    def _runnable(self, jobs) -> dict:
        """owner -> deque of (job, session) with ring records or a plan to publish now."""
        ready = {}
        for job in list(jobs):
            for session in list(job.sessions.values()):
                if session.closed:
                    continue
                if int(session.ring.header.head) == session.ring.tail and not self.host.plan_due(job, session):
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
            records, more = self._serve_charged(owner, job, session)
            total += records
            self.fill = max(self.fill, records / session.ring.capacity)
            if more:
                queue.append((job, session))
        self.backlog = any(ready.get(owner) for owner in self.turns)
        self._next_turn(jobs)
        return total

    def _serve_charged(self, owner, job, session) -> tuple:
        """_serve, its time taken from the owner's credit and added to what it spent."""
        began = time.perf_counter()
        served = self._serve(owner, job, session)
        cost = time.perf_counter() - began
        self.credit[owner] = self.credit.get(owner, 0.0) - cost
        self.spent[owner] += cost
        return served

    def _serve(self, owner, job, session) -> tuple:
        """One chunk of one session's ring (its batch to the planner's backlog as the session
        ingests it), and its plan if one is due: (records read, more left to read)."""
        records = 0
        if int(session.ring.header.head) != session.ring.tail:
            began = time.perf_counter()
            records = self.host.read_chunk(job, session, session.chunk or CHUNK_MIN)
            if records:
                per_record = max(time.perf_counter() - began, 1e-6) / records
                session.chunk = max(CHUNK_MIN, min(CHUNK_MAX, int(CHUNK_SECONDS / per_record)))
        if session.closed:
            return records, False
        if self.host.plan_due(job, session):
            self.host.publish_plan(job, session)
        return records, records > 0 and int(session.ring.header.head) != session.ring.tail

    # ---- the planner's turns ----
    def _wanting(self, jobs) -> dict:
        """owner -> [(job, session)] whose planner has batches or a budget to learn, now, or
        records in its ring not read yet: a user whose rings the slices have not reached (a
        loaded machine, a slice spent on another's chunk) still wants its turn, else the
        planner's round passes it and another user's process plans again (under load, 60
        turns of 1 s against the cheap user's 150 of 0.05 s)."""
        now, wanting = time.monotonic(), {}
        for job in list(jobs):
            for session in list(job.sessions.values()):
                handle = session.lookahead
                if handle is not None and not session.closed and now >= session.plan_after and \
                        (session.backlog or handle.pending or int(session.ring.header.head) != session.ring.tail):
                    wanting.setdefault(job.uid, []).append((job, session))
        return wanting

    def _next_turn(self, jobs):
        """If the planner is free: the next owner in the round with credit (deficit round-robin
        on planner time; each waiting owner earns PLAN_QUANTUM_SECONDS a round) plans one of
        its sessions, in turn."""
        if self.planning is not None:
            return
        wanting = self._wanting(jobs)
        for owner in [o for o in self.plan_turns if o not in wanting]:  # gone from the round, debt kept
            self.plan_turns.remove(owner)
            if self.plan_credit.get(owner, 0.0) >= 0:
                self.plan_credit.pop(owner, None)
        self.plan_turns.extend(owner for owner in wanting if owner not in self.plan_turns)
        if not self.plan_turns:
            return
        best = max(self.plan_credit.get(owner, 0.0) for owner in self.plan_turns)
        if best <= 0:  # the rounds it takes the first owner to earn a quantum of credit, at once
            for owner in self.plan_turns:
                self.plan_credit[owner] = self.plan_credit.get(owner, 0.0) + PLAN_QUANTUM_SECONDS - best
        while self.plan_credit.get(self.plan_turns[0], 0.0) <= 0:
            self.plan_turns.rotate(-1)
        owner = self.plan_turns[0]
        self.plan_turns.rotate(-1)
        work = wanting[owner]
        job, session = work[self.plan_cursor[owner] % len(work)]
        self.plan_cursor[owner] += 1
        if not (session.backlog or session.lookahead.pending):  # its turn reads what it plans
            self._serve_charged(owner, job, session)
            if session.closed or not (session.backlog or session.lookahead.pending):
                return
        self._plan(owner, job, session, self._share(jobs, owner))

    @staticmethod
    def _share(jobs, owner) -> dict:
        """What the planner's tables may hold for one of owner's lookahead processes
        (limits.planner_share): every user with lookahead processes takes an equal part."""
        users = collections.Counter(j.uid for j in jobs for s in j.sessions.values() if s.lookahead is not None)
        return limits.planner_share(len(users), users[owner])

    def _plan(self, owner, job, session, share):
        """The planner's process learns the session's backlog (its ring is read meanwhile)."""
        handle = session.lookahead

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
            self.plan_credit[owner] = self.plan_credit.get(owner, 0.0) - planned.cost
            self.spent[owner] += planned.cost
            session.planner_trimmed += planned.trimmed
            if session.closed or session.lookahead is not handle:
                return
            if planned.overran:
                self._overran(job, session)
                return
            handle.learned(planned)
            self.host.planned(job, session)

        batches = session.backlog.take()
        if not self.planner.knows(handle.key):  # a new planner (or a first turn): what pumpd knows first
            batches.insert(0, channel.Batch(allocs=list(session.allocations.items())))
        session.planning = True
        self.planning = asyncio.wrap_future(self.planner.submit(handle, batches, share=share))
        self.planning.add_done_callback(done)

    def _overran(self, job, session):
        """A turn met its deadline: its plan stays, and the process waits before its next turn,
        or, past limits.PLAN_OVERRUNS_MAX, plans no more."""
        handle = session.lookahead
        handle.overruns += 1
        self.overruns[job.uid] += 1
        if handle.overruns >= limits.PLAN_OVERRUNS_MAX:
            job.fall_back(session, f"lookahead's planning overran its deadline {handle.overruns} times")
            return
        session.plan_after = time.monotonic() + PLAN_BACKOFF_SECONDS * 2 ** (handle.overruns - 1)

    async def drain(self, sessions, timeout: float, planned: bool = False) -> bool:
        """Wait until what each session's ring holds now has been read (with ``planned``, and
        learned by its planner), or the session closed; False if that took over ``timeout``
        seconds."""
        targets = [(s, int(s.ring.header.head)) for s in sessions if not s.closed]

        def waiting(s, head):
            return not s.closed and (s.ring.tail < head or planned and s.lookahead is not None and
                                     (s.planning or s.backlog) and time.monotonic() >= s.plan_after)
        deadline = time.monotonic() + timeout
        while any(waiting(s, head) for s, head in targets):
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
                    if not self.host.read_chunk(job, session, CHUNK_MAX):
                        break

    def stop(self):
        self.planner.stop()
