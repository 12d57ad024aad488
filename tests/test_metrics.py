"""pumpd's Prometheus endpoint: a real HTTP server on 127.0.0.1 (sums over jobs only)
or on a Unix socket (series per job allowed), scraped with urllib and http.client."""

import http.client
import logging
import os
import socket
import stat
import threading
import time
import urllib.error
import urllib.request

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
    "users": [{"uid": 1000, "events_dropped": 7, "planner_skipped": 4096, "table_entries_dropped": 2,
               "plan_overruns": 3, "log_lines_suppressed": 11}],
    "daemon": {"events_ingested": 9003, "sessions": 2, "bad_messages": 1, "reaped_at_close": 4, "plan_overruns": 3,
               "log_lines_suppressed": 11, "uptime_s": 12.5},
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


class UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path):
        super().__init__("pumpd", timeout=10)
        self.unix_path = path

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(10)
        self.sock.connect(self.unix_path)


def scrape_unix(path, url="/metrics"):
    c = UnixHTTPConnection(path)
    try:
        c.request("GET", url)
        r = c.getresponse()
        assert r.status == 200, r.status
        assert r.getheader("Content-Type").startswith("text/plain")
        return r.read().decode()
    finally:
        c.close()


def samples(text):
    """{(name, frozenset(labels.items())): value} of a scrape."""
    return {(s.name, frozenset(s.labels.items())): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


@pytest.fixture
def server(tmp_path):
    """make(snapshot): on 127.0.0.1; make(snapshot, per_job=True, ...): on a Unix socket
    (``.scrape()`` either way)."""
    servers = []

    def make(snapshot, **options):
        m = MetricsServer(snapshot, **options)
        if options.get("per_job"):
            m.start_unix(str(tmp_path / "metrics.sock"))
            m.scrape = lambda: scrape_unix(m.path)
        else:
            m.start("127.0.0.1", 0)
            m.scrape = lambda: scrape(m.port)
        servers.append(m)
        return m
    yield make
    for m in servers:
        m.stop()


def test_scrape_per_job(server):
    m = server(lambda: SNAPSHOT, per_job=True)
    text = m.scrape()
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
    assert s[("pump_daemon_plan_overruns_total", frozenset())] == 3
    assert s[("pump_daemon_log_lines_suppressed_total", frozenset())] == 11
    uid = frozenset({"uid": "1000"}.items())
    assert s[("pump_user_events_dropped_total", uid)] == 7
    assert s[("pump_user_planner_skipped_records_total", uid)] == 4096
    assert s[("pump_user_table_entries_dropped_total", uid)] == 2
    assert s[("pump_user_plan_overruns_total", uid)] == 3
    assert s[("pump_user_log_lines_suppressed_total", uid)] == 11
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
    assert s[("pump_jobs_unlisted", frozenset())] == 0


def test_tcp_shows_sums_over_jobs_only(server):
    m = server(lambda: SNAPSHOT)
    assert m.port > 0
    text = scrape(m.port)
    s = samples(text)
    assert s[("pump_jobs", frozenset())] == 2
    assert s[("pump_jobs_launches_total", frozenset())] == 1503
    assert s[("pump_jobs_resident_bytes", frozenset())] == 3 << 30
    assert s[("pump_jobs_budget_bytes", frozenset())] == 8 << 30       # j2 has none
    assert s[("pump_jobs_events_dropped_total", frozenset())] == 7
    assert not any(n.startswith(("pump_job_", "pump_user_")) for n, _ in s)
    assert s[("pump_daemon_plan_overruns_total", frozenset())] == 3
    for secret in ("train", "4242", "1000", "j1", "quoted"):
        assert secret not in text
    assert s[("pump_daemon_sessions", frozenset())] == 2


def test_a_name_utf8_cannot_encode_does_not_break_the_scrape(server):
    """pumpd refuses such names now, but a job file of an older pumpd may hold one."""
    snap = dict(SNAPSHOT, jobs=[dict(SNAPSHOT["jobs"][0], name="evil\ud800")])
    m = server(lambda: snap, per_job=True)
    s = samples(m.scrape())
    assert s[("pump_job_launches_total", frozenset({"job": "j1", "name": "evil\\ud800"}.items()))] == 1500


def test_per_job_series_refused_over_tcp():
    m = MetricsServer(lambda: SNAPSHOT, per_job=True)
    with pytest.raises(ValueError, match="only on a Unix socket"):
        m.start("127.0.0.1", 0)
    assert m.port is None


def test_series_per_job_are_capped(server):
    jobs = [dict(SNAPSHOT["jobs"][0], job=f"j{i}", name=f"train{i}", pid=1000 + i) for i in range(500)]
    m = server(lambda: {"jobs": jobs, "daemon": None, "telemetry": None}, per_job=True, max_jobs=10)
    s = samples(m.scrape())
    infos = [labels for name, labels in s if name == "pump_job_info"]
    assert len(infos) == 10 and all(dict(l)["job"] in {f"j{i}" for i in range(10)} for l in infos)
    assert len([1 for name, _ in s if name == "pump_job_launches_total"]) == 10
    assert s[("pump_jobs_unlisted", frozenset())] == 490
    assert s[("pump_jobs", frozenset())] == 500
    assert s[("pump_jobs_launches_total", frozenset())] == 500 * 1500


def test_unix_socket_is_its_owners_and_groups(server):
    m = server(lambda: SNAPSHOT, per_job=True)
    assert stat.S_IMODE(os.lstat(m.path).st_mode) == 0o660
    if os.geteuid() == 0:
        from test_daemon import run_as_nobody

        def connect():
            try:
                scrape_unix(m.path)
            except PermissionError:
                return "refused"
            return "served"
        assert run_as_nobody(connect) == "refused"
    path = m.path
    m.stop()
    assert not os.path.exists(path) and m.path is None


def test_unix_socket_replaces_a_stale_socket_only(tmp_path):
    stale = tmp_path / "metrics.sock"
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(stale))   # left by an earlier pumpd: nobody listens
    m = MetricsServer(lambda: SNAPSHOT, per_job=True)
    m.start_unix(str(stale))
    try:
        assert "pump_job_info" in scrape_unix(str(stale))
    finally:
        m.stop()
    precious = tmp_path / "precious"
    precious.write_text("data")
    link = tmp_path / "link.sock"
    link.symlink_to(precious)
    for path in (precious, link):
        with pytest.raises(FileExistsError, match="not a socket"):
            MetricsServer(lambda: SNAPSHOT, per_job=True).start_unix(str(path))
    assert precious.read_text() == "data" and link.is_symlink()


class Trickle:
    """Connections that each send a byte of a request's head every 0.2 s, never ending it:
    each read is well inside any per-read timeout."""

    def __init__(self, port, n):
        self.conns = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(n)]
        self.going = True
        self.thread = threading.Thread(target=self._send, name="trickle", daemon=True)
        self.thread.start()

    def _send(self):
        while self.going:
            for c in self.conns:
                try:
                    c.send(b"G")
                except OSError:
                    pass   # dropped by the server
            time.sleep(0.2)

    def closed(self, c, timeout) -> bool:
        c.settimeout(timeout)
        try:
            return c.recv(1) == b""
        except socket.timeout:
            return False
        except ConnectionResetError:
            return True

    def stop(self):
        self.going = False
        self.thread.join()
        for c in self.conns:
            c.close()


def test_slow_scrapers_neither_block_a_scrape_nor_outlast_the_head_deadline(server, monkeypatch):
    """The issue's case: 8 connections each sending a byte just inside the old per-read
    timeout held all 8 slots, and every scrape was closed unanswered. Now a scrape is
    answered at once, no thread is started per connection, and each slow one is dropped
    when the head's deadline passes though it kept sending."""
    from pumpd import metrics
    monkeypatch.setattr(metrics, "HEAD_DEADLINE", 1.5, raising=False)
    m = server(lambda: SNAPSHOT)
    threads = threading.active_count()
    slow = Trickle(m.port, 8)
    try:
        time.sleep(0.5)
        started = time.monotonic()
        assert "pump_jobs_launches_total" in scrape(m.port)
        assert time.monotonic() - started < 1.0
        assert threading.active_count() <= threads + 1   # the trickler; none of the server's
        assert all(slow.closed(c, 2.5) for c in slow.conns)   # at 1.5 s, trickling all along
    finally:
        slow.stop()


def test_more_slow_connections_than_the_cap_close_the_oldest(server):
    from pumpd import metrics
    m = server(lambda: SNAPSHOT)
    slow = Trickle(m.port, metrics.MAX_CONNECTIONS + 5)
    try:
        time.sleep(0.5)
        assert "pump_jobs_launches_total" in scrape(m.port)   # took the place of the oldest one
        assert [slow.closed(c, 0.5) for c in slow.conns[:6]] == [True] * 6
        assert not any(slow.closed(c, 0.01) for c in slow.conns[6:])
    finally:
        slow.stop()


def test_a_head_too_long_is_dropped(server):
    from pumpd import metrics
    m = server(lambda: SNAPSHOT)
    c = socket.create_connection(("127.0.0.1", m.port), timeout=5)
    try:
        c.sendall(b"GET /metrics HTTP/1.0\r\nX: " + b"a" * metrics.HEAD_MAX)
        assert c.recv(1) == b""
    except ConnectionResetError:
        pass
    finally:
        c.close()
    assert "pump_jobs_launches_total" in scrape(m.port)


def test_only_metrics_is_served(server):
    m = server(lambda: SNAPSHOT)
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(f"http://127.0.0.1:{m.port}/etc/passwd", timeout=10)
    assert e.value.code == 404


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
    assert len(results) == 8 and all("pump_jobs_launches_total" in r for r in results)


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
        assert m2.port == port and "pump_jobs_launches_total" in scrape(port)
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


def test_per_user_counts_come_from_the_jobs_and_pumpds_own_counts():
    from pumpd.server import per_user
    job = dict(SNAPSHOT["jobs"][0], planner_skipped=10, functions_dropped=1, allocations_dropped=2,
               planned_blocks_dropped=3)
    other = dict(SNAPSHOT["jobs"][1], planner_skipped=0, functions_dropped=0, allocations_dropped=0,
                 planned_blocks_dropped=0)
    users = per_user([job, dict(job, events_dropped=1), other], {1000: 2, 65534: 5}, {1001: 40})
    assert users == [
        {"uid": 1000, "events_dropped": 8, "planner_skipped": 20, "table_entries_dropped": 12, "plan_overruns": 2,
         "log_lines_suppressed": 0},
        {"uid": 1001, "events_dropped": 0, "planner_skipped": 0, "table_entries_dropped": 0, "plan_overruns": 0,
         "log_lines_suppressed": 40},
        {"uid": 65534, "events_dropped": 0, "planner_skipped": 0, "table_entries_dropped": 0, "plan_overruns": 5,
         "log_lines_suppressed": 0}]
