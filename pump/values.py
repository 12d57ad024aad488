"""The values pump's settings take, one grammar for command-line flags, TOML files and the
shim's environment: sizes, capacities and budgets (the shim parses the same in
``shim/base/config.c``: ``PUMP_CAPACITY``, ``PUMP_BUDGET``), job names, listen addresses.

Each checker returns the value (a size in bytes, or the text unchanged) or raises
:class:`BadValueError` naming the value and what is allowed.  Capacity (the cap on a job's
managed footprint) and budget (the cap on its GPU-resident bytes) are distinct everywhere.
"""

from __future__ import annotations

import argparse
import ipaddress
import re
from typing import Optional, Tuple

# Read as written, in any case: 8gb is 8 x 10^9 bytes, 8gib and 8g 8 x 2^30.
_SIZE_UNITS = {
    "": 1,
    "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40,
    "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
}
# ASCII digits only (\d would take other scripts' digits, which the shim does not).
_SIZE_RE = re.compile(r"([0-9]+)(" + "|".join(u for u in _SIZE_UNITS if u) + r")?", re.IGNORECASE)
_PERCENT_RE = re.compile(r"([0-9]+)%")
SIZE_LIMIT = 1 << 64  # the shim holds sizes in a uint64_t

# What is allowed, as plain text (for argparse help, escape % as %%).
SIZE_ALLOWED = "bytes, or a size like 8GiB, 8G (binary) or 8GB (decimal) with K, M, G or T"
BUDGET_ALLOWED = SIZE_ALLOWED + "; or 1%..100% of the device"
CAPACITY_ALLOWED = SIZE_ALLOWED + "; 1%..100% of the device; or host"
NAME_ALLOWED = "1 to 64 characters: a letter or digit, then letters, digits, '.', '_' or '-'"
_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


class BadValueError(ValueError, argparse.ArgumentTypeError):
    """A value outside what is allowed; the message says what is.

    Also an argparse.ArgumentTypeError, so the checkers below can be an argparse
    ``type=`` and their message is shown as it is."""


def _size_bytes(text: str) -> Optional[int]:
    m = _SIZE_RE.fullmatch(text)
    if not m:
        return None
    n = int(m.group(1)) * _SIZE_UNITS[(m.group(2) or "").lower()]
    return n if 0 < n < SIZE_LIMIT else None


def _is_percent(text: str) -> bool:
    m = _PERCENT_RE.fullmatch(text)
    return bool(m) and 1 <= int(m.group(1)) <= 100


def parse_size(text: str) -> int:
    """Bytes of a size such as "512MiB", "8G", "2TB" or "1073741824" (> 0, < 2**64).

    Raises BadValueError (a ValueError) saying what is allowed."""
    n = _size_bytes(text) if isinstance(text, str) else None
    if n is None:
        raise BadValueError(f"bad value {text!r}; allowed: {SIZE_ALLOWED}")
    return n


def check_capacity(text: str) -> str:
    """Check a capacity (a size, a percentage "1%".."100%" of the device, or "host")
    against the shim's grammar (PUMP_CAPACITY); return it unchanged.

    Raises BadValueError (a ValueError) saying what is allowed."""
    if isinstance(text, str) and (text == "host" or _is_percent(text) or _size_bytes(text) is not None):
        return text
    raise BadValueError(f"bad value {text!r}; allowed: {CAPACITY_ALLOWED}")


def check_budget(text: str) -> str:
    """Check a budget (a size or a percentage "1%".."100%" of the device; not "host")
    against the shim's grammar (PUMP_BUDGET); return it unchanged.

    Raises BadValueError (a ValueError) saying what is allowed."""
    if isinstance(text, str) and (_is_percent(text) or _size_bytes(text) is not None):
        return text
    raise BadValueError(f"bad value {text!r}; allowed: {BUDGET_ALLOWED}")


def check_size(text: str) -> str:
    """Check a plain size (no percentage); return it unchanged."""
    parse_size(text)
    return text


def check_name(text: str) -> str:
    """Check a job name (1-64 characters, ^[A-Za-z0-9][A-Za-z0-9._-]*$); return it.

    A valid name is safe as a file name (no '/', never '.' or '..').
    Raises BadValueError (a ValueError) saying what is allowed."""
    if isinstance(text, str) and _NAME_RE.fullmatch(text):
        return text
    raise BadValueError(f"bad value {text!r}; allowed: {NAME_ALLOWED}")


_LISTEN6_RE = re.compile(r"\[([^\[\]]+)\]:([0-9]{1,5})")
_LISTEN4_RE = re.compile(r"([^\[\]:]+):([0-9]{1,5})")


def parse_listen(text: str) -> Tuple[str, int]:
    """(host, port) of "HOST:PORT": an IPv4 address or "localhost", or "[IPv6]:PORT"
    (the host is returned without brackets); port 1..65535.

    Raises BadValueError (a ValueError) saying what is allowed."""
    if isinstance(text, str):
        m6 = _LISTEN6_RE.fullmatch(text)
        m = m6 or _LISTEN4_RE.fullmatch(text)
        if m and 1 <= int(m.group(2)) <= 65535:
            host = m.group(1)
            try:
                if m6:
                    ipaddress.IPv6Address(host)
                elif host != "localhost":
                    ipaddress.IPv4Address(host)
            except ValueError:
                pass
            else:
                return host, int(m.group(2))
    raise BadValueError(f"bad value {text!r}; allowed: {_LISTEN_ALLOWED_TEXT}")


_LISTEN_ALLOWED_TEXT = (
    "HOST:PORT with an IPv4 address or localhost, or [IPv6 address]:PORT; port 1..65535"
)
