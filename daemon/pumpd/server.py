"""pumpd's event loop: the socket, the sessions, ingest, liveness, telemetry
(what each request does is in requests.py).

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
from pumpd.arbiter import Arbiter
from pumpd.connection import Connection, Descriptors, RequestError, peer_credentials
from pumpd.jobs import JobStore, start_time
from pumpd import identity, limits, lookahead, systemd, tracing
from pumpd.requests import DRAIN_TIMEOUT, GONE, Requests
from pumpd.scheduler import Scheduler
from pumpd.tasks import RateLimitedLog, stop_tasks, supervised
from pumpd.telemetry import Telemetry
from pumpd.userlog import user_log

log = logging.getLogger("pumpd")

INGEST_INTERVAL_MIN = 0.005  # seconds between ring sweeps, at the busiest
INGEST_INTERVAL_MAX = 0.025  # ... and when rings are nearly idle: a 64K-record ring
                             # takes 32 ms to fill at 2M events/s
FLUSH_SECONDS = 2.0          # the most pumpd's stop spends reading what rings still hold
SLOW_CALLBACK_SECONDS = 0.1  # PYTHONASYNCIODEBUG=1: asyncio logs a callback that held the loop longer
LIVENESS_INTERVAL = 0.5      # a dead job's session goes within 2 s
CLOSED_CHECK_DELAY = 0.05    # a session whose connection ended is looked at this soon (and at each pass)
TREE_ROUNDS = 10             # the jobs' process trees (host memory, CPU) are read every 10th pass: 5 s
PLAN_INTERVAL = 0.2          # a session's plan is rewritten at most this often
BLOCKING_TIMEOUT = 5.0       # psutil/NVML calls in the thread pool
EMPTY_LAYOUT = channel.Plan.layout({})  # a plan with a budget and no triggers
TABLES_DROPPED = ("functions_dropped", "allocations_dropped", "planned_blocks_dropped")  # Job.status()'s


def _verdict(job) -> tuple:
    """(job, whether it lives, its processes found gone): what _reap acts on (reads /proc)."""
    return job, job.alive(), job.dead_pids()


class Daemon(Requests):
    def __init__(self, socket_path: str, state_dir: str, exit_with: int = None,
                 socket_mode: int = 0o600, telemetry=None, metrics_listen: str = None,
                 default_budget: int = None, jobs_dir: str = config.DEFAULT_JOBS_DIR,
                 gpu_pool: str = None, idle_exit: float = None, metrics_options: dict = None,
                 admin_socket: str = None):
        self.socket_path = socket_path
        self.admin_socket = admin_socket  # the administrator's socket to bind, or None
        self.errors = RateLimitedLog()
        self.store = JobStore(state_dir, self.errors)
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
        self.scheduler = Scheduler(self, self.errors)  # ring reading and planning, fair between users
        self.serving = set()           # the connections' tasks
        self.bad_messages = 0
        self.checking = set()          # jobs looked at now, a session's connection having ended
        self.reaped_at_close = 0       # those found with a process gone (the rest wait for the passes)
        self.said_status = None         # the last STATUS= told systemd
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
        tasks = [asyncio.create_task(supervised(name, body, self.errors), name=name) for name, body in bodies.items()]
        log.info("listening on %s", self.socket_path)
        if ready is not None:
            ready()
        try:
            await self.stopping.wait()
        finally:
            await stop_tasks(tasks)
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
            self.store.close()  # the job files' last writes
            if self.exit_with is not None:
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
            except identity.ProcessGone:
                conn.realm = None  # its first request is answered that it is gone (below)
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
                    if conn.realm is None:  # which pod it was in is unknown: nothing is done for it
                        await conn.send({"error": GONE}, protocol.ERROR)
                        break
                    reply, reply_fds = await self._handled(conn, request, fds)
                    await conn.send(reply, fds=reply_fds)
                except ProtocolError as exc:
                    self.bad_messages += 1
                    user_log.info(conn.uid, "pid %s: bad message: %s", conn.pid, printable(str(exc)))
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
                self._check_soon(conn.job)
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

    # ---- ingest and plans ----
    def _plan_budget(self, job, session) -> int:
        """What a lookahead plan keeps to: the job's budget, else the one the process's shim
        holds above the device's memory (BUDGET records), else its GPU's memory, else 0."""
        return job.budget or session.own_budget or lookahead.default_budget(self.telemetry_sample)

    def _plan_bandwidth(self, session) -> float:
        """The link rate a lookahead plan assumes (lookahead.bandwidth says which)."""
        return lookahead.bandwidth(session.link_rate, self.best_throughput)

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
                planner.set_budget(self._plan_budget(job, session))  # planned for in the planner's process
            layout, order = planner.take_layout(), planner.order
        if not session.plan.write(budget, order, layout) and session.plan.unmade_writes == 1:
            log.warning("session %d (pid %d): its shim did not make its plan's memory (pump/channel.py, "
                        "Plan.pages_made): lookahead's triggers are left out of its plans until it does",
                        session.id, session.pid)
        session.plan_budget, session.plan_published = budget, time.monotonic()

    def read_chunk(self, job, session, limit: int) -> int:
        """Up to limit records of one session's ring, into its trace, its tables and its
        planner's backlog (the scheduler's work, in its slices): the records read."""
        records = session.ring.read(limit)
        if not len(records):
            return 0
        if job.trace is not None:
            job.trace.write(session.pid, records)
        batch = channel.decode(records)
        session.ingest(batch)
        if batch.budgets and session.lookahead is not None:
            session.lookahead.set_budget(self._plan_budget(job, session))
        if batch.links:
            job.note_link(session)
            if session.lookahead is not None:
                session.lookahead.set_bandwidth(self._plan_bandwidth(session))
        self.events_ingested += len(records)
        if batch.devices:
            self._place([job])
        return len(records)

    def planned(self, job, session):
        """The planner's process has learned a session's batch."""
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
        rounds = 0
        while True:
            await asyncio.sleep(LIVENESS_INTERVAL)
            self.traces.check_timeouts()
            user_log.flush()  # each user's held-back log lines, counted in one line
            trees, rounds = rounds % TREE_ROUNDS == 0, rounds + 1
            try:
                verdicts = await asyncio.wait_for(loop.run_in_executor(None, self._check_liveness, trees),
                                                  BLOCKING_TIMEOUT)
            except asyncio.TimeoutError:
                log.warning("liveness check took over %g s", BLOCKING_TIMEOUT)
            except OSError as exc:  # /proc unreadable for now (out of descriptors): next round
                self.errors.warning("liveness check", exc.strerror or str(exc))
            else:
                await self._reap(verdicts)
            self._say_status()
            if self.exit_with is not None and start_time(self.exit_with) is None:
                log.info("pid %d is gone: stopping (embedded pumpd)", self.exit_with)
                self.stop()
            if self.idle_exit is not None:
                self._stop_when_idle()

    def _say_status(self):
        """systemd's STATUS= (what `systemctl status pumpd` shows), when it changes: jobs, users,
        sessions, and the jobs whose state pumpd could not save."""
        users = {job.uid for job in self.jobs.values()}
        sessions = sum(len(job.sessions) for job in self.jobs.values())
        n = len(self.jobs)
        text = (f"serving {n} job{'s' if n != 1 else ''} of {len(users)} user{'s' if len(users) != 1 else ''}, "
                f"{sessions} session{'s' if sessions != 1 else ''}")
        if self.store.unsaved:
            text += f"; {len(self.store.unsaved)} not saved (state directory: {next(iter(self.store.unsaved.values()))})"
        if text != self.said_status:
            self.said_status = text
            systemd.notify("STATUS=" + text)

    def _stop_when_idle(self):
        if self.jobs:
            self.idle_since = None
        elif self.idle_since is None:
            self.idle_since = time.monotonic()
        elif time.monotonic() - self.idle_since >= self.idle_exit:
            log.info("no job for %g s: stopping (shared pumpd)", self.idle_exit)
            self.stop()

    def _check_soon(self, job):
        """A session's connection ended: its process is exiting, or gone. Its job is looked at
        CLOSED_CHECK_DELAY later (an exiting process closes its files before it is a zombie),
        not at the next pass; one look per job at a time, whatever a user's connections do."""
        if job.id in self.checking or job.id not in self.jobs:
            return
        self.checking.add(job.id)
        asyncio.get_running_loop().create_task(self._check_job(job))

    async def _check_job(self, job):
        try:
            await asyncio.sleep(CLOSED_CHECK_DELAY)
            if job.id not in self.jobs or (self.stopping is not None and self.stopping.is_set()):
                return
            loop = asyncio.get_running_loop()
            verdict = await asyncio.wait_for(loop.run_in_executor(None, _verdict, job), BLOCKING_TIMEOUT)
            if not verdict[1] or verdict[2]:
                self.reaped_at_close += 1
            await self._reap([verdict])
        except (asyncio.TimeoutError, OSError) as exc:  # the next pass looks again
            self.errors.warning("liveness check", str(exc) or type(exc).__name__)
        finally:
            self.checking.discard(job.id)

    def _check_liveness(self, trees: bool):
        """Which jobs and processes are dead (a /proc/PID/stat read per known process), and with
        `trees` each job's process tree (host memory and CPU: the whole process table, read once):
        runs in the thread pool."""
        jobs = list(self.jobs.values())
        if trees:
            by_leader = Telemetry.process_trees({job.leader_pid for job in jobs})
            for job in jobs:
                job.tree = by_leader[job.leader_pid]
        return [_verdict(job) for job in jobs]

    async def _reap(self, verdicts):
        dying = [s for job, alive, dead in verdicts for pid, s in list(job.sessions.items())
                 if not alive or any(pid == p for p, _ in dead)]
        await self.scheduler.drain(dying, DRAIN_TIMEOUT)  # what dead processes left still counts
        gone = False
        for job, alive, dead in verdicts:
            if job.id not in self.jobs:
                continue
            if job.forget_pids(dead):
                self.store.save(job)
            if not alive:
                self._forget(job, rebalance=False)
                gone = True
            elif dead:
                self._place([job])  # its GPUs are those of the processes left
        if gone:
            self._rebalance()  # once for every job gone in this pass (1,792 at once took 5.5 s one by one)

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
        jobs = [j.status() for j in list(self.jobs.values())]
        users = per_user(jobs, dict(self.scheduler.overruns), dict(user_log.suppressed))
        return {
            "jobs": jobs,
            "users": users,
            "daemon": {"events_ingested": self.events_ingested,
                       "sessions": sum(len(j.sessions) for j in list(self.jobs.values())),
                       "bad_messages": self.bad_messages,
                       "reaped_at_close": self.reaped_at_close,
                       "plan_overruns": sum(self.scheduler.overruns.values()),
                       "log_lines_suppressed": sum(user_log.suppressed.values()) + user_log.suppressed_unknown,
                       "uptime_s": time.monotonic() - self.started},
            "telemetry": self.telemetry_sample,
        }


def per_user(jobs: list, overruns: dict, suppressed: dict) -> list:
    """What each user made pumpd drop, skip or hold back (for the administrator's metrics): from
    the jobs' status (their live sessions) and pumpd's counts since it started, by uid."""
    users = {}

    def row(uid):
        return users.setdefault(uid, {"uid": uid, "events_dropped": 0, "planner_skipped": 0,
                                      "table_entries_dropped": 0, "plan_overruns": 0, "log_lines_suppressed": 0})
    for job in jobs:
        r = row(job["uid"])
        r["events_dropped"] += job["events_dropped"]
        r["planner_skipped"] += job["planner_skipped"]
        r["table_entries_dropped"] += sum(job[k] for k in TABLES_DROPPED)
    for uid, n in overruns.items():
        row(uid)["plan_overruns"] = n
    for uid, n in suppressed.items():
        row(uid)["log_lines_suppressed"] = n
    return sorted(users.values(), key=lambda r: r["uid"])

