"""pumpd's Prometheus endpoint: a real HTTP server on 127.0.0.1, scraped with urllib."""

import logging
import socket
import sys
import threading
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families


from pumpd.metrics import MetricsServer  # noqa: E402

SNAPSHOT = {
    "jobs": [
        {"job": "j1", "name": "train", "pid": 4242, "uid": 1000, "policy": "launch", "budget_bytes": 8 << 30,
         "resident_bytes": 3 << 30, "launches": 1500, "launches_managed": 1200, "prefetch_bytes": 64 << 30,
         "events": 9000, "events_dropped": 7, "bytes_evicted": 1 << 30},
        {"job": "j2", "name": "eval \"quoted\"", "pid": 4343, "uid": 1001, "policy": "off", "budget_bytes": None,
         "resident_bytes": 0, "launches": 3, "launches_managed": 0, "prefetch_bytes": 0,
         "events": 3, "events_dropped": 0, "bytes_evicted": 0},
    ],
    "daemon": {"events_ingested": 9003, "sessions": 2, "bad_messages": 1, "uptime_s": 12.5},
    "telemetry": {
        "gpus": [{"uuid": "GPU-11111111-2222-3333-4444-555555555555", "index": 0, "name": "Fake A100",
                  "memory_used": 1 << 30, "memory_total": 40 << 30, "pcie_tx_bytes_per_s": 1024000,
                  "pcie_rx_bytes_per_s": None, "utilization_gpu": 37}],
        "host": {"memory_total": 64 << 30, "memory_available": 32 << 30},
        "nvml": "ok",
    },
}


def scrape(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        assert r.status == 200
        assert r.headers["Content-Type"].startswith("text/plain")
        return r.read().decode()


def samples(text):
    """{(name, frozenset(labels.items())): value} of a scrape."""
    return {(s.name, frozenset(s.labels.items())): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


@pytest.fixture
def server():
    servers = []

    def make(snapshot):
        m = MetricsServer(snapshot)
        m.start("127.0.0.1", 0)
        servers.append(m)
        return m
    yield make
    for m in servers:
        m.stop()


def test_scrape(server):
    m = server(lambda: SNAPSHOT)
    assert m.port > 0
    text = scrape(m.port)
    s = samples(text)
    j1 = frozenset({"job": "j1", "name": "train"}.items())
    j2 = frozenset({"job": "j2", "name": "eval \"quoted\""}.items())
    assert s[("pump_job_resident_bytes", j1)] == 3 << 30
    assert s[("pump_job_budget_bytes", j1)] == 8 << 30
    assert ("pump_job_budget_bytes", j2) not in s          # no budget: no sample
    assert s[("pump_job_launches_total", j1)] == 1500
    assert s[("pump_job_launches_managed_total", j1)] == 1200
    assert s[("pump_job_prefetch_bytes_total", j1)] == 64 << 30
    assert s[("pump_job_evicted_bytes_total", j1)] == 1 << 30
    assert s[("pump_job_events_total", j2)] == 3
    assert s[("pump_job_events_dropped_total", j1)] == 7
    assert s[("pump_job_info", frozenset({"job": "j1", "name": "train", "pid": "4242", "uid": "1000",
                                          "policy": "launch"}.items()))] == 1
    assert s[("pump_daemon_events_ingested_total", frozenset())] == 9003
    assert s[("pump_daemon_bad_messages_total", frozenset())] == 1
    assert s[("pump_daemon_sessions", frozenset())] == 2
    assert s[("pump_daemon_uptime_seconds", frozenset())] == 12.5
    gpu = frozenset({"uuid": "GPU-11111111-2222-3333-4444-555555555555", "index": "0"}.items())
    assert s[("pump_gpu_memory_used_bytes", gpu)] == 1 << 30
    assert s[("pump_gpu_memory_total_bytes", gpu)] == 40 << 30
    assert s[("pump_gpu_utilization_ratio", gpu)] == pytest.approx(0.37)
    assert s[("pump_gpu_pcie_tx_bytes_per_second", gpu)] == 1024000
    assert ("pump_gpu_pcie_rx_bytes_per_second", gpu) not in s   # NVML gave None
    assert s[("pump_gpu_info", frozenset(dict(gpu, name="Fake A100").items()))] == 1
    assert s[("pump_nvml_up", frozenset())] == 1
    assert s[("pump_host_memory_available_bytes", frozenset())] == 32 << 30
    assert s[("pump_metrics_snapshot_errors_total", frozenset())] == 0
    # the text format itself: TYPE lines and escaped label values
    assert "# TYPE pump_job_launches_total counter" in text
    assert "# TYPE pump_job_resident_bytes gauge" in text
    assert 'pump_job_resident_bytes{job="j2",name="eval \\"quoted\\""} 0.0' in text
    assert all(n.startswith("pump_") for n, _ in s)


def test_snapshot_called_at_scrape_time(server):
    state = {"n": 0}

    def snap():
        state["n"] += 1
        return {"jobs": [], "daemon": dict(SNAPSHOT["daemon"], sessions=state["n"]), "telemetry": None}

    m = server(snap)
    assert samples(scrape(m.port))[("pump_daemon_sessions", frozenset())] == 1
    s = samples(scrape(m.port))
    assert s[("pump_daemon_sessions", frozenset())] == 2
    assert not any(n.startswith("pump_gpu") or n == "pump_nvml_up" for n, _ in s)  # no telemetry


def test_nvml_down(server):
    m = server(lambda: {"jobs": [], "daemon": None,
                        "telemetry": {"gpus": [], "host": {"memory_total": 1, "memory_available": 1},
                                      "nvml": "nvmlInit failed: no driver"}})
    s = samples(scrape(m.port))
    assert s[("pump_nvml_up", frozenset())] == 0
    assert not any(n.startswith("pump_gpu_memory") for n, _ in s)


@pytest.mark.parametrize("bad", [RuntimeError("lock poisoned"), {"jobs": [{"job": "x"}]}])
def test_snapshot_failure_does_not_break_scrape(server, caplog, bad):
    caplog.set_level(logging.DEBUG, logger="pumpd")

    def snap():
        if isinstance(bad, Exception):
            raise bad
        return bad   # a job without its fields: malformed

    m = server(snap)
    for n in (1, 2, 3):
        s = samples(scrape(m.port))
        assert s[("pump_metrics_snapshot_errors_total", frozenset())] == n
        assert not any(name.startswith("pump_job") for name, _ in s)
    assert m.snapshot_errors == 3
    errors = [r for r in caplog.records if r.name == "pumpd" and r.levelno >= logging.ERROR]
    assert len(errors) == 1 and errors[0].exc_info is not None


def test_concurrent_scrapes(server):
    m = server(lambda: SNAPSHOT)
    results = []
    threads = [threading.Thread(target=lambda: results.append(scrape(m.port))) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 8 and all("pump_job_launches_total" in r for r in results)


def test_stop_frees_port():
    m = MetricsServer(lambda: SNAPSHOT)
    m.start("127.0.0.1", 0)
    port = m.port
    scrape(port)
    m.stop()
    assert m.port is None
    m.stop()  # idempotent
    with pytest.raises(OSError):
        scrape(port)
    # nothing listens there any more: another listener may take the port (a
    # scraped connection may linger in TIME_WAIT, hence SO_REUSEADDR, which still
    # refuses a port that has a listener)
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", port))
    s.listen()
    s.close()
    m2 = MetricsServer(lambda: SNAPSHOT)
    m2.start("127.0.0.1", port)
    try:
        assert m2.port == port and "pump_job_launches_total" in scrape(port)
    finally:
        m2.stop()


def test_binds_given_address_only(server):
    """Reachable on 127.0.0.1, not on another loopback address (0.0.0.0 would be)."""
    m = server(lambda: SNAPSHOT)
    scrape(m.port)
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.2", m.port), timeout=2).close()


def test_start_twice(server):
    m = server(lambda: SNAPSHOT)
    with pytest.raises(RuntimeError):
        m.start("127.0.0.1", 0)
