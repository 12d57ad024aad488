"""The schemas of pump's two configuration files (a job's, :data:`JOB_SCHEMA`; the service's,
:data:`DAEMON_SCHEMA`): per section and key, the field it sets, its check and what is allowed;
and :func:`validate`, which checks a TOML document against one and collects every problem."""

from __future__ import annotations

import dataclasses
import difflib
import os
from typing import Any, Callable, Dict, List

from pump.config_toml import ConfigError, shown, toml_key, toml_type
from pump.values import NAME_ALLOWED, SIZE_LIMIT, BadValueError, check_budget, check_capacity, check_name, \
    check_size, parse_listen

DEFAULT_JOBS_DIR = "/etc/pump/jobs.d"
POLICIES = ("off", "launch", "lookahead")
# [memory] torch_allocator: PyTorch's own caching allocator, or pump's (pump/boot/sitecustomize.py)
TORCH_ALLOCATORS = ("caching", "pump")
SHARE_MAX = 1000000   # a job's [memory] share
PRIORITY_MAX = 1000   # a job's [memory] priority: -PRIORITY_MAX..PRIORITY_MAX
DAEMON_MODES = ("auto", "system", "embedded", "none")
LOG_LEVELS = ("error", "warning", "info", "debug")


class WrongType(Exception):
    pass


class BadValue(Exception):
    pass


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _enum(*choices: str) -> Callable[[Any], str]:
    def check(v):
        if not isinstance(v, str):
            raise WrongType
        if v not in choices:
            raise BadValue
        return v
    return check


def _boolean(v):
    if not isinstance(v, bool):
        raise WrongType
    return v


def _int_range(lo: int, hi: int) -> Callable[[Any], int]:
    def check(v):
        if not _is_int(v):
            raise WrongType
        if not lo <= v <= hi:
            raise BadValue
        return v
    return check


# [memory] torch_discards: besides true and false, "poison", the diagnostic that writes dead
# tensors' blocks with 0xFF bytes instead of discarding them (shim/base/shim.h's pump_discards)
DISCARDS_POISON = "poison"
_TOML_DISCARDS = f'true, false or "{DISCARDS_POISON}" (dead tensors written with NaN instead: a diagnostic)'


def _discards(v):
    if isinstance(v, bool):
        return v
    if not isinstance(v, str):
        raise WrongType
    if v != DISCARDS_POISON:
        raise BadValue
    return v


def _path(v):
    if not isinstance(v, str):
        raise WrongType
    if not v or "\0" in v:
        raise BadValue
    return v


def _name(v):
    if not isinstance(v, str):
        raise WrongType
    try:
        return check_name(v)
    except BadValueError:
        raise BadValue from None


def _size_or(checker: Callable[[str], str]) -> Callable[[Any], str]:
    """A TOML integer > 0 (bytes), or a string the checker accepts; normalised to a string
    in the shim's grammar."""
    def check(v):
        if _is_int(v):
            if not 0 < v < SIZE_LIMIT:
                raise BadValue
            return str(v)
        if not isinstance(v, str):
            raise WrongType
        try:
            return checker(v)
        except ValueError:
            raise BadValue from None
    return check


def _share(v):
    if not (_is_int(v) or isinstance(v, float)):
        raise WrongType
    if not 0 < v <= SHARE_MAX:  # nan fails too
        raise BadValue
    return v


def _interval(v):
    if not (_is_int(v) or isinstance(v, float)):
        raise WrongType
    if not 0 < v <= 3600:  # nan fails too
        raise BadValue
    return float(v)


def _listen(v):
    if not isinstance(v, str):
        raise WrongType
    if v.startswith("/"):  # a Unix socket: sun_path holds 107 bytes and a NUL
        if "\0" in v or len(os.fsencode(v)) > 107:
            raise BadValue
        return v
    try:
        parse_listen(v)
    except ValueError:
        raise BadValue from None
    return v


def _choices(*choices: str) -> str:
    return ", ".join(f'"{c}"' for c in choices)


_TOML_SIZE = (
    'an integer > 0 (bytes), or a string: a byte count > 0 with an optional unit '
    '(K, M, G, T or KiB, MiB, GiB, TiB: binary; KB, MB, GB, TB: decimal; any case) such as "512MiB" or "8G"'
)
_TOML_BUDGET = _TOML_SIZE + ', or a percentage of the device "1%".."100%"'
_TOML_CAPACITY = _TOML_SIZE + ', a percentage of the device "1%".."100%", or "host"'
_TOML_POOL = _TOML_SIZE + ', or a percentage of each GPU\'s memory "1%".."100%" (known through NVML)'
_TOML_PATH = "a non-empty string (a path)"
_TOML_BOOL = "a boolean (true or false)"


@dataclasses.dataclass(frozen=True)
class Key:
    field: str        # the dataclass field it sets
    check: Callable[[Any], Any]  # value -> normalised value; raises WrongType / BadValue
    allowed: str      # shown after "allowed: " for a bad value
    expected: str     # shown after "expected " for a wrong type


def _key(field, check, allowed, expected=None):
    return Key(field, check, allowed, expected or allowed)


def _enum_key(field, *choices):
    return _key(field, _enum(*choices), _choices(*choices), "one of " + _choices(*choices))


_PER_USER = "an integer >= 1, at most the cap for all users (docs/daemon-limits.md)"

# section -> key -> Key, in schema order (the order messages list them in).
JOB_SCHEMA: Dict[str, Dict[str, Key]] = {
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
        # PyTorch's CUDA allocator: its own caching one, or pump's (shim/hooks/torch_allocator.c)
        "torch_allocator": _enum_key("torch_allocator", *TORCH_ALLOCATORS),
        # false: each launch makes its own room under a budget (PUMP_EVICT_AHEAD=0, shim/policy/residency_ahead.c)
        "evict_ahead": _key("evict_ahead", _boolean, _TOML_BOOL),
        # true (the default): the caching allocator's dead tensors are discarded under a budget
        # (PUMP_TORCH_DISCARDS, shim/hooks/torch_trace.c; docs/limits.md); "poison": written with NaN
        # instead, the diagnostic that tells pump's choice of dead memory from the driver's discard
        "torch_discards": _key("torch_discards", _discards, _TOML_DISCARDS),
        # true: the caching allocator's tensors go to pumpd by their names, their places in the step
        # (PUMP_TORCH_NAMES, shim/lookup/names.h), so that lookahead can learn the step there
        "torch_names": _key("torch_names", _boolean, _TOML_BOOL),
        # true: pump's allocator's dead tensors, in the blocks it keeps for placement, are discarded on
        # pump's worker once the GPU passed their frees (PUMP_HELD_DISCARDS, shim/policy/held_discards.c)
        "held_discards": _key("held_discards", _boolean, _TOML_BOOL),
    },
    "trace": {
        "file": _key("trace_file", _path, _TOML_PATH),
    },
    "daemon": {
        "mode": _enum_key("daemon_mode", *DAEMON_MODES),
        "socket": _key("daemon_socket", _path, _TOML_PATH),
    },
}

DAEMON_SCHEMA: Dict[str, Dict[str, Key]] = {
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
    # What one user may make pumpd hold (docs/daemon-limits.md): pumpd holds each to the cap for
    # all users, which it checks at start (daemon/pumpd/limits.py, configure).
    "limits": {name: _key("limit_" + name, _int_range(1, 2**31 - 1), _PER_USER)
               for name in ("connections_per_user", "sessions_per_user", "jobs_per_user",
                            "kernel_names_per_user", "allocations_per_user", "planned_blocks_per_user",
                            "pending_records_per_user", "plan_overruns")}
    | {"plan_deadline_s": _key("limit_plan_deadline_s", _interval, "a number > 0 and <= 3600 (seconds)")},
}


def _did_you_mean(name: str, choices, shown: str) -> str:
    """ " (did you mean X?)" for the choice nearest a misspelt name, or nothing."""
    near = difflib.get_close_matches(str(name).lower(), list(choices), n=1, cutoff=0.6)
    return f" (did you mean {shown.format(near[0])}?)" if near else ""


def validate(path: str, doc: dict, schema: Dict[str, Dict[str, Key]]) -> Dict[str, Any]:
    """field -> value for what the document sets; raises ConfigError with every problem."""
    errors: List[str] = []
    values: Dict[str, Any] = {}
    sections = ", ".join(f"[{s}]" for s in schema)
    for sname, table in doc.items():
        keys = schema.get(sname)
        where = f"{path}: [{toml_key(sname)}]"
        if keys is None:
            errors.append(f"{path}: unknown section [{toml_key(sname)}]{_did_you_mean(sname, schema, '[{}]')}; "
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
            except WrongType:
                errors.append(f"{where} {kname}: expected {key.expected}, "
                              f"got {toml_type(value)} {shown(value)}")
            except BadValue:
                errors.append(f"{where} {kname}: bad value {shown(value)}; allowed: {key.allowed}")
    if errors:
        raise ConfigError(errors)
    return values

