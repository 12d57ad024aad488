"""Jobs and their processes' sessions, as pumpd keeps them.

A job is what pump-run registered (or what a hand-preloaded shim started): a
name, an owner uid, a leader process, its configuration.  Each process of the
job that uses CUDA attaches its own session: an event ring, a plan, counters.
Jobs are written to the state directory (one 0600 JSON file each, by a thread:
never on the event loop) so that a restarted pumpd lists them again at once; their
processes' shims resume their sessions on their own within a second or two.

Liveness is by (pid, process start time): a pid that now names another process
is a dead one.

A job file's name is its id, which pumpd made and checks (protocol.valid_job_id)
before it becomes a name; files are opened relative to the state directory's
descriptor, never following a symlink, and pumpd refuses a state directory it
does not own or that others can write.
"""

import asyncio
import collections
import errno
import json
import logging
import os
import pwd
import secrets
import stat
import threading
import time

import psutil

from pump import channel, protocol
from pumpd.arbiter import Terms
from pump.foresight import BLOCK
from pumpd.backlog import Backlog
from pumpd.limits import Quota, table_tallies
from pumpd.tasks import RateLimitedLog
from pumpd.userlog import user_log

log = logging.getLogger("pumpd")
ITERATIONS_KEPT = 64  # processes per job whose learned iteration is remembered
LEADERS_MAX = 1024    # pump-runs of one group in one job (the ranks of a node's run)
FLUSH_TIMEOUT = 5.0   # seconds pumpd's stop (or a reply) waits for job files to be written
WRITTEN_POLL = 0.002  # seconds between looks while a reply waits for its job's file
RETRY_UNSAVED = 5.0   # seconds between tries to write the job files a full or failing disk refused
LINK_SAMPLES = 15     # a session's latest LINK records, whose median rate its plans assume...
LINK_SAMPLES_MIN = 3  # ... once it has this many (the shim times its first four back to back)


def start_time(pid: int):
    """The process's start time, or None if it is gone (or a zombie)."""
    try:
        p = psutil.Process(pid)
        if p.status() == psutil.STATUS_ZOMBIE:
            return None
        return p.create_time()
    except (psutil.NoSuchProcess, psutil.AccessDenied, ValueError):
        return None


class Session:
    """One process of a job, attached through its shim."""

    def __init__(self, session_id: int, pid: int, started, ring: channel.Ring, plan: channel.Plan,
                 quota: Quota = None):
        self.id, self.pid, self.started = session_id, pid, started
        self.rank = None            # its rank in the run, as its shim said (RANK, SLURM_PROCID...)
        self.ring, self.plan = ring, plan
        self.quota = quota or Quota(0, table_tallies())  # its uid's caps on the tables below
        self.connected = True
        self.events = 0             # records ingested
        self.invalid = 0            # records that broke the format
        self.counters = (0, 0, 0, 0, 0)  # the shim's own accounting (COUNTERS event)
        self.functions = {}         # function handle -> kernel name
        self.live_bytes = 0         # managed bytes allocated and not freed, from events
        self.allocations = {}       # base -> size
        self.devices = {}           # CUDA ordinal (as this process numbers them) -> GPU UUID
        self.own_budgets = {}       # CUDA ordinal -> the shim's own budget there (BUDGET records)
        self.link_rates = collections.deque(maxlen=LINK_SAMPLES)  # bytes/s of prefetches the GPU timed (LINK)
        self.told_invalid = False   # a bad DEVICE or BUDGET record was logged for this session
        self.lookahead = None       # a planner.Handle for jobs with policy lookahead
        self.plan_budget = None     # the budget last published, to know when to publish again
        self.plan_published = 0.0
        self.planning = False       # lookahead: the planner has a turn of it in flight
        self.backlog = Backlog(self.quota)  # lookahead: batches read and not yet learned
        self.planner_trimmed = 0    # lookahead: launches its planner's history dropped past its block references
        self.plan_after = 0.0       # lookahead: not planned again before (monotonic; a backoff)
        self.chunk = None           # records per read, sized to the time one takes (scheduler)

    def ingest(self, batch: channel.Batch):
        self.events += batch.records
        self.invalid += batch.invalid
        # Tables grow only within the uid's caps; the batch the planner sees is cut alike.
        batch.allocs = [(base, size) for base, size in batch.allocs
                        if base in self.allocations or self.quota.take("allocations")]
        for base, size in batch.allocs:
            self.live_bytes += size - self.allocations.get(base, 0)
            self.allocations[base] = size
        known = []  # frees of what was allocated (the planner's backlog keeps no others)
        for base, _size in batch.frees:
            size = self.allocations.pop(base, None)
            if size is not None:
                self.live_bytes -= size
                self.quota.give_back("allocations")
                known.append((base, size))
        batch.frees = known
        batch.functions = {f: name for f, name in batch.functions.items()
                           if f in self.functions or self.quota.take("functions")}
        self.functions.update(batch.functions)
        if self.lookahead is not None:  # the planner keeps every 2 MiB block's size
            batch.allocs = [(base, size) for base, size in batch.allocs
                            if self.quota.take("planned_blocks", (base + max(size, 1) - 1) // BLOCK - base // BLOCK + 1)]
        problems = list(batch.problems)
        for ordinal, uuid in batch.devices:
            if self.devices.setdefault(ordinal, uuid) != uuid:  # an ordinal names one GPU for good
                self.invalid += 1
                problems.append(f"DEVICE record names device {ordinal} {uuid}; it was {self.devices[ordinal]}")
        if problems and not self.told_invalid:
            self.told_invalid = True
            log.warning("session %d (pid %d): %s: record ignored (later ones are counted in "
                        "events_invalid)", self.id, self.pid, problems[0])
        if batch.counters is not None:
            self.counters = batch.counters
        self.own_budgets.update(batch.budgets)
        self.link_rates.extend(moved * 1e9 / ns for _device, moved, ns in batch.links)
        if self.lookahead is not None:  # the planner learns it in its own process (scheduler.py)
            self.backlog.add(batch)

    @property
    def own_budget(self) -> int:
        """The least of the budgets the shim holds on its devices above their memory, 0: none
        (one plan serves all of a process's devices)."""
        return min(self.own_budgets.values(), default=0)

    @property
    def link_rate(self) -> float:
        """The (lower) median rate of the latest prefetches the GPU timed (bytes/s), 0.0: fewer
        than LINK_SAMPLES_MIN yet. A sample holds what its prefetch met (bytes already there
        look fast, an eviction the driver made to make room slow): the median keeps the link's
        own rate, the lower of two middles the slower (of four samples, one of 812 GB/s moved
        the upper middle from 21 to 812 GB/s on fakecuda's 25 GB/s link), and a plan made anew
        at each sample's whim would cost launches their triggers."""
        rates = sorted(self.link_rates)
        return rates[(len(rates) - 1) // 2] if len(rates) >= LINK_SAMPLES_MIN else 0.0

    @property
    def closed(self) -> bool:
        return self.ring.header is None

    def close(self):
        self.ring.close()
        self.plan.close()
        self.backlog.clear()
        self.quota.release()
        if self.lookahead is not None:
            self.lookahead.close()

    def fall_back(self):
        """Lookahead given up for this process: its plan goes back to the shim's launch rule."""
        self.lookahead.close()
        self.lookahead = None
        self.backlog.clear()
        self.plan_budget = None  # the empty plan goes out with the next slice


class Job:
    COUNTER_NAMES = ("launches", "launches_managed", "prefetch_bytes", "resident_bytes", "bytes_evicted")

    def __init__(self, job_id, name, uid, leader_pid, leader_started, policy="launch",
                 capacity=None, budget=None, created=None, pids=()):
        self.id, self.name, self.uid = job_id, name, uid
        self.leader_pid, self.leader_started = leader_pid, leader_started
        self.policy, self.capacity, self.budget = policy, capacity, budget
        self.terms = Terms()            # what decides the budget: config, op set, the arbiter
        self.created = created or time.time()
        self.sessions = {}              # pid -> Session
        self.known_pids = dict(pids)    # pid -> start time, kept across restarts
        self.trace = None               # a tracing.Trace while pump-run --trace records
        self.group = None               # the run the job is (pump-run's group), or None
        self.realm = ""                 # the pod its owner's processes are in (pumpd/identity.py)
        # The pump-runs whose command is the job (pid -> start time): the leader, then those of
        # the same group that joined; ended: those that said their command exited.
        self.leaders = {leader_pid: leader_started}
        self.ended = set()
        self.tree = {}                  # the leader's process tree: pids, rss_bytes, cpu_seconds
        self.iterations = {}            # pid -> launches of the iteration lookahead learned there
        self.link_rates = {}            # pid -> the link rate its prefetches met (bytes/s), its last
        self.fallbacks = {}             # pid -> why lookahead gave way to the launch rule there

    @staticmethod
    def new_id() -> str:
        return "j" + secrets.token_hex(8)

    def alive(self) -> bool:
        """Any of its processes still running (a leader whose command has not ended, or a
        process that attached)."""
        processes = list(self.known_pids.items())
        processes += [(pid, t) for pid, t in self.leaders.items() if pid not in self.ended]
        return any(started is not None and start_time(pid) == started for pid, started in processes)

    def owned_by(self, uid: int, realm: str) -> bool:
        return self.uid == uid and self.realm == realm

    def refuses_leader(self, policy: str, trace: bool) -> str:
        """Why another pump-run of the job's group may not join it, or ""."""
        if policy != self.policy:
            return (f"job {self.id} of group {self.group} runs policy {self.policy}; a pump-run joining it "
                    f"asked for {policy} (the same run takes one policy)")
        if trace:
            return f"job {self.id} of group {self.group} is traced by its first pump-run only; --trace is refused"
        if len(self.leaders) >= LEADERS_MAX:
            return f"job {self.id} of group {self.group} has {LEADERS_MAX} pump-runs already (the most one job takes)"
        return ""

    def add_leader(self, pid: int, started):
        self.leaders[pid] = started
        self.ended.discard(pid)

    def end_leader(self, pid: int) -> bool:
        """A pump-run said its command exited (one not among the leaders, root's: the first);
        True when every leader has."""
        self.ended.add(pid if pid in self.leaders else self.leader_pid)
        return self.ended >= set(self.leaders)

    def close_trace(self):
        """No more records for the trace (it is written out off the loop)."""
        if self.trace is not None:
            self.trace.close()

    def gpu_uuids(self) -> list:
        """The GPUs its processes work on (their shims' DEVICE records), sorted."""
        return sorted({uuid for s in self.sessions.values() for uuid in s.devices.values()})

    def note_iteration(self, session: Session):
        """What a lookahead session has learned, kept past its end (pump-run reports it when
        the job ends); said in the log when it changes."""
        period = session.lookahead.period
        if period == self.iterations.get(session.pid, 0):
            return
        self.iterations[session.pid] = period
        while len(self.iterations) > ITERATIONS_KEPT:
            del self.iterations[next(iter(self.iterations))]
        if period:
            user_log.info(self.uid, "job %s (%s): lookahead learned an iteration of %d launches (pid %d)",
                          self.id, protocol.printable(self.name), period, session.pid)

    def note_link(self, session: Session):
        """A session's link rate, kept past its end (pump-run reports what lookahead planned at)."""
        self.link_rates.pop(session.pid, None)
        self.link_rates[session.pid] = session.link_rate
        while len(self.link_rates) > ITERATIONS_KEPT:
            del self.link_rates[next(iter(self.link_rates))]

    def fall_back(self, session: Session, why: str):
        """Lookahead given up for one process (its planning overran, pumpd/scheduler.py): kept
        past its end, said in `pump status` and pump-run's end line."""
        session.fall_back()
        self.fallbacks.pop(session.pid, None)
        self.fallbacks[session.pid] = why
        while len(self.fallbacks) > ITERATIONS_KEPT:
            del self.fallbacks[next(iter(self.fallbacks))]
        user_log.warning(self.uid, "job %s (%s): pid %d falls back to the launch rule: %s",
                         self.id, protocol.printable(self.name), session.pid, why)

    def ending(self) -> dict:
        """`end`'s reply: what lookahead learned and met in the job's processes."""
        return {"ok": True, "job": self.id, "iteration_launches": self.learned_iterations(),
                "link_bytes_per_s": self.measured_links(), "lookahead_fallbacks": self.lookahead_fallbacks()}

    def lookahead_fallbacks(self) -> list:
        return [f"pid {pid}: {why}" for pid, why in self.fallbacks.items()]

    def measured_links(self) -> list:
        """The link rate each process's prefetches met (bytes/s), per process that timed one."""
        return [round(rate) for rate in self.link_rates.values() if rate]

    def learned_iterations(self) -> list:
        """The launches of each iteration learned, per process that learned one."""
        return [n for n in self.iterations.values() if n]

    def add_session(self, session: Session):
        old = self.sessions.pop(session.pid, None)
        if old is not None:
            old.close()
        self.sessions[session.pid] = session
        self.known_pids[session.pid] = session.started

    def dead_pids(self) -> list:
        """(pid, start time) of its processes that are gone (blocking: reads /proc)."""
        return [(pid, t) for pid, t in list(self.known_pids.items()) if t is None or start_time(pid) != t]

    def forget_pids(self, dead) -> bool:
        """Close the sessions of processes found dead; True if anything changed."""
        changed = False
        for pid, started in dead:
            if self.known_pids.get(pid) == started:
                del self.known_pids[pid]
                changed = True
            session = self.sessions.get(pid)
            if session is not None and session.started == started:
                del self.sessions[pid]
                session.close()
        return changed

    def status(self) -> dict:
        totals = dict.fromkeys(self.COUNTER_NAMES, 0)
        events = dropped = invalid = 0
        tables_dropped = {"functions_dropped": 0, "allocations_dropped": 0, "planned_blocks_dropped": 0}
        skipped = trimmed = 0
        for s in self.sessions.values():
            for what in ("functions", "allocations", "planned_blocks"):
                tables_dropped[what + "_dropped"] += s.quota.dropped[what]
            skipped += s.backlog.skipped
            trimmed += s.planner_trimmed
            for name, value in zip(self.COUNTER_NAMES, s.counters):
                totals[name] += value
            events += s.events
            dropped += s.ring.dropped + s.ring.lost
            invalid += s.invalid
        try:
            user = pwd.getpwuid(self.uid).pw_name
        except KeyError:  # a uid with no name here
            user = str(self.uid)
        return {
            "job": self.id, "name": self.name, "pid": self.leader_pid, "uid": self.uid, "user": user,
            "pids": sorted(set(self.known_pids) | set(self.sessions)),
            "sessions": len(self.sessions), "policy": self.policy, "capacity": self.capacity,
            "budget_bytes": self.budget, "budget_source": self.terms.source,
            "budget_percent": self.terms.fixed_percent, "budget_state": self.terms.state,
            "share": self.terms.share, "min_budget_bytes": self.terms.min_bytes,
            "max_budget_bytes": self.terms.cap_bytes(), "priority": self.terms.priority,
            "gpu_uuids": self.terms.gpu_uuids, "gpus": self.terms.gpus, **totals,
            "events": events, "events_dropped": dropped, "events_invalid": invalid, **tables_dropped,
            "planner_skipped": skipped, "planner_trimmed": trimmed, "lookahead_fallbacks": self.lookahead_fallbacks(),
            "host_rss_bytes": self.tree.get("rss_bytes"), "cpu_seconds": self.tree.get("cpu_seconds"),
            "started": self.created,
            "trace": self.trace.status() if self.trace is not None else None,
            # lookahead: per process, the iteration learned (launches per period; 0: not yet)
            "iteration_launches": [s.lookahead.period for s in self.sessions.values()
                                   if s.lookahead is not None],
            # per process, the link rate its prefetches met (LINK records; 0: none timed yet)
            "link_bytes_per_s": [round(s.link_rate) for s in self.sessions.values()],
            "group": self.group, "pump_runs": len(self.leaders),
            "ranks": sorted(s.rank for s in self.sessions.values() if s.rank is not None),
        }

    # ---- persistence ----
    def to_json(self) -> dict:
        return {"job": self.id, "name": self.name, "uid": self.uid, "leader_pid": self.leader_pid,
                "leader_started": self.leader_started, "policy": self.policy,
                "capacity": self.capacity, "budget": self.budget, "terms": self.terms.to_json(),
                "created": self.created,
                "pids": [[pid, t] for pid, t in self.known_pids.items()],
                "group": self.group, "realm": self.realm,
                "leaders": [[pid, t] for pid, t in self.leaders.items()],
                "ended": sorted(self.ended)}

    @classmethod
    def from_json(cls, doc: dict) -> "Job":
        job = cls(doc["job"], doc["name"], int(doc["uid"]), int(doc["leader_pid"]), doc["leader_started"],
                  doc["policy"], doc["capacity"], doc["budget"], doc["created"],
                  [(int(pid), t) for pid, t in doc["pids"]])
        # An older pumpd's file has no group: one leader, still running.
        job.group = doc.get("group")
        job.realm = str(doc.get("realm", ""))  # an older pumpd's file: the host's
        job.leaders.update((int(pid), t) for pid, t in doc.get("leaders", []))
        job.ended = {int(pid) for pid in doc.get("ended", [])}
        # An older pumpd's file has no terms: the budget it held stays, as fixed.
        job.terms = Terms.from_json(doc["terms"]) if "terms" in doc else Terms(fixed_bytes=doc["budget"])
        return job


class StateDirError(RuntimeError):
    """The state directory is not one pumpd can trust: pumpd does not start."""


class JobStore:
    """The state directory's job files (0600, in a 0700 directory pumpd owns), named
    by checked job ids and opened relative to the directory's descriptor without
    following symlinks. A file is written whole or not at all (a temp file of its own,
    fsynced, renamed, the directory fsynced); one the disk refused is tried again every
    RETRY_UNSAVED seconds, and until then its job is counted unsaved, with the reason."""

    def __init__(self, directory, errors=None):
        self.dir = os.fspath(directory)
        self.errors = errors or RateLimitedLog()
        self.pending = {}      # job id -> the file's newest text, or None: remove it
        self.writing = None    # the job id whose file the writer has in hand
        self.closed = False
        self.on_disk = set()   # the jobs whose file exists
        self.unsaved = {}      # job id -> why its newest text is not on disk (the text waits in `refused`)
        self.refused = {}      # job id -> the text the disk refused, tried again later
        self.changed = threading.Condition()
        try:
            os.mkdir(self.dir, 0o700)
        except FileExistsError:
            pass
        except OSError as exc:
            raise StateDirError(f"state directory {self.dir}: cannot create it: {exc.strerror}") from None
        try:
            self.fd = os.open(self.dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as exc:
            raise StateDirError(f"state directory {self.dir}: cannot open it as a directory (not "
                                f"following symlinks): {exc.strerror}") from None
        check_private_dir(self.fd, self.dir, "state directory")
        try:
            os.fchmod(self.fd, 0o700)
        except OSError as exc:  # read-only (an I/O error remounts ext4 so): served, jobs unsaved until it is not
            if exc.errno != errno.EROFS:
                raise
        self._remove_stale_temps()
        # started here, not on the loop (a thread's start waits for it to run: 0.4 s seen under load)
        self.writer = threading.Thread(target=self._write_pending, name="pumpd-jobs", daemon=True)
        self.writer.start()

    @staticmethod
    def _name(job_id) -> str:
        if not protocol.valid_job_id(job_id):  # pumpd made it: never true, unless a bug
            raise ValueError(f"job id {job_id!r} is not {protocol.JOB_ID_ALLOWED}")
        return job_id + ".json"

    def save(self, job: Job):
        """The job's file is written (replaced whole) off the event loop, soon."""
        self._queue(job.id, json.dumps(job.to_json()))

    def remove(self, job: Job):
        self._queue(job.id, None)

    # A rename or an fsync-like flush of the file system may take hundreds of milliseconds
    # on a busy disk (ext4 flushes a replaced file's data at the rename): the event loop
    # only queues a job's newest file, and one thread writes (or removes) it.
    def _queue(self, job_id: str, text):
        self._name(job_id)  # checked now, where the caller can see a bug
        with self.changed:
            self.pending[job_id] = text  # only the newest matters
            self.changed.notify_all()

    def _write_pending(self):
        while True:
            with self.changed:
                while not self.pending:
                    self.writing = None
                    self.changed.notify_all()
                    if self.closed:
                        return
                    if self.refused and not self.changed.wait(RETRY_UNSAVED):
                        for job_id, text in self.refused.items():  # space may have returned
                            self.pending.setdefault(job_id, text)
                        self.refused.clear()
                    elif not self.refused:
                        self.changed.wait()
                self.writing = job_id = next(iter(self.pending))
                text = self.pending.pop(job_id)
                self.refused.pop(job_id, None)  # the newest text is the one to write
            try:
                if text is None:
                    self._unlink(job_id)
                    self.on_disk.discard(job_id)
                else:
                    self._write(job_id, text)
                    self.on_disk.add(job_id)
                with self.changed:
                    self.unsaved.pop(job_id, None)
            except OSError as exc:  # a full disk, no descriptor left: the job lives on, unsaved
                why = exc.strerror or str(exc)
                with self.changed:
                    if text is not None and job_id not in self.pending:
                        self.refused[job_id] = text
                    self.unsaved[job_id] = why
                self.errors.warning("writing job files", f"job {job_id}: {why} (tried again every "
                                                         f"{RETRY_UNSAVED:g} s)")

    def _write(self, job_id: str, text: str):
        """The file replaced whole: a temp file of its own (a failed one deleted), its data
        fsynced before the rename, the directory fsynced after (the rename is then durable). A
        failed fsync is not retried on that descriptor: the next try writes the file anew."""
        tmp = f"{job_id}.{secrets.token_hex(4)}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                     dir_fd=self.fd)
        try:
            try:
                data = memoryview(text.encode())
                while data:
                    data = data[os.write(fd, data):]
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, self._name(job_id), src_dir_fd=self.fd, dst_dir_fd=self.fd)
        except BaseException:
            try:
                os.unlink(tmp, dir_fd=self.fd)
            except OSError:
                pass
            raise
        os.fsync(self.fd)

    def _remove_stale_temps(self):
        """Temp files an earlier pumpd left when it died mid-write: never a job's state."""
        for name in os.listdir(self.fd):
            job_id, _, rest = name.partition(".")
            if name.endswith(".tmp") and protocol.valid_job_id(job_id) and rest != "json":
                try:
                    os.unlink(name, dir_fd=self.fd)
                except OSError:
                    pass

    def _unlink(self, job_id: str):
        try:
            os.unlink(self._name(job_id), dir_fd=self.fd)
        except FileNotFoundError:
            pass

    async def written(self, job_id: str, timeout: float = FLUSH_TIMEOUT):
        """Wait (serving others) until what was queued for the job is on disk, so that a
        reply says what a restarted pumpd will know; at most timeout seconds. Returns None
        once written, else why not (the disk's refusal, or the wait's end)."""
        deadline = time.monotonic() + timeout
        while (job_id in self.pending or self.writing == job_id) and time.monotonic() < deadline:
            await asyncio.sleep(WRITTEN_POLL)
        with self.changed:
            if job_id in self.pending or self.writing == job_id:
                return f"not written within {timeout:g} s"
            return self.unsaved.get(job_id)

    def flush(self, timeout: float = FLUSH_TIMEOUT) -> bool:
        """Wait until what was queued is written; False if that took over timeout."""
        with self.changed:
            return self.changed.wait_for(lambda: not self.pending and self.writing is None, timeout)

    def load(self, log):
        """The jobs left by an earlier pumpd; a file that does not parse is removed."""
        jobs = []
        for name in sorted(os.listdir(self.fd)):
            job_id, dot, ext = name.rpartition(".")
            if ext != "json" or not protocol.valid_job_id(job_id):
                continue
            try:
                fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=self.fd)
                with os.fdopen(fd, "rb") as f:
                    job = Job.from_json(json.loads(f.read()))
                if job.id != job_id:
                    raise ValueError(f"it names job {job.id!r}")
                jobs.append(job)
                self.on_disk.add(job_id)
            except (OSError, ValueError, KeyError, TypeError, RecursionError) as exc:
                log.warning("dropping unreadable job file %s: %s", os.path.join(self.dir, name), exc)
                try:
                    os.unlink(name, dir_fd=self.fd)
                except OSError:
                    pass
        return jobs

    def close(self):
        """At pumpd's stop: the last writes (within FLUSH_TIMEOUT; a file system that
        hangs does not hold the stop), then the directory's descriptor."""
        if self.flush():
            with self.changed:
                self.closed = True
                self.changed.notify_all()
            self.writer.join()
            os.close(self.fd)


def check_private_dir(fd: int, path: str, what: str):
    """Refuse (StateDirError) a directory not owned by pumpd's euid or writable by others."""
    st = os.fstat(fd)
    if not stat.S_ISDIR(st.st_mode):
        raise StateDirError(f"{what} {path} is not a directory")
    if st.st_uid != os.geteuid():
        raise StateDirError(f"{what} {path} belongs to uid {st.st_uid}, not to pumpd's uid "
                            f"{os.geteuid()}: remove it or give it to pumpd's user")
    if st.st_mode & 0o022:
        raise StateDirError(f"{what} {path} has mode {stat.S_IMODE(st.st_mode):04o}: group or "
                            "others can write it; it must be 0700 or 0755 at most")
