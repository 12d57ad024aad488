"""pumpd's /metrics endpoint in the Prometheus text format (off by default).

``MetricsServer(snapshot).start("127.0.0.1", 9478)`` serves every metric below
from prometheus_client's own HTTP server, which runs in threads of its own: the
asyncio loop of pumpd is never blocked by a scrape. ``snapshot()`` is called at
scrape time *from those threads*, possibly from several at once: it must be
thread-safe and return data the caller no longer mutates (pumpd hands a
function that returns a copy made under its lock). Its shape::

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

Access: the endpoint has no peer credentials; whoever reaches the address sees
every job's name, pid, uid and counters. Enabling it is the administrator's
choice; bind it to 127.0.0.1 (or a monitoring-only interface).
"""

from __future__ import annotations

import logging
import threading
from typing import Callable

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import start_http_server

log = logging.getLogger("pumpd")

JOB_LABELS = ["job", "name"]
GPU_LABELS = ["uuid", "index"]

# (snapshot key, metric name, help, counter?) per job; counters get "_total".
_JOB_METRICS = [
    ("budget_bytes", "pump_job_budget_bytes", "The job's cap on GPU-resident bytes (absent when none).", False),
    ("resident_bytes", "pump_job_resident_bytes", "Bytes pump believes resident on the GPU for the job.", False),
    ("launches", "pump_job_launches", "Kernel launches.", True),
    ("launches_managed", "pump_job_launches_managed", "Kernel launches touching managed memory.", True),
    ("prefetch_bytes", "pump_job_prefetch_bytes", "Bytes asked to be prefetched to the GPU.", True),
    ("bytes_evicted", "pump_job_evicted_bytes", "Bytes evicted to host to hold the budget.", True),
    ("events", "pump_job_events", "Events received from the job's shim.", True),
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


def _families(snap: dict) -> list:
    """The metric families of one snapshot (raises on a malformed one)."""
    out = []
    jobs = snap.get("jobs") or []
    info = GaugeMetricFamily("pump_job_info", "One per job: its pid, owner uid and policy.",
                             labels=JOB_LABELS + ["pid", "uid", "policy"])
    for j in jobs:
        info.add_metric([str(j["job"]), str(j["name"]), str(j["pid"]), str(j["uid"]), str(j["policy"])], 1)
    out.append(info)
    for key, name, doc, counter in _JOB_METRICS:
        fam = (CounterMetricFamily if counter else GaugeMetricFamily)(name, doc, labels=JOB_LABELS)
        for j in jobs:
            if j.get(key) is not None:
                fam.add_metric([str(j["job"]), str(j["name"])], j[key])
        out.append(fam)

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
            ginfo.add_metric([str(g.get("uuid") or ""), str(g["index"]), str(g.get("name") or "")], 1)
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


class MetricsServer:
    """The /metrics HTTP endpoint; see the module's doc for ``snapshot``."""

    def __init__(self, snapshot: Callable[[], dict]):
        self._snapshot = snapshot
        self._lock = threading.Lock()
        self.snapshot_errors = 0
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_Collector(self))
        self._httpd = None
        self._thread = None
        self.port: int | None = None

    def _collect(self) -> list:
        try:
            return _families(self._snapshot())
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
        pumpd.toml's "HOST:PORT") and serve in background threads; ``.port`` is
        the port bound (useful with port 0). OSError if it cannot be bound."""
        if self._httpd is not None:
            raise RuntimeError("metrics server already started")
        self._httpd, self._thread = start_http_server(port, addr=host, registry=self.registry)
        self.port = self._httpd.server_port

    def stop(self) -> None:
        """Stop serving and close the listening socket (idempotent)."""
        httpd, self._httpd = self._httpd, None
        if httpd is None:
            return
        httpd.shutdown()
        httpd.server_close()
        self._thread.join(timeout=5)
        self._thread = None
        self.port = None
