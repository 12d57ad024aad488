"""pumpd's requests: what each operation a client may ask does (register, attach,
resume, status, set, end) and the job bookkeeping they share.

A mixin of the Daemon (server.py), which owns the state these read and change; split
from the event loop so that each file holds one concern. Who may do what is decided
by the connection (conn.uid, conn.realm, conn.admin), never by what a message says.
"""

import asyncio
import logging
import os
import time

from pump import channel, config, protocol
from pumpd.arbiter import Terms
from pumpd.connection import Descriptors, RequestError
from pumpd.userlog import user_log
from pumpd.jobs import Job, Session, start_time
from pumpd import limits, lookahead, tracing
from pumpd.pages import status_page

log = logging.getLogger("pumpd")

GONE = "the process that connected is gone; its pid names no process of yours"
DRAIN_TIMEOUT = 5.0          # the most `end` or a dead process waits for its rings to be read


class Requests:
    async def _handle(self, conn, request, fds):
        op = request["op"]
        if fds and op != "resume" and not (op == "register" and request.get("trace") and len(fds) == 1):
            raise RequestError(f"{op}: carries file descriptors; only resume (2) and register "
                               "with trace (1) may")
        if op == "register" and request.get("trace") and len(fds) != 1:
            raise RequestError("register: trace true needs the trace file's descriptor")
        if op == "ping":
            return {"ok": True, "version": protocol.VERSION, "pid": os.getpid()}, ()
        if op == "status":
            return self._status(conn, request.get("offset", 0)), ()
        changes = {"register": lambda: (self._register(conn, request, fds), ()),
                   "attach": lambda: self._attach(conn, request),
                   "resume": lambda: (self._resume(conn, request, fds), ()),
                   "set": lambda: (self._set(conn, request), ())}
        if op in changes:
            reply, reply_fds = changes[op]()
            try:  # a new job's or new terms' reply goes once written (off the loop): a restarted pumpd knows them
                if op == "set" or reply["job"] not in self.store.on_disk:
                    why = await self.store.written(reply["job"])
                else:
                    why = self.store.unsaved.get(reply["job"])
                if why:  # it took effect all the same (refusing would stop the training): said, not hidden
                    reply = dict(reply, saved=False, unsaved_reason=why)
            except BaseException:
                if reply_fds:
                    reply_fds.close()
                raise
            return reply, reply_fds
        if op == "end":
            return await self._end(conn, request), ()
        raise RequestError(f"unknown op {op!r}")  # validate_request lets no other through

    def _status(self, conn, offset: int) -> dict:
        jobs = sorted((j for j in self.jobs.values() if conn.admin or j.owned_by(conn.uid, conn.realm)),
                      key=lambda j: (j.created, j.id))
        return status_page(jobs, offset, list(self.arbiter.pools.values()), dict(self.store.unsaved))

    def _caller_started(self, conn):
        """The calling process's start time, as it was when it connected: a job or a session
        is tied to (pid, start time), and a pid that names another process by now is refused."""
        if conn.started is None or start_time(conn.pid) != conn.started:
            raise RequestError(GONE)
        return conn.started

    def _room_for_job(self, uid: int, admin=False):
        why = limits.over_cap(uid, sum(j.uid == uid for j in self.jobs.values()), limits.JOBS_PER_UID_MAX,
                              len(self.jobs), limits.JOBS_MAX, admin)
        if why:
            raise RequestError(f"too many jobs: {why}")

    def _allowed_terms(self, name: str):
        """(the JobConfig of the system's jobs.d/NAME.toml or None, the Terms it allows)."""
        try:
            cfg = config.resolve_job({}, None, config.check_name(name), self.jobs_dir)
        except ValueError:  # not a name a jobs.d file can have: the defaults
            return None, Terms()
        except config.ConfigError as exc:
            log.warning("job %s: %s", name, exc)
            return None, Terms()
        return cfg, Terms.from_config(cfg)

    def _register(self, conn, request, fds) -> dict:
        group = request.get("group")
        joined = next((j for j in self.jobs.values() if group and j.owned_by(conn.uid, conn.realm) and j.group == group
                       and j.alive()), None)
        if joined is not None:  # another pump-run of the same run: one job
            why = joined.refuses_leader(request.get("policy") or "launch", bool(fds))
            if why:
                raise RequestError(f"register: {why}")
            joined.add_leader(conn.pid, self._caller_started(conn))
            self.store.save(joined)
            user_log.info(conn.uid, "pid %d joined job %s (%s) of group %s", conn.pid, joined.id, joined.name, group)
            return {"ok": True, "job": joined.id, "joined": True}
        self._room_for_job(conn.uid)
        job = Job(Job.new_id(), request["name"], conn.uid, conn.pid, self._caller_started(conn),
                  request.get("policy") or "launch", request.get("capacity"))
        job.group, job.realm = group, conn.realm
        job.terms = Terms.from_request(request)
        if not conn.admin:  # the administrator's terms stand as sent
            job.terms = job.terms.within(self._allowed_terms(job.name)[1], self.arbiter.pool is not None)
        if fds:
            try:
                tracing.check_descriptor(fds[0])
            except (tracing.TraceRefused, OSError) as exc:
                raise RequestError(f"register: {exc}; a trace goes to a regular file opened for writing") from None
            job.trace = fds.hand(0, lambda fd: self.traces.open(fd, job.id, job.name, conn.uid))
        self.jobs[job.id] = job
        self.store.save(job)
        user_log.info(conn.uid, "job %s (%s) registered by pid %d, uid %d", job.id, job.name, conn.pid, conn.uid)
        self._rebalance()
        return {"ok": True, "job": job.id}

    def _job_for_attach(self, conn, request) -> Job:
        job_id = request["job"]
        if job_id:  # pump-run's job (PUMP_JOB): pumpd made the id; another's job looks absent
            job = self.jobs.get(job_id)
            if job is None or not job.owned_by(conn.uid, conn.realm):
                raise RequestError(f"no job {job_id} of this user")
            return job
        parent = self._job_of_ancestor(conn)
        if parent is not None:
            return parent
        # A shim preloaded by hand: the system's jobs.d/NAME.toml still applies to it.
        self._room_for_job(conn.uid)
        name = request["name"] or _process_name(conn.pid)
        policy, terms = request["policy"], Terms()
        cfg = self._allowed_terms(name)[0] if request["name"] else None
        if cfg is not None:
            policy = cfg.policy if cfg.source["policy"] != "default" else policy
            terms = Terms.from_config(cfg)
        job = Job(Job.new_id(), name, conn.uid, conn.pid, self._caller_started(conn), policy)
        job.terms, job.realm = terms, conn.realm
        self.jobs[job.id] = job
        user_log.info(conn.uid, "job %s (%s) started by the shim of pid %d, uid %d", job.id, job.name, conn.pid,
                      conn.uid)
        self._rebalance()
        return job

    def _job_of_ancestor(self, conn):
        """A hand-preloaded process's children join the job of their parent's session."""
        import psutil
        try:
            parents = psutil.Process(conn.pid).parents()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            return None
        ancestors = {p.pid for p in parents}
        for job in self.jobs.values():
            if job.owned_by(conn.uid, conn.realm) and ancestors.intersection(job.sessions):
                return job
        return None

    def _room_for_session(self, uid: int, admin=False):
        mine = sum(len(j.sessions) for j in self.jobs.values() if j.uid == uid)
        everyone = sum(len(j.sessions) for j in self.jobs.values())
        why = limits.over_cap(uid, mine, limits.SESSIONS_PER_UID_MAX, everyone, limits.SESSIONS_MAX, admin)
        if why:
            raise RequestError(f"too many sessions: {why}")

    def _attach(self, conn, request):
        if conn.session is not None:
            raise RequestError("this connection has a session already")
        self._room_for_session(conn.uid)
        self._caller_started(conn)  # before anything is made for it
        job = self._job_for_attach(conn, request)
        session_id = self._new_session_id()
        ring = channel.Ring.create(session_id, job.id)
        try:
            plan = channel.Plan.create()
        except BaseException:
            ring.close()  # out of descriptors or memory: nothing made for it stays
            raise
        self._open_session(conn, job, session_id, ring, plan, "attached to", request.get("rank"))
        # The shim gets the memfds, sent with the reply and then closed: the session keeps
        # only its mappings (each mmap holds a descriptor of its own).
        return {"ok": True, "session": session_id, "job": job.id}, Descriptors([ring.hand_over(), plan.hand_over()])

    def _resume(self, conn, request, fds) -> dict:
        if len(fds) != 2:
            raise RequestError(f"resume: carries {len(fds)} file descriptors; expected 2 (ring, plan)")
        if conn.session is not None:
            raise RequestError("this connection has a session already")
        self._room_for_session(conn.uid)
        self._caller_started(conn)
        ring = plan = None
        try:  # each maps its own copy: the descriptors received stay fds' and are closed after
            ring = channel.Ring.adopt(fds[0])
            plan = channel.Plan.adopt(fds[1])
        except channel.ChannelError as exc:
            raise RequestError(f"resume: {exc}") from None
        finally:
            if plan is None and ring is not None:
                ring.close()
        job = self.jobs.get(ring.job)
        if job is None or not job.owned_by(conn.uid, conn.realm):
            ring.close()
            plan.close()
            raise RequestError("resume: the ring names no job of this user")
        session_id = self._new_session_id()
        ring.header.session = session_id
        self._open_session(conn, job, session_id, ring, plan, "resumed in", request.get("rank"))
        return {"ok": True, "session": session_id, "job": job.id}

    def _open_session(self, conn, job, session_id, ring, plan, how: str, rank=None):
        """The connection's process joins the job with this ring and plan, which the job owns
        from here on (closed with the session), whatever fails after."""
        session = Session(session_id, conn.pid, conn.started, ring, plan,  # checked by the caller
                          limits.Quota(conn.uid, self.tallies))
        job.add_session(session)
        session.rank = rank
        if job.policy == "lookahead":
            session.lookahead = self.scheduler.planner.session(session_id, self._plan_budget(job, session),
                                                               self._plan_bandwidth(session))
        self.store.save(job)
        conn.session, conn.job = session, job
        self.publish_plan(job, session)
        user_log.info(conn.uid, "pid %d%s %s job %s as session %d", conn.pid, "" if rank is None else f" (rank {rank})",
                      how, job.id, session_id)

    def _set(self, conn, request) -> dict:
        job = self._own_job(conn, request["job"])
        budget = request["budget"] or None  # 0 or null: back to the config's or the arbiter's
        if conn.admin:  # the administrator fixes budgets past the terms
            job.terms.set_bytes, job.terms.set_max_bytes = budget, None
        else:
            job.terms.set_by_user(budget, self._allowed_terms(job.name)[1], self.arbiter.pool is not None)
        user_log.info(conn.uid, "job %s: budget %s by uid %d", job.id, "setting cleared" if budget is None else
                      f"set to {job.terms.set_bytes}" if job.terms.set_bytes else f"capped at {budget}", conn.uid)
        self.store.save(job)
        self._rebalance()
        return {"ok": True, "job": job.id}

    async def _end(self, conn, request) -> dict:
        job = self._own_job(conn, request["job"])
        if not job.end_leader(conn.pid):  # other pump-runs of its group still run
            return job.ending()
        # Its rings are read fairly with everyone's, not here: the reply waits for them, and then
        # (the trace whole meanwhile) for what its planner learns of their last records.
        sessions = list(job.sessions.values())
        await self.scheduler.drain(sessions, DRAIN_TIMEOUT)
        job.close_trace()
        await self.scheduler.drain(sessions, DRAIN_TIMEOUT, planned=True)
        trace = job.trace
        if job.id in self.jobs and not job.alive():
            self._forget(job)
        reply = job.ending()
        if trace is not None:
            # pump-run reports what the trace holds: wait (off the loop's time) for its writes
            deadline = time.monotonic() + tracing.WRITE_TIMEOUT
            while not trace.done() and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            reply["trace"] = trace.status()
        return reply

    def _own_job(self, conn, job_id, owner_only=False) -> Job:
        """The job, if the caller may steer it (its owner; the administrator too unless owner_only)."""
        job = self.jobs.get(job_id)
        if job is None or (not job.owned_by(conn.uid, conn.realm) and (owner_only or not conn.admin)):
            raise RequestError(f"no job {job_id} of this user")  # another's job looks absent
        return job

    def _forget(self, job, rebalance: bool = True):
        """The job is gone; with rebalance, the others' budgets are made anew (a caller that
        forgets many at once rebalances once: each rebalance visits every job)."""
        del self.jobs[job.id]
        for s in job.sessions.values():
            s.close()
        job.close_trace()
        self.store.remove(job)
        user_log.info(job.uid, "job %s (%s) ended", job.id, job.name)
        if rebalance:
            self._rebalance()

    def _rebalance(self):
        """Budgets anew for every job (one came, went, or was set; a pool changed): the
        scheduler's next slice puts the changed ones in their plans (plan_due)."""
        for job in self.arbiter.apply(self.jobs.values()):
            self.store.save(job)

    def _new_session_id(self) -> int:
        self.next_session += 1
        return self.next_session - 1


def _process_name(pid: int) -> str:
    import psutil
    try:
        # psutil decodes a name UTF-8 cannot (any bytes, with prctl) to lone surrogates
        name = psutil.Process(pid).name().encode("utf-8", "surrogateescape").decode("utf-8", "replace")
        return name[: protocol.NAME_MAX] or f"pid-{pid}"
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return f"pid-{pid}"
