"""`pump status [--json]`: the jobs pumpd runs that the caller may see.

It asks the system pumpd ($PUMP_SOCKET, else /run/pump/pumpd.sock) and every
embedded pumpd the caller's own pump-run jobs started (their sockets sit in the
caller's private temp directories).  pumpd decides what the caller sees from
the socket's peer credentials: a user's own jobs, or all jobs for root.
"""

import glob
import json
import os
import sys
import tempfile

from pump import protocol
from pump.stats import human_bytes

COLUMNS = (  # (heading, field, format)
    ("JOB", "job", str), ("NAME", "name", str), ("PID", "pid", str), ("USER", "user", str),
    ("POLICY", "policy", str),
    ("BUDGET", "budget_bytes", lambda v: "-" if v is None else human_bytes(v)),
    ("RESIDENT", "resident_bytes", human_bytes), ("LAUNCHES", "launches", str),
    ("PREFETCHED", "prefetch_bytes", human_bytes), ("DROPPED", "events_dropped", str),
)


def daemon_sockets() -> list:
    """The system daemon's socket, then the caller's embedded daemons' (own files only)."""
    paths = [protocol.default_socket()]
    for path in sorted(glob.glob(os.path.join(tempfile.gettempdir(), "pumpd-*", "pumpd.sock"))):
        try:
            if os.stat(path).st_uid == os.geteuid() and path not in paths:
                paths.append(path)
        except OSError:
            pass
    return paths


def collect():
    """(jobs, daemons that answered) over every daemon found."""
    jobs, daemons = [], []
    for path in daemon_sockets():
        try:
            with protocol.Client(path, timeout=2.0) as client:
                reply = client.request({"op": "status"})
        except (OSError, protocol.ProtocolError):
            continue
        daemons.append(path)
        for job in reply.get("jobs", []):
            jobs.append(dict(job, daemon=path))
    return jobs, daemons


def table(jobs) -> str:
    rows = [[h for h, _, _ in COLUMNS]]
    rows += [[fmt(job.get(field)) for _, field, fmt in COLUMNS] for job in jobs]
    widths = [max(len(r[i]) for r in rows) for i in range(len(COLUMNS))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)


def main(args) -> int:
    jobs, daemons = collect()
    if args.json:
        json.dump({"daemons": daemons, "jobs": jobs}, sys.stdout, indent=2)
        print()
        return 0 if daemons else 1
    if not daemons:
        print(f"pump: no pumpd answers (looked at {', '.join(daemon_sockets())})", file=sys.stderr)
        return 1
    print(table(jobs) if jobs else "no jobs")
    return 0
