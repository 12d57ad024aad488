"""pump's configuration: per-job TOML files and the service's own file.

Two kinds of file, both TOML, every section and key optional:

- a job file (``pump-run --config FILE``, and the system's ``/etc/pump/jobs.d/NAME.toml``):
  sections ``[job]``, ``[prefetch]``, ``[memory]``, ``[trace]``, ``[daemon]``
  (:data:`JOB_SCHEMA`); :func:`load_job_file`, and :func:`resolve_job`, which applies the
  precedence command-line flag > ``--config`` file > ``jobs.d/NAME.toml`` > defaults.
- the service's file (``/etc/pump/pumpd.toml``, ``pumpd --config FILE``): sections
  ``[daemon]``, ``[metrics]``, ``[telemetry]``, ``[budgets]`` (:data:`DAEMON_SCHEMA`);
  :func:`load_daemon_file`.

An unknown section or key, a wrong type or a bad value is an error naming the file, the
section and key, and what is allowed.  A file's errors are all collected and raised
together as one :class:`ConfigError` (nothing is half-applied).

The values themselves (sizes, capacities, budgets, names, listen addresses: the grammar
the shim also reads) are :mod:`pump.values`'s, re-exported here for this module's users.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
import re
import sys
from typing import Any, Callable, Dict, List, Mapping, Optional

from pump.values import (
    BUDGET_ALLOWED, CAPACITY_ALLOWED, NAME_ALLOWED, SIZE_ALLOWED, SIZE_LIMIT, BadValueError, check_budget,
    check_capacity, check_name, check_size, parse_listen, parse_size,
)

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.9/3.10
    import tomli as tomllib

__all__ = [
    "ConfigError", "BadValueError", "JobConfig", "DaemonConfig",
    "parse_size", "check_capacity", "check_budget", "check_name", "parse_listen",
    "load_job_file", "load_daemon_file", "resolve_job", "job_env", "budget_terms",
    "SIZE_ALLOWED", "CAPACITY_ALLOWED", "BUDGET_ALLOWED", "NAME_ALLOWED",
    "POLICIES", "TORCH_ALLOCATORS", "DAEMON_MODES", "LOG_LEVELS", "DEFAULT_JOBS_DIR", "JOB_DEFAULTS",
]

DEFAULT_JOBS_DIR = "/etc/pump/jobs.d"
POLICIES = ("off", "launch", "lookahead")
# [memory] torch_allocator: PyTorch's own caching allocator, or pump's (pump/boot/sitecustomize.py)
TORCH_ALLOCATORS = ("caching", "pump")
SHARE_MAX = 1000000   # a job's [memory] share
PRIORITY_MAX = 1000   # a job's [memory] priority: -PRIORITY_MAX..PRIORITY_MAX
DAEMON_MODES = ("auto", "system", "embedded", "none")
LOG_LEVELS = ("error", "warning", "info", "debug")

# --- errors and TOML rendering -------------------------------------------------------------


class ConfigError(Exception):
    """A configuration that cannot be used.  ``errors`` holds one message line per
    problem (each naming its file); str() is those lines joined with newlines."""

    def __init__(self, errors: List[str]):
        self.errors = list(errors)
        super().__init__("\n".join(self.errors))

    def __str__(self) -> str:
        return "\n".join(self.errors)


_BARE_KEY_RE = re.compile(r"[A-Za-z0-9_-]+")
_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r"}
_RENDER_LIMIT = 200  # characters of a value shown in a message


def _toml_string(s: str) -> str:
    out = []
    for ch in s:
        if ch in _ESCAPES:
            out.append(_ESCAPES[ch])
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04X}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def _toml_key(k: str) -> str:
    return k if _BARE_KEY_RE.fullmatch(k) else _toml_string(k)


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return _toml_string(v)
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        return repr(v)  # inf, -inf, 2.0, 1e+300: all TOML
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{_toml_key(k)} = {_toml_value(x)}" for k, x in v.items()) + "}"
    if hasattr(v, "isoformat"):
        return v.isoformat()
    return repr(v)


def _shown(v: Any) -> str:
    """A value as TOML, cut short if long."""
    text = _toml_value(v)
    return text if len(text) <= _RENDER_LIMIT else text[:_RENDER_LIMIT] + "..."


def _toml_type(v: Any) -> str:
    import datetime

    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, str):
        return "string"
    if isinstance(v, int):
        return "integer"
    if isinstance(v, float):
        return "float"
    if isinstance(v, list):
        return "array"
    if isinstance(v, dict):
        return "table"
    if isinstance(v, datetime.datetime):
        return "offset date-time" if v.tzinfo is not None else "local date-time"
    if isinstance(v, datetime.date):
        return "local date"
    if isinstance(v, datetime.time):
        return "local time"
    return type(v).__name__


# --- the schemas ---------------------------------------------------------------------------


class _WrongType(Exception):
    pass


class _BadValue(Exception):
    pass


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _enum(*choices: str) -> Callable[[Any], str]:
    def check(v):
        if not isinstance(v, str):
            raise _WrongType
        if v not in choices:
            raise _BadValue
        return v
    return check


def _boolean(v):
    if not isinstance(v, bool):
        raise _WrongType
    return v


def _int_range(lo: int, hi: int) -> Callable[[Any], int]:
    def check(v):
        if not _is_int(v):
            raise _WrongType
        if not lo <= v <= hi:
            raise _BadValue
        return v
    return check


def _path(v):
    if not isinstance(v, str):
        raise _WrongType
    if not v or "\0" in v:
        raise _BadValue
    return v


def _name(v):
    if not isinstance(v, str):
        raise _WrongType
    try:
        return check_name(v)
    except BadValueError:
        raise _BadValue from None


def _size_or(checker: Callable[[str], str]) -> Callable[[Any], str]:
    """A TOML integer > 0 (bytes), or a string the checker accepts; normalised to a string
    in the shim's grammar."""
    def check(v):
        if _is_int(v):
            if not 0 < v < SIZE_LIMIT:
                raise _BadValue
            return str(v)
        if not isinstance(v, str):
            raise _WrongType
        try:
            return checker(v)
        except ValueError:
            raise _BadValue from None
    return check


def _share(v):
    if not (_is_int(v) or isinstance(v, float)):
        raise _WrongType
    if not 0 < v <= SHARE_MAX:  # nan fails too
        raise _BadValue
    return v


def _interval(v):
    if not (_is_int(v) or isinstance(v, float)):
        raise _WrongType
    if not 0 < v <= 3600:  # nan fails too
        raise _BadValue
    return float(v)


def _listen(v):
    if not isinstance(v, str):
        raise _WrongType
    if v.startswith("/"):  # a Unix socket: sun_path holds 107 bytes and a NUL
        if "\0" in v or len(os.fsencode(v)) > 107:
            raise _BadValue
        return v
    try:
        parse_listen(v)
    except ValueError:
        raise _BadValue from None
    return v


def _choices(*choices: str) -> str:
    return ", ".join(f'"{c}"' for c in choices)


_TOML_SIZE = (
    'an integer > 0 (bytes), or a string: a byte count > 0 with an optional unit '
    '(K, M, G, T or KiB, MiB, GiB, TiB: binary; KB, MB, GB, TB: decimal) such as "512MiB" or "8G"'
)
_TOML_BUDGET = _TOML_SIZE + ', or a percentage of the device "1%".."100%"'
_TOML_CAPACITY = _TOML_SIZE + ', a percentage of the device "1%".."100%", or "host"'
_TOML_POOL = _TOML_SIZE + ', or a percentage of each GPU\'s memory "1%".."100%" (known through NVML)'
_TOML_PATH = "a non-empty string (a path)"
_TOML_BOOL = "a boolean (true or false)"


@dataclasses.dataclass(frozen=True)
class _Key:
    field: str        # the dataclass field it sets
    check: Callable[[Any], Any]  # value -> normalised value; raises _WrongType / _BadValue
    allowed: str      # shown after "allowed: " for a bad value
    expected: str     # shown after "expected " for a wrong type


def _key(field, check, allowed, expected=None):
    return _Key(field, check, allowed, expected or allowed)


def _enum_key(field, *choices):
    return _key(field, _enum(*choices), _choices(*choices), "one of " + _choices(*choices))


# section -> key -> _Key, in schema order (the order messages list them in).
JOB_SCHEMA: Dict[str, Dict[str, _Key]] = {
    "job": {
        "name": _key("name", _name, "a string of " + NAME_ALLOWED),
    },
    "prefetch": {
        "policy": _enum_key("policy", *POLICIES),
        "wait": _key("wait", _boolean, _TOML_BOOL),
        "epoch_launches": _key("epoch_launches", _int_range(1, 4294967295), "an integer 1..4294967295"),
    },
    "memory": {
        "capacity": _key("capacity", _size_or(check_capacity), _TOML_CAPACITY),
        "budget": _key("budget", _size_or(check_budget), _TOML_BUDGET),
        # The arbiter's terms (pumpd.toml [budgets] gpu_pool divides a GPU among jobs):
        "share": _key("share", _share, f"a number > 0 and <= {SHARE_MAX} (the job's weight; default 1)"),
        "min_budget": _key("min_budget", _size_or(check_size), _TOML_SIZE),
        "max_budget": _key("max_budget", _size_or(check_size), _TOML_SIZE),
        "priority": _key("priority", _int_range(-PRIORITY_MAX, PRIORITY_MAX),
                         f"an integer {-PRIORITY_MAX}..{PRIORITY_MAX} (higher first; default 0)"),
        # true: the program's device allocations become managed memory (PUMP_MANAGED_ALL)
        "managed_all": _key("managed_all", _boolean, _TOML_BOOL),
        # PyTorch's CUDA allocator: its own caching one, or pump's (shim/torch_allocator.c)
        "torch_allocator": _enum_key("torch_allocator", *TORCH_ALLOCATORS),
    },
    "trace": {
        "file": _key("trace_file", _path, _TOML_PATH),
    },
    "daemon": {
        "mode": _enum_key("daemon_mode", *DAEMON_MODES),
        "socket": _key("daemon_socket", _path, _TOML_PATH),
    },
}

DAEMON_SCHEMA: Dict[str, Dict[str, _Key]] = {
    "daemon": {
        "socket": _key("socket", _path, _TOML_PATH),
        "jobs_dir": _key("jobs_dir", _path, _TOML_PATH),
        "log_level": _enum_key("log_level", *LOG_LEVELS),
    },
    "metrics": {
        "listen": _key("metrics_listen", _listen,
                       'a string "HOST:PORT": an IPv4 address or localhost, or [an IPv6 address], '
                       'and a port 1..65535, e.g. "127.0.0.1:9400" or "[::1]:9400"; or the absolute '
                       'path of a Unix socket (at most 107 bytes)'),
        "per_job": _key("metrics_per_job", _boolean, _TOML_BOOL),
        "max_jobs": _key("metrics_max_jobs", _int_range(1, 10000), "an integer 1..10000"),
    },
    "telemetry": {
        "nvml": _key("nvml", _boolean, _TOML_BOOL),
        "interval_s": _key("interval_s", _interval, "a number > 0 and <= 3600 (seconds)"),
    },
    "budgets": {
        "default_budget": _key("default_budget", _size_or(check_budget), _TOML_BUDGET),
        "gpu_pool": _key("gpu_pool", _size_or(check_budget), _TOML_POOL),
    },
}

# --- the configurations --------------------------------------------------------------------

JOB_DEFAULTS: Mapping[str, Any] = {"policy": "launch", "wait": True, "daemon_mode": "auto",
                                   "managed_all": True}


@dataclasses.dataclass
class JobConfig:
    """A job's settings; None where unset (the shim's or pumpd's default applies).

    ``source`` maps each field to where its value came from: "flag", a file's path, or
    "default".  (From load_job_file: only the fields the file sets.)"""

    name: Optional[str] = None
    policy: Optional[str] = None
    wait: Optional[bool] = None
    epoch_launches: Optional[int] = None
    capacity: Optional[str] = None  # the shim's grammar (check_capacity); a TOML integer as its digits
    budget: Optional[str] = None    # the shim's grammar (check_budget)
    share: Optional[float] = None   # the arbiter's terms: an int or float > 0
    min_budget: Optional[str] = None  # a size (parse_size); a TOML integer as its digits
    max_budget: Optional[str] = None
    priority: Optional[int] = None
    managed_all: Optional[bool] = None
    torch_allocator: Optional[str] = None
    trace_file: Optional[str] = None
    daemon_mode: Optional[str] = None
    daemon_socket: Optional[str] = None
    source: Dict[str, str] = dataclasses.field(default_factory=dict)


JOB_FIELDS = tuple(f.name for f in dataclasses.fields(JobConfig) if f.name != "source")


@dataclasses.dataclass
class DaemonConfig:
    """pumpd's settings.  ``source`` maps each field to the file's path or "default"."""

    socket: Optional[str] = None           # None: pumpd's own choice (PUMP_SOCKET, --socket, ...)
    jobs_dir: str = DEFAULT_JOBS_DIR
    log_level: str = "info"
    metrics_listen: Optional[str] = None   # "HOST:PORT" (parse_listen) or a Unix socket's path; None: off
    metrics_per_job: bool = False          # series per job (name, pid, uid): a Unix socket only
    metrics_max_jobs: int = 100            # at most this many jobs get series of their own
    nvml: bool = True
    interval_s: float = 2.0
    default_budget: Optional[str] = None   # budget of jobs that set none; None: no budget
    gpu_pool: Optional[str] = None         # bytes (or "N%" of each GPU) the arbiter divides; None: none
    source: Dict[str, str] = dataclasses.field(default_factory=dict)


DAEMON_FIELDS = tuple(f.name for f in dataclasses.fields(DaemonConfig) if f.name != "source")

# --- loading -------------------------------------------------------------------------------


def _read_toml(path: str, missing_ok: bool = False) -> Optional[dict]:
    """The document in a file (None if it does not exist and missing_ok)."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError as exc:
        if missing_ok:
            return None
        raise ConfigError([f"{path}: cannot read: {exc.strerror or exc}"]) from None
    except OSError as exc:
        raise ConfigError([f"{path}: cannot read: {exc.strerror or exc}"]) from None
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ConfigError([f"{path}: not valid TOML: not UTF-8 text "
                           f"(byte 0x{data[exc.start]:02x} at offset {exc.start})"]) from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError([f"{path}: not valid TOML: {exc}"]) from None
    except RecursionError:  # tomllib recurses once per level of arrays and inline tables
        raise ConfigError([f"{path}: not valid here: arrays or inline tables nested too deeply "
                           "(pump's settings nest none)"]) from None
    except ValueError as exc:  # an integer past Python's 4300-digit conversion limit
        raise ConfigError([f"{path}: not valid here: {str(exc).split(';')[0]}"]) from None


def _did_you_mean(name: str, choices, shown: str) -> str:
    """ " (did you mean X?)" for the choice nearest a misspelt name, or nothing."""
    near = difflib.get_close_matches(str(name).lower(), list(choices), n=1, cutoff=0.6)
    return f" (did you mean {shown.format(near[0])}?)" if near else ""


def _validate(path: str, doc: dict, schema: Dict[str, Dict[str, _Key]]) -> Dict[str, Any]:
    """field -> value for what the document sets; raises ConfigError with every problem."""
    errors: List[str] = []
    values: Dict[str, Any] = {}
    sections = ", ".join(f"[{s}]" for s in schema)
    for sname, table in doc.items():
        keys = schema.get(sname)
        where = f"{path}: [{_toml_key(sname)}]"
        if keys is None:
            errors.append(f"{path}: unknown section [{_toml_key(sname)}]{_did_you_mean(sname, schema, '[{}]')}; "
                          f"allowed: {sections}")
            continue
        if not isinstance(table, dict):
            errors.append(f"{where} must be a table")
            continue
        for kname, value in table.items():
            key = keys.get(kname)
            if key is None:
                errors.append(f"{where} unknown key {kname!r}{_did_you_mean(kname, keys, '{!r}')}; "
                              f"allowed: {', '.join(keys)}")
                continue
            try:
                values[key.field] = key.check(value)
            except _WrongType:
                errors.append(f"{where} {kname}: expected {key.expected}, "
                              f"got {_toml_type(value)} {_shown(value)}")
            except _BadValue:
                errors.append(f"{where} {kname}: bad value {_shown(value)}; allowed: {key.allowed}")
    if errors:
        raise ConfigError(errors)
    return values


def load_job_file(path: str) -> JobConfig:
    """The settings a job file sets (None elsewhere; ``source`` names the file for each
    field set).  Raises ConfigError listing every problem."""
    return _load_job_file(path)


def _load_job_file(path, missing_ok: bool = False) -> Optional[JobConfig]:
    path = os.fspath(path)
    doc = _read_toml(path, missing_ok)
    if doc is None:
        return None
    values = _validate(path, doc, JOB_SCHEMA)
    cfg = JobConfig(**values, source={f: path for f in values})
    errors = []
    if cfg.budget is not None and any(getattr(cfg, f) is not None for f in _ARBITER_FIELDS):
        errors.append(f"{path}: [memory] budget: a fixed budget is not divided by the arbiter, so "
                      f"{', '.join(_ARBITER_FIELDS)} do not apply with it; allowed: budget alone, or those "
                      "without budget")
    if _min_over_max(cfg):
        errors.append(f"{path}: [memory] min_budget: {cfg.min_budget} is more than max_budget "
                      f"{cfg.max_budget}; allowed: min_budget <= max_budget")
    if errors:
        raise ConfigError(errors)
    return cfg


_ARBITER_FIELDS = ("share", "min_budget", "max_budget", "priority")


def _min_over_max(cfg: JobConfig) -> bool:
    return (cfg.min_budget is not None and cfg.max_budget is not None
            and parse_size(cfg.min_budget) > parse_size(cfg.max_budget))


def load_daemon_file(path: str) -> DaemonConfig:
    """pumpd's settings from its file, defaults for what it does not set.
    Raises ConfigError listing every problem."""
    path = os.fspath(path)
    values = _validate(path, _read_toml(path), DAEMON_SCHEMA)
    if values.get("metrics_per_job") and not values.get("metrics_listen", "").startswith("/"):
        raise ConfigError([f"{path}: [metrics] per_job = true needs listen to be a Unix socket's path "
                           "(over TCP every local user could read every job's name, pid and owner)"])
    source = {f: (path if f in values else "default") for f in DAEMON_FIELDS}
    return DaemonConfig(**values, source=source)


_FLAG_NAMES = {"name": "--name", "policy": "--policy", "capacity": "--capacity", "budget": "--budget",
               "trace_file": "--trace", "daemon_mode": "--daemon", "daemon_socket": "--socket",
               "managed_all": "--managed-all"}
_FIELD_KEYS = {k.field: k for keys in JOB_SCHEMA.values() for k in keys.values()}


def resolve_job(flags: Mapping[str, Any], config_file: Optional[str] = None, name: Optional[str] = None,
                jobs_dir: str = DEFAULT_JOBS_DIR) -> JobConfig:
    """A job's settings, each from the first of: a command-line flag (``flags``: field ->
    value for the flags given; None values count as not given), the ``--config`` file,
    the system's ``jobs_dir/NAME.toml``, the defaults (JOB_DEFAULTS; None for the rest).

    NAME is ``name`` (the --name flag; or flags["name"]), else the --config file's
    [job] name; with no name there is no system file.  A missing system file is not an
    error; an unreadable or invalid one is.  Raises ConfigError listing every problem
    (bad flag values, then the --config file's, then the system file's)."""
    flags = {k: v for k, v in flags.items() if v is not None}
    unknown = set(flags) - set(JOB_FIELDS)
    if unknown:
        raise TypeError(f"resolve_job: unknown fields {sorted(unknown)}; fields: {', '.join(JOB_FIELDS)}")
    if name is not None:
        flags["name"] = name
    name_flag = "name" in flags
    errors: List[str] = []
    for field in list(flags):
        key = _FIELD_KEYS[field]
        try:
            flags[field] = key.check(flags[field])
        except (_WrongType, _BadValue):
            flag = _FLAG_NAMES.get(field, "--" + field.replace("_", "-"))
            errors.append(f"{flag}: bad value {flags[field]!r}; allowed: {key.allowed}")
            del flags[field]

    layers: List[JobConfig] = []  # highest precedence first
    file_cfg = None
    if config_file is not None:
        try:
            file_cfg = load_job_file(config_file)
            layers.append(file_cfg)
        except ConfigError as exc:
            errors.extend(exc.errors)
    # The name to look up: a valid --name (a bad one: none), else the --config file's.
    job_name = flags.get("name") if name_flag else (file_cfg.name if file_cfg else None)
    if job_name is not None:
        system_file = os.path.join(os.fspath(jobs_dir), job_name + ".toml")
        try:
            system_cfg = _load_job_file(system_file, missing_ok=True)
        except ConfigError as exc:
            errors.extend(exc.errors)
        else:
            if system_cfg is not None:
                layers.append(system_cfg)
    if errors:
        raise ConfigError(errors)

    cfg = JobConfig()
    for field in JOB_FIELDS:
        if field in flags:
            value, src = flags[field], "flag"
        else:
            for layer in layers:
                if getattr(layer, field) is not None:
                    value, src = getattr(layer, field), layer.source[field]
                    break
            else:
                value, src = JOB_DEFAULTS.get(field), "default"
        setattr(cfg, field, value)
        cfg.source[field] = src
    if _min_over_max(cfg):  # min and max from different files (one file's pair is checked at load)
        raise ConfigError([f"min_budget {cfg.min_budget} (from {cfg.source['min_budget']}) is more than "
                           f"max_budget {cfg.max_budget} (from {cfg.source['max_budget']}); "
                           "allowed: min_budget <= max_budget"])
    return cfg


def job_env(cfg: JobConfig) -> Dict[str, str]:
    """The PUMP_* variables for the shim from a job's settings (only those set)."""
    env: Dict[str, str] = {}
    if cfg.policy is not None:
        env["PUMP_POLICY"] = cfg.policy
    if cfg.wait is not None:
        env["PUMP_WAIT"] = "1" if cfg.wait else "0"
    if cfg.epoch_launches is not None:
        env["PUMP_EPOCH_LAUNCHES"] = str(cfg.epoch_launches)
    if cfg.capacity is not None:
        env["PUMP_CAPACITY"] = cfg.capacity
    if cfg.budget is not None:
        env["PUMP_BUDGET"] = cfg.budget
    if cfg.name is not None:
        env["PUMP_NAME"] = cfg.name
    if cfg.managed_all is not None:
        env["PUMP_MANAGED_ALL"] = "1" if cfg.managed_all else "0"
    if cfg.torch_allocator is not None:
        env["PUMP_TORCH_ALLOCATOR"] = cfg.torch_allocator
    return env


def budget_terms(cfg: JobConfig) -> dict:
    """pumpd's register request's budget fields from a job's settings: the fixed budget
    (bytes; a percentage is the shim's to resolve, pumpd only counts it against the pool)
    and the arbiter's terms, those set."""
    terms = {"budget": None}
    if cfg.budget is not None and cfg.budget.endswith("%"):
        terms["budget_percent"] = int(cfg.budget[:-1])
    elif cfg.budget is not None:
        terms["budget"] = parse_size(cfg.budget)
    for field in ("min_budget", "max_budget"):
        if getattr(cfg, field) is not None:
            terms[field] = parse_size(getattr(cfg, field))
    for field in ("share", "priority"):
        if getattr(cfg, field) is not None:
            terms[field] = getattr(cfg, field)
    return terms
