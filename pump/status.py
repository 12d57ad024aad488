"""`pump status [--json] [--socket PATH]`: the jobs pumpd runs that the caller may see,
and how each GPU's pool is divided among jobs (pumpd.toml [budgets] gpu_pool).

It asks the system pumpd ($PUMP_SOCKET, else /run/pump/pumpd.sock), the caller's
shared pumpd (pump/userd.py: the jobs the user runs without a service, together) and
every embedded pumpd the caller's own pump-run jobs started (their sockets sit in the
caller's private temp directories).  pumpd decides what the caller sees from
the socket's peer credentials: a user's own jobs, or all jobs for root.  No daemon
running means no jobs (exit 0); --socket PATH asks that one daemon only, and not getting
an answer from it is an error (exit 1).
"""

import glob
import json
import os
import sys
import tempfile
import time

from pump import admin, protocol, runtime_dir
from pump.stats import human_bytes


def _budget(job) -> str:
    if job.get("budget_bytes") is not None:
        return human_bytes(job["budget_bytes"])
    if job.get("budget_percent") is not None:
        return f"{job['budget_percent']}%"  # the shim resolves it against its device
    return "-"


def _budget_from(job) -> str:
    """Where the budget comes from: "config" (the job's fixed budget), "set" (pump's set
    op), "default" (pumpd's default_budget) or "arbiter" (its share of the GPU's pool)."""
    source = job.get("budget_source") or "-"
    return source + ", min unmet" if job.get("budget_state") == "unmet" else source


def _age(job) -> str:
    """How long ago the job registered: 45s, 12m05s, 3h02m, 2d04h."""
    started = job.get("started")
    if not isinstance(started, (int, float)):
        return "-"
    seconds = max(0, int(time.time() - started))
    for unit, size, sub, sub_size in (("d", 86400, "h", 3600), ("h", 3600, "m", 60), ("m", 60, "s", 1)):
        if seconds >= size:
            return f"{seconds // size}{unit}{(seconds % size) // sub_size:02d}{sub}"
    return f"{seconds}s"


def _learned(job) -> str:
    """Lookahead jobs: the launches of the iteration each process learned ("not yet" while
    none is), and the processes that fell back to the launch rule; "-" for other policies."""
    periods = job.get("iteration_launches") or []
    fallbacks = job.get("lookahead_fallbacks") or []
    if job.get("policy") != "lookahead" or not periods and not fallbacks:
        return "-"
    learned = [f"{n} launches" if n else "not yet" for n in periods]
    return ",".join(learned + ([f"{len(fallbacks)} on the launch rule"] if fallbacks else []))


def _ranks(job) -> str:
    """The ranks of the job's processes (torchrun, Slurm, MPI), as runs: 0-3,6."""
    ranks = sorted(set(r for r in job.get("ranks") or [] if isinstance(r, int)))
    runs, start = [], None
    for i, r in enumerate(ranks):
        start = r if start is None else start
        if i + 1 == len(ranks) or ranks[i + 1] != r + 1:
            runs.append(str(r) if start == r else f"{start}-{r}")
            start = None
    return ",".join(runs) or "-"


PAGES_MAX = 10000  # status pages read from one daemon: 100 jobs each at most

COLUMNS = (  # (heading, format of a job)
    ("JOB", "job"), ("NAME", "name"), ("PID", "pid"), ("USER", "user"), ("POLICY", "policy"),
    ("BUDGET", _budget), ("FROM", _budget_from),
    ("RESIDENT", lambda j: human_bytes(j.get("resident_bytes") or 0)), ("LAUNCHES", "launches"),
    ("PREFETCHED", lambda j: human_bytes(j.get("prefetch_bytes") or 0)), ("DROPPED", "events_dropped"),
    ("RANKS", _ranks), ("AGE", _age), ("LEARNED", _learned),
)


def daemon_sockets() -> list:
    """The system daemon's socket (for root, the administrator's where there is one: every
    user's jobs), the caller's shared one, then the caller's embedded daemons' (own files
    only)."""
    system = protocol.default_socket()
    if system == protocol.SYSTEM_SOCKET:
        system = admin.admin_socket() or system
    paths = [system]
    try:
        shared = runtime_dir.user_socket(create=False)
        if shared not in paths:
            paths.append(shared)
    except runtime_dir.RuntimeDirMissing:
        pass  # no shared pumpd has run yet
    except runtime_dir.RuntimeDirError as exc:
        # As pump-run says it: the user's shared pumpd is not asked, and why.
        print(f"pump: status: not asking your shared pumpd: {exc}", file=sys.stderr)
    except OSError as exc:
        print(f"pump: status: not asking your shared pumpd: {exc.strerror or exc}", file=sys.stderr)
    for path in sorted(glob.glob(os.path.join(tempfile.gettempdir(), "pumpd-*", "pumpd.sock"))):
        try:
            if os.stat(path).st_uid == os.geteuid() and path not in paths:
                paths.append(path)
        except OSError:
            pass
    return paths


def collect(paths):
    """(jobs, pools, daemons that answered) over the daemons' sockets given."""
    jobs, pools, daemons = [], [], []
    for path in paths:
        try:
            pages = _pages(path)
        except protocol.PeerError as exc:
            print(f"pump: {exc}", file=sys.stderr)
            continue
        except (OSError, protocol.ProtocolError):
            continue
        daemons.append(path)
        for job in (job for page in pages for job in page.get("jobs", [])):
            jobs.append(dict(job, daemon=path))
        for pool in pages[-1].get("pools", []):
            pools.append(dict(pool, daemon=path))
    return jobs, pools, daemons


def _pages(path) -> list:
    """Every page of one daemon's status reply (a page is what fits in one frame).  The
    first request names no offset, so a pumpd from before pages answers it (all at once)."""
    pages, offset = [], 0
    with protocol.Client(path, timeout=2.0) as client:
        while offset is not None and len(pages) < PAGES_MAX:
            pages.append(client.request({"op": "status", **({"offset": offset} if offset else {})}))
            after = pages[-1].get("next")
            offset = after if isinstance(after, int) and after > offset else None
    return pages


def _cell(job, how) -> str:
    """A table cell; control characters in names are shown escaped, never sent to the terminal."""
    return protocol.printable(how(job) if callable(how) else str(job.get(how)))


def table(jobs) -> str:
    rows = [[h for h, _ in COLUMNS]]
    rows += [[_cell(job, how) for _, how in COLUMNS] for job in jobs]
    widths = [max(len(r[i]) for r in rows) for i in range(len(COLUMNS))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)


def pool_lines(pools, several_daemons: bool) -> list:
    lines = []
    for p in pools:
        waiting = f" ({p['unmet']} waiting for its minimum)" if p["unmet"] else ""
        where = f" [{p['daemon']}]" if several_daemons else ""
        lines.append(f"GPU {p['gpu']}: pool {human_bytes(p['pool_bytes'])}, {human_bytes(p['assigned_bytes'])} "
                     f"assigned to {p['jobs']} job{'s' if p['jobs'] != 1 else ''}{waiting}{where}")
    return lines


def main(args) -> int:
    paths = [args.socket] if args.socket else daemon_sockets()
    jobs, pools, daemons = collect(paths)
    if args.socket and not daemons:
        print(f"pump: no pumpd answers on {args.socket}", file=sys.stderr)
        return 1
    if args.json:
        json.dump({"daemons": daemons, "jobs": jobs, "pools": pools}, sys.stdout, indent=2)
        print()
        return 0
    if jobs:
        print(table(jobs))
    else:
        print("no jobs" + ("" if daemons else f" (no pumpd is running: looked at {', '.join(paths)})"))
    for line in pool_lines(pools, len(daemons) > 1):
        print(line)
    unsaved = [job for job in jobs if job.get("unsaved")]
    if unsaved:
        print(f"not saved: {len(unsaved)} job{'s' if len(unsaved) != 1 else ''} pumpd could not write to its state "
              f"directory ({protocol.printable(str(unsaved[0]['unsaved']))}): they run, and pumpd writes them once it "
              "can; a pumpd restart before then would forget them")
    return 0
