"""pump's wire protocol on pumpd's Unix socket.

A message is ``struct pump_msg_header`` (pump_channel.h: magic, version, type,
payload length) followed by at most PUMP_MSG_PAYLOAD_MAX bytes of a UTF-8 JSON
object.  A request names its ``op``; the reply is ``{"ok": true, ...}`` (type
REPLY) or ``{"error": "..."}`` (type ERROR).  The ops, each request's fields and
their bounds are in REQUESTS below: pumpd validates every request against it and
answers anything else with an error naming what is wrong and what is allowed.

Ops (``pid`` and ``uid`` never travel in a request: pumpd takes them from the
socket's peer credentials, SO_PEERCRED):
  ping      who is there: {"ok", "version", "pid"}
  register  pump-run announces a job: name, policy, capacity, budget (bytes, or
            budget_percent), and the arbiter's share, min_budget, max_budget,
            priority -> {"job"}
  attach    a shim joins its job (or starts one) -> {"session", "job"} + 2 fds
  resume    a shim re-attaches after a daemon restart, with its 2 fds -> {"session"}
  status    the jobs the caller may see, a page at a time from ``offset`` (default 0),
            and each GPU's pool -> {"jobs": [...], "pools": [...], "total", "next"};
            "next" is the offset of the next page, null after the last
  set       steer one's own job (root: any): job, budget (0 or null: back to its
            config's or the arbiter's) -> {"job"}
  end       pump-run: the job's command has exited; pumpd reads what is left,
            closes its trace, and forgets the job once no process of it runs
"""

import json
import os
import re
import socket
import struct
import time

from pump import headers
from pump.config import PRIORITY_MAX, SHARE_MAX

ffi, C = headers.load("pump_channel.h")
VERSION = C.PUMP_PROTOCOL_VERSION
MAGIC = C.PUMP_MSG_MAGIC
PAYLOAD_MAX = C.PUMP_MSG_PAYLOAD_MAX
REQUEST, REPLY, ERROR = C.PUMP_MSG_REQUEST, C.PUMP_MSG_REPLY, C.PUMP_MSG_ERROR
TYPES = (REQUEST, REPLY, ERROR)

# The header's layout, from the header: a struct format built from its fields.
_FORMATS = {"uint32_t": "I", "uint16_t": "H"}
HEADER = struct.Struct(
    "<" + "".join(_FORMATS[f.type.cname] for _, f in ffi.typeof("struct pump_msg_header").fields)
)
assert HEADER.size == ffi.sizeof("struct pump_msg_header")
FDS_MAX = 2  # file descriptors one message may carry

SYSTEM_SOCKET = "/run/pump/pumpd.sock"
SOCKET_ENV = "PUMP_SOCKET"

JOB_ID_MAX = dict(ffi.typeof("struct pump_ring_header").fields)["job"].type.length - 1
NAME_MAX = 64
# A job id: pumpd makes them (Job.new_id); the shim's rule (shim/base/config.c pump_valid_job),
# checked wherever one arrives, since a job id names pumpd's state files.
JOB_ID_RULE = re.compile(r"[A-Za-z0-9_-]{1,%d}" % JOB_ID_MAX)
JOB_ID_ALLOWED = f"1..{JOB_ID_MAX} of [A-Za-z0-9_-]"


def valid_job_id(text) -> bool:
    return isinstance(text, str) and JOB_ID_RULE.fullmatch(text) is not None


def printable(text: str) -> str:
    """text with control and other unprintable characters escaped as repr() does, for
    logs and terminals (a name from a client could carry terminal escapes)."""
    return text if text.isprintable() else repr(text)[1:-1]


class ProtocolError(Exception):
    """A message that breaks the framing or the schema; str() says what and what is allowed."""


class PeerError(ProtocolError):
    """The daemon is not one pump may talk to (another uid, another protocol version)."""


# A run's group (pump-run --group, or from the launcher's environment): the pump-runs of one
# user that name the same group are one job. Opaque to pumpd: never a path.
GROUP_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}")
GROUP_ALLOWED = "1 to 64 characters of A-Z a-z 0-9 _ . : -, starting with a letter or digit"
RANK_MAX = (1 << 31) - 1


# ---- request schema: op -> {field: (kind, required, bound)} ----
def _size_or_none(v):
    return v is None or (isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 1 << 64)


def _text(v, n) -> bool:
    """A string of at most n characters that UTF-8 can encode: JSON's "\\ud800" decodes to a
    lone surrogate, which no trace header, log line or metrics label can hold."""
    if not isinstance(v, str) or len(v) > n:
        return False
    try:
        v.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


_CHECKS = {
    "str": (_text, "a string of at most {} characters that UTF-8 can encode (no lone surrogate such as \\ud800)"),
    "policy": (lambda v, n: v in ("off", "launch", "lookahead"), '"off", "launch" or "lookahead"'),
    "bytes": (lambda v, n: _size_or_none(v), "a byte count (0 .. 2**64-1) or null"),
    "bool": (lambda v, n: isinstance(v, bool), "true or false"),
    "share": (lambda v, n: isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v <= n,
              "a number > 0 and <= {}"),
    "job": (lambda v, n: valid_job_id(v), "a job id: " + JOB_ID_ALLOWED),
    "job_or_new": (lambda v, n: v == "" or valid_job_id(v), 'a job id: "" (a new job) or ' + JOB_ID_ALLOWED),
    "int": (lambda v, n: isinstance(v, int) and not isinstance(v, bool) and n[0] <= v <= n[1],
            "an integer {0[0]}..{0[1]}"),
    "group": (lambda v, n: isinstance(v, str) and GROUP_RE.fullmatch(v) is not None, GROUP_ALLOWED),
}
REQUESTS = {
    "ping": {},
    "register": {"name": ("str", True, NAME_MAX), "policy": ("policy", False, None),
                 "capacity": ("str", False, 64), "budget": ("bytes", False, None),
                 "trace": ("bool", False, None),
                 # the arbiter's terms (pump.config [memory]); sent only where set
                 "budget_percent": ("int", False, (1, 100)), "share": ("share", False, SHARE_MAX),
                 "min_budget": ("bytes", False, None), "max_budget": ("bytes", False, None),
                 "priority": ("int", False, (-PRIORITY_MAX, PRIORITY_MAX)),
                 # join the job of this user's other pump-runs of the same run, if one is running
                 "group": ("group", False, None)},
    "attach": {"job": ("job_or_new", True, None), "name": ("str", True, NAME_MAX),
               "policy": ("policy", True, None), "pid": ("bytes", False, None),
               "rank": ("int", False, (0, RANK_MAX))},
    "resume": {"pid": ("bytes", False, None), "rank": ("int", False, (0, RANK_MAX))},
    "status": {"offset": ("int", False, (0, 1 << 31))},
    "set": {"job": ("job", True, None), "budget": ("bytes", True, None)},
    "end": {"job": ("job", True, None)},
}


def validate_request(doc) -> dict:
    """Check a decoded request against REQUESTS; return it, or raise ProtocolError."""
    if not isinstance(doc, dict):
        raise ProtocolError(f"a request must be a JSON object, got {type(doc).__name__}")
    op = doc.get("op")
    if not isinstance(op, str) or op not in REQUESTS:
        raise ProtocolError(f"unknown op {_short(op)}; allowed: {', '.join(REQUESTS)}")
    schema = REQUESTS[op]
    for key in doc:
        if key != "op" and key not in schema:
            allowed = ", ".join(schema) or "none"
            raise ProtocolError(f"{op}: unknown field {_short(key)}; allowed: {allowed}")
    for key, (kind, required, bound) in schema.items():
        if key not in doc:
            if required:
                raise ProtocolError(f"{op}: missing field {key!r}")
            continue
        check, what = _CHECKS[kind]
        if not check(doc[key], bound):
            raise ProtocolError(f"{op}: field {key!r} must be {what.format(bound)}")
    return doc


def _short(value, n: int = 40) -> str:
    """repr(value), cut to about n characters: an error reply quotes what it refuses."""
    text = repr(value)
    return text if len(text) <= n else text[:n] + "..."


# ---- framing ----
def encode(doc: dict, kind: int = REQUEST) -> bytes:
    payload = json.dumps(doc, separators=(",", ":")).encode()
    if len(payload) > PAYLOAD_MAX:
        raise ProtocolError(f"message of {len(payload)} bytes; at most {PAYLOAD_MAX} allowed")
    return HEADER.pack(MAGIC, VERSION, kind, len(payload), 0) + payload


def parse_header(data: bytes):
    """(type, length) of a message header, or ProtocolError naming the bad field."""
    magic, version, kind, length, _reserved = HEADER.unpack(data)
    if magic != MAGIC:
        raise ProtocolError(f"bad magic 0x{magic:08x}; a pump message starts with 0x{MAGIC:08x}")
    if version != VERSION:
        raise ProtocolError(f"unsupported protocol version {version}; this pumpd speaks {VERSION}")
    if kind not in TYPES:
        raise ProtocolError(f"unknown message type {kind}; allowed: {', '.join(map(str, TYPES))}")
    if length > PAYLOAD_MAX:
        raise ProtocolError(f"payload of {length} bytes; at most {PAYLOAD_MAX} allowed")
    return kind, length


def parse_payload(data: bytes):
    try:
        return json.loads(data.decode("utf-8"), parse_constant=_reject_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise ProtocolError(f"payload is not a UTF-8 JSON object ({exc.__class__.__name__}: {exc})") from None


def _reject_constant(name):
    raise ValueError(f"{name} is not JSON")


# ---- a blocking client, for pump-run and `pump status` ----
def default_socket() -> str:
    """$PUMP_SOCKET, else the system service's socket."""
    return os.environ.get(SOCKET_ENV) or SYSTEM_SOCKET


def check_peer(sock, path: str):
    """Before anything is sent: the daemon is the caller's uid or root, else PeerError, so no
    request, job name or trace descriptor reaches another user.  SO_PEERCRED gives the
    credentials the daemon had when it called listen(): a system service that listens as
    root and then drops privileges still shows uid 0; one run as a dedicated user from the
    start is refused (docs/daemon-sharing.md)."""
    _pid, uid, _gid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                          struct.calcsize("3i")))
    if uid not in (0, os.geteuid()):
        raise PeerError(f"refusing the daemon on {path}: it runs as uid {uid}; pump talks only to "
                        f"a pumpd of its own uid ({os.geteuid()}) or root's")


class Client:
    """One connection to pumpd; request() sends a request and returns the reply."""

    def __init__(self, path: str, timeout: float = 5.0):
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        deadline = time.monotonic() + timeout
        try:
            while True:
                try:
                    self.sock.connect(path)
                    break
                except BlockingIOError:  # the listen backlog is full (a flood): wait a little
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.01)
            check_peer(self.sock, path)
        except (OSError, PeerError):
            self.sock.close()
            raise

    def close(self):
        self.sock.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def request(self, doc: dict, fds=()) -> dict:
        """Send a request; return the reply's object, or raise ProtocolError with the
        daemon's error text.  Any file descriptors the reply carries are in
        ``self.received_fds`` (the caller owns them)."""
        data = encode(doc)
        if fds:
            socket.send_fds(self.sock, [data], list(fds))
        else:
            self.sock.sendall(data)
        kind, payload = self._read_message()
        if kind == ERROR:
            raise ProtocolError(payload.get("error", "error") if isinstance(payload, dict) else "error")
        if kind != REPLY or not isinstance(payload, dict):
            raise ProtocolError("the daemon's reply is not a JSON object")
        return payload

    def _read_message(self):
        self.received_fds = []
        header = self._read_exact(HEADER.size)
        magic, version = HEADER.unpack(header)[:2]
        if magic == MAGIC and version != VERSION:
            raise PeerError(f"the pumpd on {self.path} speaks protocol version {version}; this pump "
                            f"speaks {VERSION} (stop that pumpd, or run the pump it came with)")
        kind, length = parse_header(header)
        return kind, parse_payload(self._read_exact(length))

    def _read_exact(self, n: int) -> bytes:
        chunks = []
        while n > 0:
            data, fds, _flags, _addr = socket.recv_fds(self.sock, n, FDS_MAX, socket.MSG_CMSG_CLOEXEC)
            self.received_fds.extend(fds)
            if not data:
                raise ConnectionError("pumpd closed the connection")
            chunks.append(data)
            n -= len(data)
        return b"".join(chunks)


def ping(path: str, timeout: float = 1.0):
    """The daemon's ping reply if one answers at path, else None."""
    try:
        with Client(path, timeout) as client:
            return client.request({"op": "ping"})
    except (OSError, ProtocolError):
        return None
