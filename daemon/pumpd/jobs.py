"""Jobs and their processes' sessions, as pumpd keeps them.

A job is what pump-run registered (or what a hand-preloaded shim started): a
name, an owner uid, a leader process, its configuration.  Each process of the
job that uses CUDA attaches its own session: an event ring, a plan, counters.
Jobs are written to the state directory (one 0600 JSON file each) so that a
restarted pumpd lists them again at once; their processes' shims resume their
sessions on their own within a second or two.

Liveness is by (pid, process start time): a pid that now names another process
is a dead one.
"""

import json
import logging
import os
import pathlib
import pwd
import secrets
import time

import psutil

from pump import channel
from pumpd.arbiter import Terms

log = logging.getLogger("pumpd")


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

    def __init__(self, session_id: int, pid: int, started, ring: channel.Ring, plan: channel.Plan):
        self.id, self.pid, self.started = session_id, pid, started
        self.ring, self.plan = ring, plan
        self.connected = True
        self.events = 0             # records ingested
        self.invalid = 0            # records that broke the format
        self.counters = (0, 0, 0, 0, 0)  # the shim's own accounting (COUNTERS event)
        self.functions = {}         # function handle -> kernel name
        self.live_bytes = 0         # managed bytes allocated and not freed, from events
        self.allocations = {}       # base -> size
        self.devices = {}           # CUDA ordinal (as this process numbers them) -> GPU UUID
        self.told_invalid = False   # a bad DEVICE record was logged for this session
        self.lookahead = None       # a lookahead.Lookahead for jobs with policy lookahead
        self.plan_budget = None     # the budget last published, to know when to publish again
        self.plan_published = 0.0

    def ingest(self, batch: channel.Batch):
        self.events += batch.records
        self.invalid += batch.invalid
        for base, size in batch.allocs:
            self.live_bytes += size - self.allocations.get(base, 0)
            self.allocations[base] = size
        for base, _size in batch.frees:
            size = self.allocations.pop(base, None)
            if size is not None:
                self.live_bytes -= size
        self.functions.update(batch.functions)
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
        if self.lookahead is not None:
            self.lookahead.observe(batch)

    def close(self):
        self.ring.close()
        self.plan.close()


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
        self.trace = None               # a TraceWriter while pump-run --trace records
        self.ended = False              # pump-run said its command exited: the leader no longer counts
        self.tree = {}                  # the leader's process tree: pids, rss_bytes, cpu_seconds

    @staticmethod
    def new_id() -> str:
        return "j" + secrets.token_hex(8)

    def alive(self) -> bool:
        """Any of its processes still running (the leader, or a process that attached)."""
        processes = list(self.known_pids.items())
        if not self.ended:
            processes.append((self.leader_pid, self.leader_started))
        return any(started is not None and start_time(pid) == started for pid, started in processes)

    def close_trace(self):
        if self.trace is not None:
            self.trace.close()
            self.trace = None

    def gpu_uuids(self) -> list:
        """The GPUs its processes work on (their shims' DEVICE records), sorted."""
        return sorted({uuid for s in self.sessions.values() for uuid in s.devices.values()})

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
        for s in self.sessions.values():
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
            "max_budget_bytes": self.terms.max_bytes, "priority": self.terms.priority,
            "gpu_uuids": self.terms.gpu_uuids, "gpus": self.terms.gpus, **totals,
            "events": events, "events_dropped": dropped, "events_invalid": invalid,
            "host_rss_bytes": self.tree.get("rss_bytes"), "cpu_seconds": self.tree.get("cpu_seconds"),
            "started": self.created,
            # lookahead: per process, the iteration learned (launches per period; 0: not yet)
            "iteration_launches": [s.lookahead.policy.period for s in self.sessions.values()
                                   if s.lookahead is not None],
        }

    # ---- persistence ----
    def to_json(self) -> dict:
        return {"job": self.id, "name": self.name, "uid": self.uid, "leader_pid": self.leader_pid,
                "leader_started": self.leader_started, "policy": self.policy,
                "capacity": self.capacity, "budget": self.budget, "terms": self.terms.to_json(),
                "created": self.created,
                "pids": [[pid, t] for pid, t in self.known_pids.items()]}

    @classmethod
    def from_json(cls, doc: dict) -> "Job":
        job = cls(doc["job"], doc["name"], int(doc["uid"]), int(doc["leader_pid"]), doc["leader_started"],
                  doc["policy"], doc["capacity"], doc["budget"], doc["created"],
                  [(int(pid), t) for pid, t in doc["pids"]])
        # An older pumpd's file has no terms: the budget it held stays, as fixed.
        job.terms = Terms.from_json(doc["terms"]) if "terms" in doc else Terms(fixed_bytes=doc["budget"])
        return job


class JobStore:
    """The state directory's job files (0600, in a 0700 directory)."""

    def __init__(self, directory):
        self.dir = pathlib.Path(directory)
        self.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self.dir, 0o700)

    def save(self, job: Job):
        path = self.dir / f"{job.id}.json"
        tmp = path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(job.to_json(), f)
        os.replace(tmp, path)

    def remove(self, job: Job):
        try:
            (self.dir / f"{job.id}.json").unlink()
        except FileNotFoundError:
            pass

    def load(self, log):
        """The jobs left by an earlier pumpd; a file that does not parse is removed."""
        jobs = []
        for path in sorted(self.dir.glob("*.json")):
            try:
                jobs.append(Job.from_json(json.loads(path.read_text())))
            except (OSError, ValueError, KeyError, TypeError) as exc:
                log.warning("dropping unreadable job file %s: %s", path, exc)
                path.unlink(missing_ok=True)
        return jobs
