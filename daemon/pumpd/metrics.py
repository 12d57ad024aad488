"""pumpd's /metrics endpoint in the Prometheus text format (off by default).

``MetricsServer(snapshot, per_job=False).start("127.0.0.1", 9478)`` (TCP) or
``.start_unix("/run/pumpd/metrics.sock")`` serves the metrics below from threads of
its own: the asyncio loop of pumpd is never blocked by a scrape. ``snapshot()`` is
called at scrape time *from those threads*, possibly from several at once: it must
be thread-safe and return data the caller no longer mutates (pumpd hands a function
that returns a copy made under its lock). Its shape::

    {"jobs": [{"job": str, "name": str, "pid": int, "uid": int, "policy": str,
               "budget_bytes": int | None, "resident_bytes": int, "launches": int,
               "launches_managed": int, "prefetch_bytes": int, "events": int,
               "events_dropped": int, "bytes_evicted": int}, ...],
     "users": [{"uid": int, "events_dropped": int, "planner_skipped": int,
                "table_entries_dropped": int, "plan_overruns": int,
                "log_lines_suppressed": int}, ...],   (optional)
     "daemon": {"events_ingested": int, "sessions": int, "bad_messages": int, "reaped_at_close": int,
                "plan_overruns": int, "log_lines_suppressed": int, "uptime_s": float},
     "telemetry": Telemetry.sample() or None}

A snapshot that raises (or has the wrong shape) does not break the endpoint:
the scrape answers with ``pump_metrics_snapshot_errors_total`` only, the error
is counted (``MetricsServer.snapshot_errors``) and logged (the first with its
traceback, later ones at debug level).

Access: an HTTP endpoint has no peer credentials, so what it shows is decided by
where it listens. Every job's counters are summed (``pump_jobs_*``): no name, pid
or owner, and a number of series that does not grow with the jobs. Series per job
(``pump_job_*``, labelled with the job's id and name; ``pump_job_info`` adds its
pid, uid and policy) and per user (``pump_user_*``, labelled with the uid: what each
user made pumpd drop, skip or hold back) only with ``per_job``, which pumpd allows on a Unix socket
alone (mode 0660: its owner and group). Even then at most ``max_jobs`` jobs get
series, the first registered; ``pump_jobs_unlisted`` counts the rest.
The endpoint is one asyncio loop on a thread of its own. A request's head must
arrive whole within HEAD_DEADLINE seconds (an absolute deadline: a client sending a
byte now and then is dropped all the same), at most HEAD_MAX bytes; at most
MAX_CONNECTIONS are open, and one more closes the oldest still sending its head: a
local user's slow connections cannot keep a scraper out, nor make pumpd hold threads.
Local scrapers are best pointed at the Unix socket (mode 0660), which other users
cannot reach at all.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import stat
import threading
from typing import Callable

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

log = logging.getLogger("pumpd")

JOB_LABELS = ["job", "name"]
MAX_CONNECTIONS = 32   # open at once; one more closes the oldest still sending its head
HEAD_DEADLINE = 5.0    # seconds for a request's whole head, however slowly it comes
HEAD_MAX = 8192        # bytes of a request's head
WRITE_DEADLINE = 10.0  # seconds for the answer to be taken
GPU_LABELS = ["uuid", "index"]

# (snapshot key, metric name, help, counter?) per job; counters get "_total".
_JOB_METRICS = [
    ("budget_bytes", "pump_job_budget_bytes", "Caps on GPU-resident bytes (absent when none).", False),
    ("resident_bytes", "pump_job_resident_bytes", "Bytes pump believes resident on the GPU.", False),
    ("launches", "pump_job_launches", "Kernel launches.", True),
    ("launches_managed", "pump_job_launches_managed", "Kernel launches touching managed memory.", True),
    ("prefetch_bytes", "pump_job_prefetch_bytes", "Bytes asked to be prefetched to the GPU.", True),
    ("bytes_evicted", "pump_job_evicted_bytes", "Bytes evicted to host to hold the budget.", True),
    ("events", "pump_job_events", "Events received from the shim.", True),
    ("events_dropped", "pump_job_events_dropped", "Events the shim dropped because the ring was full.", True),
]
_DAEMON_METRICS = [
    ("events_ingested", "pump_daemon_events_ingested", "Events read from all jobs' rings.", True),
    ("bad_messages", "pump_daemon_bad_messages", "Protocol messages rejected as malformed.", True),
    ("reaped_at_close", "pump_daemon_reaped_at_close",
     "Jobs found with a process gone when its session's connection ended, not at a liveness pass.", True),
    ("plan_overruns", "pump_daemon_plan_overruns", "Lookahead planning turns that met their CPU deadline.", True),
    ("log_lines_suppressed", "pump_daemon_log_lines_suppressed", "Log lines held back by the per-user rate limit.",
     True),
    ("sessions", "pump_daemon_sessions", "Open client sessions.", False),
    ("uptime_s", "pump_daemon_uptime_seconds", "Seconds since pumpd started.", False),
]
# (snapshot key, metric name, help) per user, all counters; series only with per_job.
_USER_METRICS = [
    ("events_dropped", "pump_user_events_dropped", "Events the user's shims dropped (live jobs)."),
    ("planner_skipped", "pump_user_planner_skipped_records",
     "Ring records whose launches the lookahead planner skipped (its backlog full; live jobs)."),
    ("table_entries_dropped", "pump_user_table_entries_dropped",
     "Kernel names, allocations and planned blocks past the user's caps (live jobs)."),
    ("plan_overruns", "pump_user_plan_overruns", "Lookahead planning turns that met their CPU deadline."),
    ("log_lines_suppressed", "pump_user_log_lines_suppressed", "Log lines held back by the user's rate limit."),
]
_GPU_METRICS = [
    ("memory_used", "pump_gpu_memory_used_bytes", "GPU memory in use (NVML).", 1),
    ("memory_total", "pump_gpu_memory_total_bytes", "GPU memory in all (NVML).", 1),
    ("utilization_gpu", "pump_gpu_utilization_ratio", "Fraction of the last sample period a kernel ran (NVML).", 0.01),
    ("pcie_tx_bytes_per_s", "pump_gpu_pcie_tx_bytes_per_second", "PCIe bytes per second sent by the GPU (NVML).", 1),
    ("pcie_rx_bytes_per_s", "pump_gpu_pcie_rx_bytes_per_second", "PCIe bytes per second received by the GPU (NVML).", 1),
]


def _label(value) -> str:
    """A label value the text format can carry: a name pumpd never validated (a job file of
    an older pumpd) may hold lone surrogates, which UTF-8 cannot encode; they are escaped."""
    return str(value).encode("utf-8", "backslashreplace").decode("utf-8")


def _job_families(jobs: list, per_job: bool, max_jobs: int) -> list:
    """The sums over all jobs, and with ``per_job`` the series of the first
    ``max_jobs`` jobs (raises on a malformed job)."""
    count = GaugeMetricFamily("pump_jobs", "Jobs pumpd serves.")
    count.add_metric([], len(jobs))
    out = [count]
    for key, name, doc, counter in _JOB_METRICS:
        values = [j[key] for j in jobs if j[key] is not None]
        total = (CounterMetricFamily if counter else GaugeMetricFamily)(
            name.replace("pump_job_", "pump_jobs_", 1), doc + " Summed over jobs.")
        total.add_metric([], sum(values))
        out.append(total)
    if not per_job:
        return out
    listed = jobs[:max_jobs]
    unlisted = GaugeMetricFamily("pump_jobs_unlisted", "Jobs without series of their own (over max_jobs).")
    unlisted.add_metric([], len(jobs) - len(listed))
    out.append(unlisted)
    info = GaugeMetricFamily("pump_job_info", "One per job: its pid, owner uid and policy.",
                             labels=JOB_LABELS + ["pid", "uid", "policy"])
    for j in listed:
        info.add_metric([_label(j[k]) for k in ("job", "name", "pid", "uid", "policy")], 1)
    out.append(info)
    for key, name, doc, counter in _JOB_METRICS:
        fam = (CounterMetricFamily if counter else GaugeMetricFamily)(name, doc, labels=JOB_LABELS)
        for j in listed:
            if j[key] is not None:
                fam.add_metric([_label(j["job"]), _label(j["name"])], j[key])
        out.append(fam)
    return out


def _user_families(users: list, max_users: int) -> list:
    """Series per uid (only where per_job is allowed: they name owners), of the first
    ``max_users`` uids."""
    out = []
    for key, name, doc in _USER_METRICS:
        fam = CounterMetricFamily(name, doc, labels=["uid"])
        for u in users[:max_users]:
            fam.add_metric([_label(u["uid"])], u[key])
        out.append(fam)
    return out


def _families(snap: dict, per_job: bool, max_jobs: int) -> list:
    """The metric families of one snapshot (raises on a malformed one)."""
    out = _job_families(list(snap.get("jobs") or []), per_job, max_jobs)
    if per_job:
        out += _user_families(list(snap.get("users") or []), max_jobs)

    daemon = snap.get("daemon")
    if daemon:
        for key, name, doc, counter in _DAEMON_METRICS:
            if daemon.get(key) is not None:
                fam = (CounterMetricFamily if counter else GaugeMetricFamily)(name, doc)
                fam.add_metric([], daemon[key])
                out.append(fam)

    tel = snap.get("telemetry")
    if tel:
        up = GaugeMetricFamily("pump_nvml_up", "1 if NVML answers, 0 if GPU telemetry is unavailable.")
        up.add_metric([], 1 if tel.get("nvml") == "ok" else 0)
        out.append(up)
        gpus = tel.get("gpus") or []
        ginfo = GaugeMetricFamily("pump_gpu_info", "One per GPU: its name.", labels=GPU_LABELS + ["name"])
        for g in gpus:
            ginfo.add_metric([_label(g.get("uuid") or ""), _label(g["index"]), _label(g.get("name") or "")], 1)
        out.append(ginfo)
        for key, name, doc, scale in _GPU_METRICS:
            fam = GaugeMetricFamily(name, doc, labels=GPU_LABELS)
            for g in gpus:
                if g.get(key) is not None:
                    fam.add_metric([str(g.get("uuid") or ""), str(g["index"])], g[key] * scale)
            out.append(fam)
        host = tel.get("host") or {}
        for key, name, doc in (("memory_total", "pump_host_memory_total_bytes", "Host memory in all."),
                               ("memory_available", "pump_host_memory_available_bytes",
                                "Host memory available without swapping.")):
            if host.get(key) is not None:
                fam = GaugeMetricFamily(name, doc)
                fam.add_metric([], host[key])
                out.append(fam)
    return out


class _Collector:
    """Calls the snapshot at every scrape (prometheus_client's custom collector)."""

    def __init__(self, server: "MetricsServer"):
        self._server = server

    def collect(self):
        fams = self._server._collect()
        errors = CounterMetricFamily("pump_metrics_snapshot_errors",
                                     "Scrapes whose snapshot of pumpd's state failed.")
        errors.add_metric([], self._server.snapshot_errors)
        return fams + [errors]


def _response(status: str, body: bytes, content_type: str = "text/plain; charset=utf-8") -> bytes:
    return (f"HTTP/1.0 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {len(body)}\r\n"
            "Connection: close\r\n\r\n").encode() + body


class _Connections:
    """The open connections, MAX_CONNECTIONS at most: one more closes the oldest still
    sending its head (a scraper sends its head at once, so that is a slow one), or, if
    none is, is closed itself."""

    def __init__(self):
        self.reading = {}   # task -> when it connected (insertion order: oldest first)
        self.writing = set()

    def admit(self, task) -> bool:
        if len(self.reading) + len(self.writing) >= MAX_CONNECTIONS:
            if not self.reading:
                return False
            oldest = next(iter(self.reading))
            del self.reading[oldest]
            oldest.cancel()
        self.reading[task] = True
        return True

    def head_read(self, task):
        self.reading.pop(task, None)
        self.writing.add(task)

    def done(self, task):
        self.reading.pop(task, None)
        self.writing.discard(task)

    def cancel_all(self):
        for task in [*self.reading, *self.writing]:
            task.cancel()


class MetricsServer:
    """The /metrics HTTP endpoint; see the module's doc."""

    def __init__(self, snapshot: Callable[[], dict], per_job: bool = False, max_jobs: int = 100):
        self._snapshot = snapshot
        self.per_job, self.max_jobs = per_job, max_jobs
        self._lock = threading.Lock()
        self.snapshot_errors = 0
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_Collector(self))
        self._thread = None
        self.port: int | None = None
        self.path: str | None = None

    def _collect(self) -> list:
        try:
            return _families(self._snapshot(), self.per_job, self.max_jobs)
        except Exception:
            with self._lock:
                self.snapshot_errors += 1
                first = self.snapshot_errors == 1
            if first:
                log.error("metrics: taking pumpd's snapshot failed (counted in "
                          "pump_metrics_snapshot_errors_total; later failures log at debug level)",
                          exc_info=True)
            else:
                log.debug("metrics: taking pumpd's snapshot failed", exc_info=True)
            return []

    async def _scrape(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        """One connection: its head within HEAD_DEADLINE (however slowly it trickles in),
        the answer written within WRITE_DEADLINE, then closed."""
        task = asyncio.current_task()
        if not self._connections.admit(task):
            writer.close()
            return
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), HEAD_DEADLINE)
            self._connections.head_read(task)
            parts = head.split(b"\r\n", 1)[0].split()
            if len(parts) != 3 or parts[0] != b"GET":
                answer = _response("405 Method Not Allowed", b"only GET /metrics is served\n")
            elif parts[1].split(b"?", 1)[0] not in (b"/metrics", b"/"):
                answer = _response("404 Not Found", b"only /metrics is served\n")
            else:
                try:
                    answer = _response("200 OK", generate_latest(self.registry), CONTENT_TYPE_LATEST)
                except Exception:
                    log.error("metrics: writing the scrape's answer failed", exc_info=True)
                    answer = _response("500 Internal Server Error", b"see pumpd's log\n")
            writer.write(answer)
            await asyncio.wait_for(writer.drain(), WRITE_DEADLINE)
        except (asyncio.TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError,
                asyncio.CancelledError):
            pass   # too slow, too long, gone, or closed for a newer one: nothing to answer
        finally:
            self._connections.done(task)
            writer.close()

    def start(self, host: str, port: int) -> None:
        """Listen on host:port (that address only; pump.config.parse_listen reads
        pumpd.toml's "HOST:PORT"); ``.port`` is the port bound (useful with port 0).
        OSError if it cannot be bound."""
        if self.per_job:
            raise ValueError("metrics: series per job only on a Unix socket (over TCP every "
                             "local user could read every job's name, pid and owner)")
        sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, port))
        except BaseException:
            sock.close()
            raise
        self._serve(sock)
        self.port = sock.getsockname()[1]

    def start_unix(self, path: str) -> None:
        """Listen on a Unix socket at ``path``, mode 0660 (its owner and group may
        scrape; other users may not connect). A socket left there by an earlier pumpd
        is replaced; any other file is an error (OSError)."""
        try:
            if not stat.S_ISSOCK(os.lstat(path).st_mode):
                raise FileExistsError(f"metrics: {path} exists and is not a socket")
            os.unlink(path)
        except FileNotFoundError:
            pass
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o117)   # born 0660: no moment when others could connect
        try:
            sock.bind(path)
        except BaseException:
            sock.close()
            raise
        finally:
            os.umask(old)
        self._serve(sock)
        self.path = path

    def _serve(self, sock: socket.socket) -> None:
        """Serve sock from an asyncio loop on a thread of its own (pumpd's loop is never
        held by a scrape)."""
        if self._thread is not None:
            sock.close()
            raise RuntimeError("metrics server already started")
        try:
            sock.listen(64)
            sock.setblocking(False)
        except BaseException:
            sock.close()
            raise
        loop = asyncio.new_event_loop()
        ready = threading.Event()

        async def serve():
            self._connections = _Connections()
            start = asyncio.start_unix_server if sock.family == socket.AF_UNIX else asyncio.start_server
            self._server = await start(self._scrape, sock=sock, limit=HEAD_MAX)
            self._stopped = asyncio.Event()
            ready.set()
            await self._stopped.wait()
            self._server.close()
            self._connections.cancel_all()
            await self._server.wait_closed()

        def run():
            try:
                loop.run_until_complete(serve())
            finally:
                ready.set()
                loop.close()

        self._loop = loop
        self._thread = threading.Thread(target=run, name="pumpd-metrics", daemon=True)
        self._thread.start()
        ready.wait()

    def stop(self) -> None:
        """Stop serving and close the listening socket (idempotent); a Unix socket's
        file is removed."""
        thread, self._thread = self._thread, None
        if thread is None:
            return
        self._loop.call_soon_threadsafe(self._stopped.set)
        thread.join(timeout=5)
        self.port = None
        if self.path is not None:
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass
            self.path = None
