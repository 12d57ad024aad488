"""Read the shim's per-process counter records (``$PUMP_STATS_DIR/pump-<pid>.stats``).

The record layout is ``struct pump_stats`` in pump_stats.h, the one C header both
the shim and this module read: cffi parses it here (ABI mode), so no field, offset
or size is written down twice.  A field added to the header is read, written to
--stats JSON and (if it is a plain counter) summed without a change here.
"""

import functools
import logging
import pathlib

import cffi

from pump import headers

HEADER_NAME = "pump_stats.h"
STRUCT = "struct pump_stats"

# How aggregate() treats fields other than plain counters (which it sums).
_IDENTITY_FIELDS = frozenset({"magic", "version", "pid", "parent_pid"})
_MAX_FIELDS = frozenset({"managed_bytes_peak", "capacity_bytes", "budget_bytes", "default_budget_bytes",
                         "resident_bytes_peak", "budget_margin_bytes", "budget_appeared_bytes"})
_COUNT_FLAGS = {"exited": "exited_processes", "passthrough": "passthrough_processes"}
BLOCK_BYTES = 2 << 20  # the shim's residency block: budget_skips counts them

log = logging.getLogger(__name__)


@functools.cache
def _load():
    ffi, consts = headers.load(HEADER_NAME)
    return ffi, consts.PUMP_STATS_MAGIC, consts.PUMP_STATS_VERSION


def get_ffi() -> cffi.FFI:
    """The cffi FFI holding ``struct pump_stats`` (parsed once, from the header)."""
    return _load()[0]


def magic() -> int:
    """PUMP_STATS_MAGIC from the header."""
    return _load()[1]


def version() -> int:
    """PUMP_STATS_VERSION from the header."""
    return _load()[2]


def record_size() -> int:
    return get_ffi().sizeof(STRUCT)


def fields() -> list:
    """The record's field names, in header order."""
    return [name for name, _ in get_ffi().typeof(STRUCT).fields]


def to_dict(rec) -> dict:
    """Convert a ``struct pump_stats *`` (or struct) to a dict; char arrays become str."""
    ffi = get_ffi()
    out = {}
    for name, field in ffi.typeof(STRUCT).fields:
        value = getattr(rec, name)
        if field.type.kind == "array":
            if field.type.item.cname == "char":
                value = ffi.string(value).decode("utf-8", "replace")
            else:
                value = list(value)
        out[name] = value
    return out


def parse_record(data: bytes, name: str = "<record>") -> dict:
    """Validate and decode one record's bytes; ValueError naming ``name`` if bad.

    Bytes past the struct are ignored (the shim may size its mapping to a page).
    """
    ffi = get_ffi()
    size = ffi.sizeof(STRUCT)
    head = ffi.typeof(STRUCT).fields
    # magic and version lead the struct in every version of the layout.
    assert head[0][0] == "magic" and head[1][0] == "version"
    if len(data) < 8:
        raise ValueError(f"{name}: too short ({len(data)} bytes, a record is {size})")
    rec = ffi.new(STRUCT + " *")
    ffi.memmove(rec, data, min(len(data), size))
    if rec.magic != magic():
        hint = " (record never initialised)" if rec.magic == 0 else ""
        raise ValueError(
            f"{name}: bad magic 0x{rec.magic:08x}, expected 0x{magic():08x}{hint}: "
            "not a pump stats record"
        )
    if rec.version != version():
        raise ValueError(
            f"{name}: unsupported version {rec.version} (this pump reads version "
            f"{version()})"
        )
    if len(data) < size:
        raise ValueError(f"{name}: too short ({len(data)} bytes, a record is {size})")
    return to_dict(rec)


def read_record(path) -> dict:
    """Read one ``pump-<pid>.stats`` file; ValueError naming the file if it is bad."""
    path = pathlib.Path(path)
    return parse_record(path.read_bytes(), str(path))


def read_dir(dirpath, errors: list = None) -> list:
    """Read every ``pump-*.stats`` in dirpath, sorted by pid.

    A file that cannot be read or is not a valid record is skipped: its message is
    appended to ``errors`` when a list is given, else logged as a warning.
    """
    records = []
    for path in sorted(pathlib.Path(dirpath).glob("pump-*.stats")):
        try:
            records.append(read_record(path))
        except (OSError, ValueError) as exc:
            msg = str(exc) if isinstance(exc, ValueError) else f"{path}: {exc.strerror}"
            if errors is None:
                log.warning("skipping %s", msg)
            else:
                errors.append(msg)
    records.sort(key=lambda r: r["pid"])
    return records


def aggregate(records) -> dict:
    """Totals over the processes of a job.

    - Counters are summed over processes (``managed_bytes``, the footprint "now",
      becomes the sum of each process's last footprint).
    - ``managed_bytes_peak``, ``capacity_bytes``, ``budget_bytes``, ``default_budget_bytes``,
      ``budget_margin_bytes`` and ``budget_appeared_bytes`` are the MAX over processes, not a sum: the largest
      single-process peak and cap
      (processes peak at different times, so a sum would overstate the job's peak).
    - ``processes``: records read; ``exited_processes``: those that ran their exit
      handler (the rest ended by _exit/kill or are still running);
      ``passthrough_processes``: those where the shim stood aside.
    - pid, parent_pid, magic, version and string fields are not aggregated.
    """
    ffi = get_ffi()
    totals = {}
    for name, field in ffi.typeof(STRUCT).fields:
        if name in _IDENTITY_FIELDS or field.type.kind != "primitive":
            continue
        values = [r.get(name, 0) for r in records]
        if name in _COUNT_FLAGS:
            totals[_COUNT_FLAGS[name]] = sum(1 for v in values if v)
        elif name in _MAX_FIELDS:
            totals[name] = max(values, default=0)
        else:
            totals[name] = sum(values)
    totals["processes"] = len(records)
    return totals


def human_bytes(n: int) -> str:
    """Binary units: 512 B, 1.5 KiB, 1.2 GiB."""
    if n < 1024:
        return f"{n} B"
    value = float(n)
    for unit in ("KiB", "MiB", "GiB", "TiB", "PiB"):
        value /= 1024
        if value < 1024 or unit == "PiB":
            break
    return f"{value:.1f} {unit}"


def _count(n: int, singular: str, plural: str = None) -> str:
    return f"{n} {singular if n == 1 else (plural or singular + 's')}"


def summary_line(totals: dict) -> str:
    """One line for stderr, e.g.
    ``pump: 1234 launches (1000 on managed memory), 57 prefetch calls, 1.2 GiB
    prefetched, 0 B evicted, 0 events dropped, 3 processes``; allocations the driver
    refused to prefetch, capacity refusals, errors and pass-through processes appear only
    when non-zero; under a plan of pumpd's, the launches it placed every block of
    (``1000 on managed memory, 950 planned``); hook coverage, the
    driver lookups answered with pump's hooks, when there were any, with the
    cuGetProcAddress answers pump could not match (``hooks 139 via cuGetProcAddress + 2
    via dlsym (3 unmatched)``: calls through those pass pump by); under a budget,
    the evictions say how high believed-resident memory went against it
    (``96.0 MiB evicted (peak 64.0 MiB resident, budget 64.0 MiB)``), and what the
    budget could not hold, when a launch needed more than it (``32.0 MiB left to faults
    by the budget``).
    """
    t = totals
    evicted = f"{human_bytes(t['bytes_evicted'])} evicted"
    if t.get("budget_bytes"):
        evicted += (f" (peak {human_bytes(t.get('resident_bytes_peak', 0))} resident, "
                    f"budget {human_bytes(t['budget_bytes'])})")
    planned = f", {t.get('launches_planned', 0)} planned" if t.get("plan_triggers") else ""
    parts = [
        f"{_count(t['launches'], 'launch', 'launches')} "
        f"({t['launches_managed']} on managed memory{planned})",
        _count(t["prefetch_calls"], "prefetch call"),
        f"{human_bytes(t['prefetch_bytes'])} prefetched",
        evicted,
        _count(t["events_dropped"], "event") + " dropped",
    ]
    if t.get("budget_bytes") and t.get("budget_skips"):
        parts.append(f"{human_bytes(t['budget_skips'] * BLOCK_BYTES)} left to faults by the budget")
    if t.get("prefetch_refusals"):
        parts.append(_count(t["prefetch_refusals"], "allocation") + " the driver would not prefetch")
    if t.get("capacity_refusals"):
        parts.append(_count(t["capacity_refusals"], "capacity refusal"))
    if t.get("errors"):
        parts.append(_count(t["errors"], "error"))
    hooked = t.get("procaddr_hooks", 0) + t.get("dlsym_hooks", 0)
    if hooked or t.get("procaddr_unmatched"):
        hooks = f"hooks {t.get('procaddr_hooks', 0)} via cuGetProcAddress + {t.get('dlsym_hooks', 0)} via dlsym"
        if t.get("procaddr_unmatched"):
            hooks += f" ({t['procaddr_unmatched']} unmatched)"
        parts.append(hooks)
    procs = _count(t["processes"], "process", "processes")
    if t.get("passthrough_processes"):
        procs += f" ({t['passthrough_processes']} passed through)"
    parts.append(procs)
    return "pump: " + ", ".join(parts)
