"""What pumpd needs of systemd, in the standard library only: readiness
notification (sd_notify), the watchdog (sd_watchdog_enabled), socket activation
(sd_listen_fds) and priority prefixes for journald (sd-daemon). Each is a no-op
outside systemd.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket

SD_LISTEN_FDS_START = 3
_LISTEN_VARS = ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES")


def notify(state: str) -> bool:
    """Send ``state`` (e.g. ``"READY=1"``, ``"STATUS=serving 3 jobs"``,
    ``"STOPPING=1"``; several newline-separated assignments are allowed) as one
    datagram to ``$NOTIFY_SOCKET``. Returns whether it was sent. A no-op
    returning False when the variable is unset or names no Unix socket (an
    ``@name`` is an abstract socket); never raises: a service must not fail
    because its supervisor went away."""
    addr = os.environ.get("NOTIFY_SOCKET")
    if not addr or addr[0] not in "/@":
        return False
    if addr[0] == "@":
        addr = "\0" + addr[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
            s.connect(addr)
            s.sendall(state.encode())
        return True
    except (OSError, UnicodeError):
        return False


def watchdog_interval() -> float | None:
    """How often to send WATCHDOG=1, in seconds: half of $WATCHDOG_USEC (what
    sd_watchdog_enabled advises), when the watchdog is on for this process
    ($WATCHDOG_PID unset or ours); else None. The variables are removed from the
    environment, so no child takes the watchdog for its own."""
    usec, pid = os.environ.pop("WATCHDOG_USEC", None), os.environ.pop("WATCHDOG_PID", None)
    if not usec or not usec.isdigit() or int(usec) == 0:
        return None
    if pid is not None and (not pid.isdigit() or int(pid) != os.getpid()):
        return None
    return int(usec) / 2e6


async def feed_watchdog(interval: float):
    """Sends WATCHDOG=1 every ``interval`` seconds, from the event loop it runs on: if
    that loop freezes, the pings stop and systemd restarts the service."""
    while True:
        notify("WATCHDOG=1")
        await asyncio.sleep(interval)


def listen_fds() -> list[socket.socket]:
    """The listening sockets systemd passed (socket activation), else []; see
    named_listen_fds()."""
    return [s for _, s in named_listen_fds()]


def named_listen_fds() -> list[tuple[str, socket.socket]]:
    """(name, socket) of each listening socket systemd passed (socket activation), else [];
    a name is the socket's FileDescriptorName= ($LISTEN_FDNAMES), "" where none was given.

    They are fds 3 .. 3+$LISTEN_FDS-1, meant for this process only if
    $LISTEN_PID is our pid. The variables are removed from the environment
    whatever they said, so no child process takes them for its own; the fds are
    made close-on-exec. Each must be a listening AF_UNIX SOCK_STREAM socket
    (what pumpd serves on): anything else is a mistake in the .socket unit and
    raises ValueError, as do malformed variables."""
    pid, count = os.environ.get("LISTEN_PID"), os.environ.get("LISTEN_FDS")
    names = os.environ.get("LISTEN_FDNAMES", "").split(":")
    for var in _LISTEN_VARS:
        os.environ.pop(var, None)
    if pid is None or count is None:
        return []
    if not pid.isdigit() or not count.isdigit():
        raise ValueError(f"socket activation: malformed LISTEN_PID={pid!r} LISTEN_FDS={count!r}")
    if int(pid) != os.getpid():
        return []
    socks = []
    for fd in range(SD_LISTEN_FDS_START, SD_LISTEN_FDS_START + int(count)):
        try:
            s = socket.socket(fileno=fd)
        except OSError as e:
            raise ValueError(f"socket activation: fd {fd} is not a socket ({e.strerror})") from None
        if (s.family != socket.AF_UNIX or s.type != socket.SOCK_STREAM
                or not s.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)):
            s.detach()
            raise ValueError(f"socket activation: fd {fd} is {_name(s.family)} {_name(s.type)}"
                             f"{'' if s.type != socket.SOCK_STREAM else ' (not listening)'}; "
                             "pumpd needs a listening AF_UNIX SOCK_STREAM socket (ListenStream=/path, Accept=no)")
        s.set_inheritable(False)
        index = fd - SD_LISTEN_FDS_START
        socks.append((names[index] if index < len(names) else "", s))
    return socks


def _name(v):
    return getattr(v, "name", v)


def stderr_is_journal() -> bool:
    """Whether stderr is connected to journald: systemd sets $JOURNAL_STREAM to
    the stream's "DEVICE:INODE", which must match stderr's (a child with
    redirected stderr inherits the variable but not the stream)."""
    try:
        dev, ino = (int(x) for x in os.environ["JOURNAL_STREAM"].split(":"))
        st = os.fstat(2)
    except (KeyError, ValueError, OSError):
        return False
    return (st.st_dev, st.st_ino) == (dev, ino)


class JournalFormatter(logging.Formatter):
    """Prefixes each line with its sd-daemon priority (``<3>`` error, ``<4>``
    warning, ``<6>`` info, ``<7>`` debug; ``<2>`` critical) so that journald
    files it at that priority; every line of a multi-line record (a traceback)
    gets the prefix, as journald reads each line as an entry. journald adds the
    time and the unit, so the default format is just ``name: message``."""

    def __init__(self, fmt: str | None = "%(name)s: %(message)s", *args, **kwargs):
        super().__init__(fmt, *args, **kwargs)

    @staticmethod
    def priority(levelno: int) -> int:
        if levelno >= logging.CRITICAL:
            return 2
        if levelno >= logging.ERROR:
            return 3
        if levelno >= logging.WARNING:
            return 4
        if levelno >= logging.INFO:
            return 6
        return 7

    def format(self, record: logging.LogRecord) -> str:
        prefix = f"<{self.priority(record.levelno)}>"
        return "\n".join(prefix + line for line in super().format(record).split("\n"))
