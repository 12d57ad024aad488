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
     "daemon": {"events_ingested": int, "sessions": int, "bad_messages": int,
                "uptime_s": float},
     "telemetry": Telemetry.sample() or None}

A snapshot that raises (or has the wrong shape) does not break the endpoint:
the scrape answers with ``pump_metrics_snapshot_errors_total`` only, the error
is counted (``MetricsServer.snapshot_errors``) and logged (the first with its
traceback, later ones at debug level).

Access: an HTTP endpoint has no peer credentials, so what it shows is decided by
where it listens. Every job's counters are summed (``pump_jobs_*``): no name, pid
or owner, and a number of series that does not grow with the jobs. Series per job
(``pump_job_*``, labelled with the job's id and name; ``pump_job_info`` adds its
pid, uid and policy) only with ``per_job``, which pumpd allows on a Unix socket
alone (mode 0660: its owner and group). Even then at most ``max_jobs`` jobs get
series, the first registered; ``pump_jobs_unlisted`` counts the rest.
At most MAX_SCRAPES scrapes are served at once (more are closed at once), and a
client silent for CLIENT_TIMEOUT seconds is dropped: a local user cannot make
pumpd hold threads.
"""

from __future__ import annotations

import http.server
import logging
import os
import socket
import socketserver
import stat
import threading
from typing import Callable

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

log = logging.getLogger("pumpd")

JOB_LABELS = ["job", "name"]
MAX_SCRAPES = 8
CLIENT_TIMEOUT = 10.0
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
    ("sessions", "pump_daemon_sessions", "Open client sessions.", False),
    ("uptime_s", "pump_daemon_uptime_seconds", "Seconds since pumpd started.", False),
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


def _families(snap: dict, per_job: bool, max_jobs: int) -> list:
    """The metric families of one snapshot (raises on a malformed one)."""
    out = _job_families(list(snap.get("jobs") or []), per_job, max_jobs)

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


class _Scrape(http.server.BaseHTTPRequestHandler):
    """GET /metrics (or /): the registry in the text format; nothing else."""

    timeout = CLIENT_TIMEOUT
    protocol_version = "HTTP/1.0"

    def do_GET(self):
        if self.path.split("?", 1)[0] not in ("/metrics", "/"):
            self.send_error(404, "only /metrics is served")
            return
        body = generate_latest(self.server.registry)
        self.send_response(200)
        self.send_header("Content-Type", CONTENT_TYPE_LATEST)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def address_string(self):
        return str(self.client_address or "unix")

    def log_message(self, format, *args):
        pass


class _Bounded(socketserver.ThreadingMixIn):
    """A thread per scrape, MAX_SCRAPES at most: one over the limit is closed at once."""

    daemon_threads = True
    block_on_close = False
    request_queue_size = 64   # the listen() backlog; socketserver's default of 5 makes connects wait

    def setup_limits(self, registry):
        self.registry = registry
        self.slots = threading.BoundedSemaphore(MAX_SCRAPES)

    def process_request(self, request, client_address):
        if not self.slots.acquire(blocking=False):
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.slots.release()
            raise

    def process_request_thread(self, request, client_address):
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()


class _TCPServer(_Bounded, socketserver.TCPServer):
    allow_reuse_address = True


class _TCP6Server(_TCPServer):
    address_family = socket.AF_INET6


class _UnixServer(_Bounded, socketserver.UnixStreamServer):
    pass


class MetricsServer:
    """The /metrics HTTP endpoint; see the module's doc."""

    def __init__(self, snapshot: Callable[[], dict], per_job: bool = False, max_jobs: int = 100):
        self._snapshot = snapshot
        self.per_job, self.max_jobs = per_job, max_jobs
        self._lock = threading.Lock()
        self.snapshot_errors = 0
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_Collector(self))
        self._httpd = None
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

    def start(self, host: str, port: int) -> None:
        """Listen on host:port (that address only; pump.config.parse_listen reads
        pumpd.toml's "HOST:PORT"); ``.port`` is the port bound (useful with port 0).
        OSError if it cannot be bound."""
        if self.per_job:
            raise ValueError("metrics: series per job only on a Unix socket (over TCP every "
                             "local user could read every job's name, pid and owner)")
        cls = _TCP6Server if ":" in host else _TCPServer
        self._serve(cls((host, port), _Scrape, bind_and_activate=False), lambda s: s.server_bind())
        self.port = self._httpd.server_address[1]

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

        def bind(server):
            old = os.umask(0o117)   # born 0660: no moment when others could connect
            try:
                server.server_bind()
            finally:
                os.umask(old)
        self._serve(_UnixServer(path, _Scrape, bind_and_activate=False), bind)
        self.path = path

    def _serve(self, httpd, bind) -> None:
        if self._httpd is not None:
            httpd.server_close()
            raise RuntimeError("metrics server already started")
        httpd.setup_limits(self.registry)
        try:
            bind(httpd)
            httpd.server_activate()
        except BaseException:
            httpd.server_close()
            raise
        self._httpd = httpd
        self._thread = threading.Thread(target=httpd.serve_forever, name="pumpd-metrics", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop serving and close the listening socket (idempotent); a Unix socket's
        file is removed."""
        httpd, self._httpd = self._httpd, None
        if httpd is None:
            return
        httpd.shutdown()
        httpd.server_close()
        self._thread.join(timeout=5)
        self._thread = None
        self.port = None
        if self.path is not None:
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass
            self.path = None
