"""pumpd's event loop: the socket, the sessions, ingest, liveness, telemetry.

Everything runs on one asyncio loop in one thread, except what may block
(psutil's /proc reads, NVML), which goes to a thread pool with a timeout.  A
connection that sends anything malformed gets one error reply and is closed; a
request that fails validation gets an error reply and the connection stays.
Every other job is untouched either way.

Who may do what is decided by the peer's credentials (SO_PEERCRED) and the socket
it connected to, never by what a message says: a user sees and steers only their own
jobs; only root on the administrator's socket (pump/admin.py) sees and steers all.
"""

import asyncio
import collections
import logging
import os
import socket
import time

from pump import channel, config, protocol
from pump.protocol import ProtocolError, printable
from pumpd.adminsocket import listen_admin
from pumpd.accept import NO_DESCRIPTOR_LEFT, OUT_OF_DESCRIPTORS, accept_forever, raise_descriptor_limit, refuse
from pumpd.arbiter import Arbiter, Terms
from pumpd.connection import Connection, Descriptors, RequestError, peer_credentials
from pumpd.jobs import Job, JobStore, Session, start_time
from pumpd import identity, limits, lookahead, systemd, tracing
from pumpd.pages import status_page
from pumpd.scheduler import Scheduler
from pumpd.tasks import RateLimitedLog, supervised
from pumpd.telemetry import Telemetry

log = logging.getLogger("pumpd")

INGEST_INTERVAL_MIN = 0.005  # seconds between ring sweeps, at the busiest
INGEST_INTERVAL_MAX = 0.025  # ... and when rings are nearly idle: a 64K-record ring
                             # takes 32 ms to fill at 2M events/s
DRAIN_TIMEOUT = 5.0          # the most `end` or a dead process waits for its rings to be read
FLUSH_SECONDS = 2.0          # the most pumpd's stop spends reading what rings still hold
SLOW_CALLBACK_SECONDS = 0.1  # PYTHONASYNCIODEBUG=1: asyncio logs a callback that held the loop longer
LIVENESS_INTERVAL = 0.5      # a dead job's session goes within 2 s
PLAN_INTERVAL = 0.2          # a session's plan is rewritten at most this often
BLOCKING_TIMEOUT = 5.0       # psutil/NVML calls in the thread pool
EMPTY_LAYOUT = channel.Plan.layout({})  # a plan with a budget and no triggers


class Daemon:
    def __init__(self, socket_path: str, state_dir: str, exit_with: int = None,
                 socket_mode: int = 0o600, telemetry=None, metrics_listen: str = None,
                 default_budget: int = None, jobs_dir: str = config.DEFAULT_JOBS_DIR,
                 gpu_pool: str = None, idle_exit: float = None, metrics_options: dict = None,
                 admin_socket: str = None):
        self.socket_path = socket_path
        self.admin_socket = admin_socket  # the administrator's socket to bind, or None
        self.store = JobStore(state_dir)
        self.exit_with = exit_with
        self.idle_exit = idle_exit     # a shared pumpd stops after this long without a job
        self.idle_since = time.monotonic()
        self.socket_mode = socket_mode
        self.telemetry = telemetry
        self.metrics_listen = metrics_listen
        self.metrics_options = metrics_options or {}   # MetricsServer's per_job, max_jobs
        self.metrics = None
        self.arbiter = Arbiter(gpu_pool, default_budget)
        self.jobs_dir = jobs_dir
        self.jobs = {}                 # job id -> Job
        self.next_session = 1
        self.connections = collections.Counter()  # uid -> open connections
        self.incomplete = collections.Counter()   # uid -> ... that have not completed a first message
        self.tallies = limits.table_tallies()     # per-uid caps on what ring records make pumpd keep
        self.errors = RateLimitedLog()
        self.scheduler = Scheduler(self, self.errors)  # ring reading and planning, fair between users
        self.serving = set()           # the connections' tasks
        self.bad_messages = 0
        self.events_ingested = 0
        self.telemetry_sample = None
        self.best_throughput = 0.0      # the highest host-to-GPU bytes/s NVML reported
        self.started = time.monotonic()
        self.stopping = None
        self.traces = None             # the trace writers (started with the loop)

    # ---- start and stop ----
    def _listen(self, listen_sock=None) -> socket.socket:
        if listen_sock is not None:
            listen_sock.setblocking(False)
            return listen_sock
        directory = os.path.dirname(self.socket_path)
        if directory:
            os.makedirs(directory, mode=0o700, exist_ok=True)
        if protocol.ping(self.socket_path, timeout=0.5) is not None:
            raise RuntimeError(f"another pumpd already answers on {self.socket_path}")
        try:
            os.unlink(self.socket_path)  # a stale socket left by a pumpd that died
        except FileNotFoundError:
            pass
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        old_umask = os.umask(0o177)
        try:
            sock.bind(self.socket_path)
        finally:
            os.umask(old_umask)
        os.chmod(self.socket_path, self.socket_mode)
        sock.listen(socket.SOMAXCONN)  # a flood of connects waits in the kernel, not refused
        sock.setblocking(False)
        return sock

    async def run(self, listen_sock=None, ready=None, admin_sock=None):
        self.stopping = asyncio.Event()
        loop = asyncio.get_running_loop()
        if loop.get_debug():
            loop.slow_callback_duration = SLOW_CALLBACK_SECONDS
        raise_descriptor_limit()
        self.traces = tracing.WriterPool()
        for job in self.store.load(log):
            if job.alive():
                self.jobs[job.id] = job
                log.info("picked up job %s (%s, pid %d) from an earlier pumpd", job.id, job.name, job.leader_pid)
            else:
                self.store.remove(job)
        self._rebalance()
        sock = self._listen(listen_sock)
        if self.metrics_listen:
            self._start_metrics()
        bodies = {"accept": lambda: accept_forever(sock, self._admit, self.errors), "ingest": self._ingest,
                  "liveness": self._liveness, "telemetry": self._sample_telemetry}
        admin = admin_sock if admin_sock is not None or self.admin_socket is None else listen_admin(self.admin_socket)
        if admin is not None:
            admin.setblocking(False)
            bodies["admin"] = lambda: accept_forever(admin, lambda s: self._admit(s, admin=True), self.errors)
            log.info("the administrator's socket: %s", admin.getsockname())
        interval = systemd.watchdog_interval()
        if interval is not None:
            bodies["watchdog"] = lambda: systemd.feed_watchdog(interval)
        tasks = [asyncio.create_task(supervised(name, body, self.errors)) for name, body in bodies.items()]
        log.info("listening on %s", self.socket_path)
        if ready is not None:
            ready()
        try:
            await self.stopping.wait()
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            sock.close()
            if admin is not None:
                admin.close()
            if listen_sock is None:
                try:
                    os.unlink(self.socket_path)
                except FileNotFoundError:
                    pass
            if self.metrics is not None:
                self.metrics.stop()
            self.scheduler.stop()
            self.scheduler.flush(self.jobs.values(), FLUSH_SECONDS)  # what is in the rings still reaches traces
            for job in self.jobs.values():
                job.close_trace()
                for s in job.sessions.values():
                    s.close()
                if self.exit_with is not None:
                    self.store.remove(job)  # an embedded pumpd has no successor to hand jobs to
            if self.exit_with is not None:
                self.store.close()
                for directory in (self.store.dir, os.path.dirname(self.socket_path)):
                    try:
                        os.rmdir(directory)  # only if empty: pump-run owns what else is there
                    except OSError:
                        pass
            self.traces.stop()
            log.info("stopped")

    def stop(self):
        if self.stopping is not None:
            self.stopping.set()

    def _start_metrics(self):
        from pumpd.metrics import MetricsServer
        self.metrics = MetricsServer(self.snapshot, **self.metrics_options)
        if self.metrics_listen.startswith("/"):
            self.metrics.start_unix(self.metrics_listen)
            log.info("metrics on the Unix socket %s (curl --unix-socket %s http://pumpd/metrics)",
                     self.metrics_listen, self.metrics_listen)
        else:
            self.metrics.start(*config.parse_listen(self.metrics_listen))
            log.info("metrics on http://%s/metrics", self.metrics_listen)

    # ---- connections ----
    def _admit(self, sock, admin=False):
        """A new connection: served, unless its uid (or everyone) is at a cap; root on the
        administrator's socket administers."""
        try:
            uid = peer_credentials(sock)[1]
        except OSError:
            sock.close()
            return
        admin = admin and uid == 0
        why = limits.over_cap(uid, self.connections[uid], limits.CONNECTIONS_PER_UID_MAX,
                              sum(self.connections.values()), limits.CONNECTIONS_MAX, admin)
        if not why and not admin and self.incomplete[uid] >= limits.INCOMPLETE_PER_UID_MAX:
            why = (f"uid {uid} has {self.incomplete[uid]} connections without a complete first "
                   "message, the most allowed per user")
        if why:
            self.errors.warning(f"refusing connections of uid {uid}", why)
            refuse(sock, f"too many connections: {why}")
            return
        sock.setblocking(False)
        self.connections[uid] += 1
        self.incomplete[uid] += 1
        task = asyncio.create_task(self._serve(sock, uid, admin))
        self.serving.add(task)  # the loop keeps only weak references to tasks
        task.add_done_callback(self.serving.discard)

    async def _serve(self, sock, uid, admin=False):
        conn = None
        complete = []  # the connection completed a first message

        def first_message():
            complete.append(True)
            self.incomplete[uid] -= 1

        try:
            try:
                conn = Connection(sock, first_message)  # reads /proc: needs a descriptor too
                conn.admin = admin
                conn.realm = identity.realm(sock, conn.pid)
            except OSError as exc:
                if exc.errno in OUT_OF_DESCRIPTORS:
                    refuse(sock, NO_DESCRIPTOR_LEFT)
                raise
            while True:
                fds, reply_fds = Descriptors(), ()  # what is not handed on is closed below
                try:
                    request = await conn.read_request(fds)
                    if request is None:
                        break
                    reply, reply_fds = await self._handled(conn, request, fds)
                    await conn.send(reply, fds=reply_fds)
                except ProtocolError as exc:
                    self.bad_messages += 1
                    log.info("pid %s: bad message: %s", conn.pid, printable(str(exc)))
                    await conn.send({"error": str(exc)}, protocol.ERROR)
                    if not isinstance(exc, RequestError):
                        break  # the framing is broken: nothing after it can be trusted
                finally:
                    fds.close()
                    if reply_fds:
                        reply_fds.close()
        except (ConnectionError, OSError) as exc:
            log.debug("connection closed: %s", exc)
        except Exception as exc:  # noqa: BLE001 - a bug in serving one connection ends only it
            self.errors.error("serving a connection", exc)
        finally:
            self.connections[uid] -= 1
            if not complete:
                self.incomplete[uid] -= 1
            if conn is not None and conn.session is not None:
                conn.session.connected = False
            sock.close()

    async def _handled(self, conn, request, fds):
        """_handle's reply; an OSError (out of descriptors, memory) or a bug becomes an
        error reply, and the connection stays."""
        try:
            return await self._handle(conn, request, fds)
        except ProtocolError:
            raise
        except OSError as exc:
            raise RequestError(f"{request['op']}: pumpd cannot now: {exc.strerror or exc}") from None
        except Exception as exc:  # noqa: BLE001
            self.errors.error(f"op {request['op']}", exc)
            raise RequestError(f"{request['op']}: pumpd failed on it ({exc.__class__.__name__}); "
                               "its log says more") from None

    async def _handle(self, conn, request, fds):
        op = request["op"]
        if fds and op != "resume" and not (op == "register" and request.get("trace") and len(fds) == 1):
            raise RequestError(f"{op}: carries file descriptors; only resume (2) and register "
                               "with trace (1) may")
        if op == "register" and request.get("trace") and len(fds) != 1:
            raise RequestError("register: trace true needs the trace file's descriptor")
        if op == "ping":
            return {"ok": True, "version": protocol.VERSION, "pid": os.getpid()}, ()
        if op == "register":
            return self._register(conn, request, fds), ()
        if op == "attach":
            return self._attach(conn, request)
        if op == "resume":
            return self._resume(conn, request, fds), ()
        if op == "status":
            return self._status(conn, request.get("offset", 0)), ()
        if op == "set":
            return self._set(conn, request), ()
        if op == "end":
            return await self._end(conn, request), ()
        raise RequestError(f"unknown op {op!r}")  # validate_request lets no other through

    def _status(self, conn, offset: int) -> dict:
        jobs = sorted((j for j in self.jobs.values() if conn.admin or j.owned_by(conn.uid, conn.realm)),
                      key=lambda j: (j.created, j.id))
        return status_page(jobs, offset, list(self.arbiter.pools.values()))

    def _caller_started(self, conn):
        """The calling process's start time, as it was when it connected: a job or a session
        is tied to (pid, start time), and a pid that names another process by now is refused."""
        if conn.started is None or start_time(conn.pid) != conn.started:
            raise RequestError("the process that connected is gone; its pid names no process of yours")
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
            log.info("pid %d joined job %s (%s) of group %s", conn.pid, joined.id, joined.name, group)
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
        log.info("job %s (%s) registered by pid %d, uid %d", job.id, job.name, conn.pid, conn.uid)
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
        log.info("job %s (%s) started by the shim of pid %d, uid %d", job.id, job.name, conn.pid, conn.uid)
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
            session.lookahead = lookahead.Lookahead(self._plan_budget(job),
                                                    lookahead.bandwidth(self.best_throughput))
        self.store.save(job)
        conn.session = session
        self.publish_plan(job, session)
        log.info("pid %d%s %s job %s as session %d", conn.pid, "" if rank is None else f" (rank {rank})", how,
                 job.id, session_id)

    def _set(self, conn, request) -> dict:
        job = self._own_job(conn, request["job"])
        budget = request["budget"] or None  # 0 or null: back to the config's or the arbiter's
        if conn.admin:  # the administrator fixes budgets past the terms
            job.terms.set_bytes, job.terms.set_max_bytes = budget, None
        else:
            job.terms.set_by_user(budget, self._allowed_terms(job.name)[1], self.arbiter.pool is not None)
        log.info("job %s: budget %s by uid %d", job.id, "setting cleared" if budget is None else
                 f"set to {job.terms.set_bytes}" if job.terms.set_bytes else f"capped at {budget}", conn.uid)
        self.store.save(job)
        self._rebalance()
        return {"ok": True, "job": job.id}

    async def _end(self, conn, request) -> dict:
        job = self._own_job(conn, request["job"])
        if not job.end_leader(conn.pid):  # other pump-runs of its group still run
            return {"ok": True, "job": job.id, "iteration_launches": job.learned_iterations()}
        # Its rings are read fairly with everyone's, not here: the reply waits for them.
        await self.scheduler.drain(list(job.sessions.values()), DRAIN_TIMEOUT)
        job.close_trace()
        trace = job.trace
        if job.id in self.jobs and not job.alive():
            self._forget(job)
        reply = {"ok": True, "job": job.id, "iteration_launches": job.learned_iterations()}
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

    def _forget(self, job):
        del self.jobs[job.id]
        for s in job.sessions.values():
            s.close()
        job.close_trace()
        self.store.remove(job)
        log.info("job %s (%s) ended", job.id, job.name)
        self._rebalance()

    def _rebalance(self):
        """Budgets anew for every job (one came, went, or was set; a pool changed): the
        scheduler's next slice puts the changed ones in their plans (plan_due)."""
        for job in self.arbiter.apply(self.jobs.values()):
            self.store.save(job)

    def _new_session_id(self) -> int:
        self.next_session += 1
        return self.next_session - 1

    # ---- ingest and plans ----
    def _plan_budget(self, job) -> int:
        """What a lookahead plan keeps to: the job's budget, else its GPU's memory, else 0."""
        return job.budget or lookahead.default_budget(self.telemetry_sample)

    def plan_due(self, job, session) -> bool:
        """A new budget goes out at once; a new lookahead plan at most every PLAN_INTERVAL."""
        planner = session.lookahead
        return session.plan_budget != (job.budget or 0) or (
            planner is not None and planner.fresh and time.monotonic() - session.plan_published >= PLAN_INTERVAL)

    def publish_plan(self, job, session):
        budget = job.budget or 0
        planner = session.lookahead
        # "launch" is the shim's own rule; only "lookahead" adds pumpd's triggers.
        layout, order = EMPTY_LAYOUT, channel.C.PUMP_ORDER_MIGRATED
        if planner is not None:
            if budget != session.plan_budget:
                planner.set_budget(self._plan_budget(job))  # planned for on the planner thread
            layout, order = planner.take_layout(), planner.policy.order
        session.plan.write(budget, order, layout)
        session.plan_budget, session.plan_published = budget, time.monotonic()

    def read_chunk(self, job, session, limit: int) -> tuple:
        """Up to limit records of one session's ring, into its trace and tables (the
        scheduler's work, in its slices): (records read, the decoded batch or None)."""
        records = session.ring.read(limit)
        if not len(records):
            return 0, None
        if job.trace is not None:
            job.trace.write(session.pid, records)
        batch = channel.decode(records)
        session.ingest(batch)
        self.events_ingested += len(records)
        if batch.devices:
            self._place([job])
        return len(records), batch

    def planned(self, job, session):
        """The planner thread has learned a session's batch."""
        job.note_iteration(session)
        if self.plan_due(job, session):
            self.publish_plan(job, session)

    def _place(self, jobs):
        """Each job's GPUs anew from its sessions' DEVICE records (the arbiter matches them
        to NVML's GPUs); budgets anew if any job's changed."""
        moved = False
        for job in jobs:
            uuids = job.gpu_uuids()
            if uuids != job.terms.gpu_uuids:
                log.info("job %s (%s) uses %s", job.id, job.name, ", ".join(uuids) or "no GPU it named")
                job.terms.gpu_uuids = uuids
                self.store.save(job)
                moved = True
        if moved:
            self._rebalance()

    async def _ingest(self):
        # A slice's cost is partly fixed, so slices are paced to read batches: the
        # pause doubles while the fullest ring's chunk holds under 1/16 of its
        # capacity, up to INGEST_INTERVAL_MAX; work left over runs again after the
        # loop has served what waits, and the pause drops to INGEST_INTERVAL_MIN.
        interval = INGEST_INTERVAL_MIN
        while True:
            self.scheduler.run_slice(self.jobs.values())
            if self.scheduler.backlog:
                interval = INGEST_INTERVAL_MIN
                await asyncio.sleep(0)
                continue
            if self.scheduler.fill < 1 / 16:
                interval = min(interval * 2, INGEST_INTERVAL_MAX)
            await asyncio.sleep(interval)

    # ---- liveness ----
    async def _liveness(self):
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(LIVENESS_INTERVAL)
            self.traces.check_timeouts()
            try:
                verdicts = await asyncio.wait_for(loop.run_in_executor(None, self._check_liveness),
                                                  BLOCKING_TIMEOUT)
            except asyncio.TimeoutError:
                log.warning("liveness check took over %g s", BLOCKING_TIMEOUT)
            except OSError as exc:  # /proc unreadable for now (out of descriptors): next round
                self.errors.warning("liveness check", exc.strerror or str(exc))
            else:
                await self._reap(verdicts)
            if self.exit_with is not None and start_time(self.exit_with) is None:
                log.info("pid %d is gone: stopping (embedded pumpd)", self.exit_with)
                self.stop()
            if self.idle_exit is not None:
                self._stop_when_idle()

    def _stop_when_idle(self):
        if self.jobs:
            self.idle_since = None
        elif self.idle_since is None:
            self.idle_since = time.monotonic()
        elif time.monotonic() - self.idle_since >= self.idle_exit:
            log.info("no job for %g s: stopping (shared pumpd)", self.idle_exit)
            self.stop()

    def _check_liveness(self):
        """Which jobs and processes are dead, and each job's process tree (host
        memory and CPU): runs in the thread pool, /proc reads only."""
        verdicts = []
        for job in list(self.jobs.values()):
            job.tree = Telemetry.process_tree(job.leader_pid)
            verdicts.append((job, job.alive(), job.dead_pids()))
        return verdicts

    async def _reap(self, verdicts):
        dying = [s for job, alive, dead in verdicts for pid, s in list(job.sessions.items())
                 if not alive or any(pid == p for p, _ in dead)]
        await self.scheduler.drain(dying, DRAIN_TIMEOUT)  # what dead processes left still counts
        for job, alive, dead in verdicts:
            if job.id not in self.jobs:
                continue
            if job.forget_pids(dead):
                self.store.save(job)
            if not alive:
                self._forget(job)
            elif dead:
                self._place([job])  # its GPUs are those of the processes left

    # ---- telemetry and snapshots ----
    async def _sample_telemetry(self):
        if self.telemetry is None:
            return
        loop = asyncio.get_running_loop()
        while True:
            try:
                self.telemetry_sample = await asyncio.wait_for(
                    loop.run_in_executor(None, self.telemetry.sample), BLOCKING_TIMEOUT)
            except asyncio.TimeoutError:
                log.warning("telemetry took over %g s", BLOCKING_TIMEOUT)
            else:
                self.best_throughput = lookahead.best_throughput(self.telemetry_sample, self.best_throughput)
                if self.arbiter.observe_telemetry(self.telemetry_sample):
                    self._rebalance()  # a pool given as a percentage of the GPU
            await asyncio.sleep(self.telemetry.interval)

    def snapshot(self) -> dict:
        """A copy of the daemon's state, safe to hand to another thread (metrics)."""
        return {
            "jobs": [j.status() for j in list(self.jobs.values())],
            "daemon": {"events_ingested": self.events_ingested,
                       "sessions": sum(len(j.sessions) for j in list(self.jobs.values())),
                       "bad_messages": self.bad_messages,
                       "uptime_s": time.monotonic() - self.started},
            "telemetry": self.telemetry_sample,
        }


def _process_name(pid: int) -> str:
    import psutil
    try:
        # psutil decodes a name UTF-8 cannot (any bytes, with prctl) to lone surrogates
        name = psutil.Process(pid).name().encode("utf-8", "surrogateescape").decode("utf-8", "replace")
        return name[: protocol.NAME_MAX] or f"pid-{pid}"
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return f"pid-{pid}"
