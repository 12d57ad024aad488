"""pump's configuration files as TOML: reading a file into a document (every failure one
:class:`ConfigError` naming the file), and values rendered back as TOML for messages."""

from __future__ import annotations

import math
import os
import re
import stat
import sys
from typing import Any, List, Optional

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.9/3.10
    import tomli as tomllib


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


def toml_key(k: str) -> str:
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
        return "{" + ", ".join(f"{toml_key(k)} = {_toml_value(x)}" for k, x in v.items()) + "}"
    if hasattr(v, "isoformat"):
        return v.isoformat()
    return repr(v)


def shown(v: Any) -> str:
    """A value as TOML, cut short if long."""
    text = _toml_value(v)
    return text if len(text) <= _RENDER_LIMIT else text[:_RENDER_LIMIT] + "..."


def toml_type(v: Any) -> str:
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



CONFIG_MAX_BYTES = 1 << 20   # a config file holds a few settings


def _read_capped(path: str) -> bytes:
    """At most CONFIG_MAX_BYTES + 1 bytes of a file, of standard input for "-", or of a pipe
    (`--config <(...)`). Opened without blocking, so that a FIFO nobody writes reads as empty
    rather than hanging the open; then read blocking, as a pipe's writer may still be writing."""
    if path == "-":
        return sys.stdin.buffer.read(CONFIG_MAX_BYTES + 1)
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        if stat.S_ISFIFO(os.fstat(fd).st_mode):
            os.set_blocking(fd, True)
        chunks, size = [], 0
        while size <= CONFIG_MAX_BYTES:
            chunk = os.read(fd, CONFIG_MAX_BYTES + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_toml(path: str, missing_ok: bool = False) -> Optional[dict]:
    """The document in a file (None if it does not exist and missing_ok); "-" is standard input."""
    try:
        data = _read_capped(path)
    except FileNotFoundError as exc:
        if missing_ok:
            return None
        raise ConfigError([f"{path}: cannot read: {exc.strerror or exc}"]) from None
    except OSError as exc:
        raise ConfigError([f"{path}: cannot read: {exc.strerror or exc}"]) from None
    if len(data) > CONFIG_MAX_BYTES:
        raise ConfigError([f"{path}: more than 1 MiB: not a config file (pump's hold a few settings)"])
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

