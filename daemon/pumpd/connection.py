"""One client connection of pumpd: framed requests in, replies out (with fds when asked).

A started message must be complete within MESSAGE_TIMEOUT; until its first
message is complete a connection counts as incomplete (limits.INCOMPLETE_PER_UID_MAX).

Descriptors a client sends are owned from recvmsg on (taken close-on-exec) by one
Descriptors object per message, which closes whatever it has not handed on. A
connection is read a message at a time, so it holds at most FDS_MAX received
descriptors: the first one past that drops it (as dbus-daemon's max_message_unix_fds),
however the client spreads them over its sendmsg calls.
"""

import array
import asyncio
import os
import socket
import struct

from pump import protocol
from pump.protocol import ProtocolError
from pumpd.jobs import start_time

MESSAGE_TIMEOUT = 10.0       # a started message must be complete within this


def peer_credentials(sock):
    pid, uid, gid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                         struct.calcsize("3i")))
    return pid, uid, gid


class Connection:
    """One client socket: framed messages in, replies out (with fds when asked)."""

    def __init__(self, sock: socket.socket, on_first_message=None):
        self.sock = sock
        self.pid, self.uid, self.gid = peer_credentials(sock)
        self.started = start_time(self.pid)  # ties the pid to the process that connected
        self.session = None  # the Session this connection attached or resumed
        self.job = None      # ... and its Job
        self.on_first_message = on_first_message  # called once, when a first message is complete

    async def _ready(self, writing: bool = False):
        """Until the socket can be read (or written)."""
        loop = asyncio.get_running_loop()
        add, remove = (loop.add_writer, loop.remove_writer) if writing else (loop.add_reader, loop.remove_reader)
        ready = loop.create_future()
        add(self.sock, lambda: ready.done() or ready.set_result(None))
        try:
            await ready
        finally:
            remove(self.sock)

    async def _recv(self, n: int, fds: "Descriptors") -> bytes:
        while True:
            try:
                data, ancillary, flags, _ = self.sock.recvmsg(
                    n, socket.CMSG_SPACE(protocol.FDS_MAX * array.array("i").itemsize), socket.MSG_CMSG_CLOEXEC)
            except (BlockingIOError, InterruptedError):
                await self._ready()
                continue
            fds.receive(ancillary)
            if flags & socket.MSG_CTRUNC:  # the kernel closed those that did not fit
                raise ProtocolError(fds.too_many)
            return data

    async def _recv_exact(self, n: int, fds: "Descriptors", first: bytes = b"") -> bytes:
        data = first
        while len(data) < n:
            chunk = await self._recv(n - len(data), fds)
            if not chunk:
                raise ConnectionError("closed mid-message")
            data += chunk
        return data

    async def read_request(self, fds: "Descriptors"):
        """The next request as a dict, None at a clean EOF; ProtocolError if malformed."""
        first = await self._recv(protocol.HEADER.size, fds)
        if not first:
            return None
        try:
            return await asyncio.wait_for(self._finish(first, fds), MESSAGE_TIMEOUT)
        except asyncio.TimeoutError:
            raise ProtocolError(f"message not completed within {MESSAGE_TIMEOUT:g} s") from None

    async def _finish(self, first: bytes, fds: "Descriptors"):
        header = await self._recv_exact(protocol.HEADER.size, fds, first)
        kind, length = protocol.parse_header(header)
        if kind != protocol.REQUEST:
            raise ProtocolError(f"expected a request (type {protocol.REQUEST}), got type {kind}")
        payload = await self._recv_exact(length, fds)
        if self.on_first_message is not None:
            self.on_first_message()
            self.on_first_message = None
        try:
            return protocol.validate_request(protocol.parse_payload(payload))
        except ProtocolError as exc:
            raise RequestError(str(exc)) from None  # well framed: the connection can go on

    async def send(self, doc: dict, kind: int = protocol.REPLY, fds=()):
        data = protocol.encode(doc, kind)
        ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
        loop = asyncio.get_running_loop()
        while True:
            try:
                sent = self.sock.sendmsg([data], ancillary)
                break
            except (BlockingIOError, InterruptedError):
                await self._ready(writing=True)
        if sent < len(data):
            await loop.sock_sendall(self.sock, data[sent:])


class Descriptors:
    """Descriptors pumpd holds for one message: received ones (at most `limit`; the first
    past it is a ProtocolError, and all stay here to be closed) or a reply's. Each is closed
    by close() unless handed on with hand() to the object that keeps it."""

    def __init__(self, fds=(), limit: int = protocol.FDS_MAX):
        self.limit = limit
        self._fds = list(fds)

    @property
    def too_many(self) -> str:
        return f"more file descriptors than a message may carry; at most {self.limit}"

    def receive(self, ancillary):
        """Take the descriptors of recvmsg's ancillary data: every one is owned here before
        any check can raise."""
        for level, kind, payload in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                got = array.array("i")
                got.frombytes(payload[: len(payload) - len(payload) % got.itemsize])
                self._fds.extend(got)
        if len(self._fds) > self.limit:
            raise ProtocolError(self.too_many)

    def __len__(self):
        return len(self._fds)

    def __iter__(self):
        return iter(self._fds)

    def __getitem__(self, i: int) -> int:
        return self._fds[i]

    def hand(self, i: int, keeper):
        """keeper(the i-th descriptor): what it returns owns the descriptor from then on; if
        it raises, the descriptor stays here and is closed with the rest."""
        kept = keeper(self._fds[i])
        del self._fds[i]
        return kept

    def close(self):
        fds, self._fds = self._fds, []
        for fd in fds:
            os.close(fd)


class RequestError(ProtocolError):
    """A well-framed request the daemon refuses: the connection stays open."""
