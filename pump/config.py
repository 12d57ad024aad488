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

Reading the TOML is :mod:`pump.config_toml`'s, the schemas and their checks
:mod:`pump.config_schema`'s.  The values themselves (sizes, capacities, budgets, names, listen
addresses: the grammar the shim also reads) are :mod:`pump.values`'s, re-exported here for this
module's users.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Dict, List, Mapping, Optional, Union

from pump.config_schema import (
    DAEMON_MODES, DAEMON_SCHEMA, DEFAULT_JOBS_DIR, JOB_SCHEMA, LOG_LEVELS, POLICIES, PRIORITY_MAX, SHARE_MAX,
    TORCH_ALLOCATORS, BadValue, WrongType, validate,
)
from pump.config_toml import ConfigError, read_toml
from pump.values import (
    BUDGET_ALLOWED, CAPACITY_ALLOWED, NAME_ALLOWED, SIZE_ALLOWED, BadValueError, check_budget,
    check_capacity, check_name, parse_listen, parse_size,
)

__all__ = [
    "ConfigError", "BadValueError", "JobConfig", "DaemonConfig",
    "parse_size", "check_capacity", "check_budget", "check_name", "parse_listen",
    "load_job_file", "load_daemon_file", "resolve_job", "job_env", "budget_terms",
    "SIZE_ALLOWED", "CAPACITY_ALLOWED", "BUDGET_ALLOWED", "NAME_ALLOWED",
    "POLICIES", "TORCH_ALLOCATORS", "DAEMON_MODES", "LOG_LEVELS", "DEFAULT_JOBS_DIR", "JOB_DEFAULTS",
    "SHARE_MAX", "PRIORITY_MAX", "JOB_SCHEMA", "DAEMON_SCHEMA",
]

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
    evict_ahead: Optional[bool] = None
    torch_discards: Optional[Union[bool, str]] = None  # or "poison" (config_schema.DISCARDS_POISON)
    torch_names: Optional[bool] = None
    held_discards: Optional[bool] = None
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
    # [limits]: what one user may make pumpd hold; None: pumpd's own (daemon/pumpd/limits.py)
    limit_connections_per_user: Optional[int] = None
    limit_sessions_per_user: Optional[int] = None
    limit_jobs_per_user: Optional[int] = None
    limit_kernel_names_per_user: Optional[int] = None
    limit_allocations_per_user: Optional[int] = None
    limit_planned_blocks_per_user: Optional[int] = None
    limit_pending_records_per_user: Optional[int] = None
    limit_plan_overruns: Optional[int] = None
    limit_plan_deadline_s: Optional[float] = None
    source: Dict[str, str] = dataclasses.field(default_factory=dict)

    def limits(self) -> Dict[str, Any]:
        """The [limits] the file sets: key -> value."""
        return {f[len("limit_"):]: getattr(self, f) for f in DAEMON_FIELDS
                if f.startswith("limit_") and getattr(self, f) is not None}


DAEMON_FIELDS = tuple(f.name for f in dataclasses.fields(DaemonConfig) if f.name != "source")



def load_job_file(path: str) -> JobConfig:
    """The settings a job file sets (None elsewhere; ``source`` names the file for each
    field set).  Raises ConfigError listing every problem."""
    return _load_job_file(path)


def _load_job_file(path, missing_ok: bool = False) -> Optional[JobConfig]:
    path = os.fspath(path)
    doc = read_toml(path, missing_ok)
    if doc is None:
        return None
    values = validate(path, doc, JOB_SCHEMA)
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
    values = validate(path, read_toml(path), DAEMON_SCHEMA)
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
        except (WrongType, BadValue):
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
    if cfg.evict_ahead is not None:
        env["PUMP_EVICT_AHEAD"] = "1" if cfg.evict_ahead else "0"
    if cfg.torch_discards is not None:
        env["PUMP_TORCH_DISCARDS"] = cfg.torch_discards if isinstance(cfg.torch_discards, str) else \
            "1" if cfg.torch_discards else "0"
    if cfg.torch_names is not None:
        env["PUMP_TORCH_NAMES"] = "1" if cfg.torch_names else "0"
    if cfg.held_discards is not None:
        env["PUMP_HELD_DISCARDS"] = "1" if cfg.held_discards else "0"
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
