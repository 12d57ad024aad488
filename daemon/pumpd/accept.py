"""pumpd's accept loop, made to survive running out of file descriptors.

Under EMFILE/ENFILE a pending connection keeps the listener readable, and a loop
that only retries would spin.  As libevent and nginx do, pumpd keeps a reserve
descriptor (/dev/null): out of descriptors, it closes the reserve, accepts the
pending connection, tells it why and closes it, and opens the reserve again;
where even that fails it backs off.  It yields to the loop between accepts, and
raises its soft descriptor limit to the hard one at start.
"""

import asyncio
import errno
import logging
import os
import resource

from pump import protocol

log = logging.getLogger("pumpd")

BACKOFF = 0.1          # seconds to wait when no descriptor can be had at all
OUT_OF_DESCRIPTORS = (errno.EMFILE, errno.ENFILE)
NO_DESCRIPTOR_LEFT = "pumpd is out of file descriptors; try again later"
TRANSIENT = (errno.ECONNABORTED, errno.EINTR, errno.EAGAIN, errno.EPROTO, errno.EPERM)


def raise_descriptor_limit() -> int:
    """Raise RLIMIT_NOFILE's soft limit to the hard one; return the soft limit now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError) as exc:
            log.warning("cannot raise the descriptor limit from %d to %d: %s", soft, hard, exc)
    return soft


def refuse(sock, why: str):
    """Best effort: one error reply on a fresh connection, then close it."""
    try:
        sock.setblocking(False)
        sock.send(protocol.encode({"error": why}, protocol.ERROR))
    except OSError:
        pass
    sock.close()


class Reserve:
    """One descriptor held back to shed connections with when none is left."""

    def __init__(self):
        self.fd = self._open()

    @staticmethod
    def _open():
        try:
            return os.open("/dev/null", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return None

    def shed(self, listen_sock) -> bool:
        """Accept one pending connection with the reserve's descriptor, refuse it and
        close it; False if no connection was shed (no reserve to use, or even this accept
        failed: another thread took the descriptor freed), and the caller backs off."""
        if self.fd is None:
            self.fd = self._open()
            return False
        os.close(self.fd)
        self.fd = None
        try:
            conn, _ = listen_sock.accept()
        except OSError:
            conn = None
        else:
            refuse(conn, NO_DESCRIPTOR_LEFT)
        self.fd = self._open()
        return conn is not None

    def close(self):
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


async def accept_forever(listen_sock, admit, errors):
    """Accept connections and hand each socket to admit(); no OSError ends this."""
    loop = asyncio.get_running_loop()
    reserve = Reserve()
    shed = 0
    try:
        while True:
            try:
                conn, _ = await loop.sock_accept(listen_sock)
            except OSError as exc:
                if exc.errno in OUT_OF_DESCRIPTORS:
                    if shed % 1000 == 0:
                        log.warning("out of file descriptors: refusing connections (%d so far)", shed + 1)
                    shed += 1
                    if not reserve.shed(listen_sock):
                        await asyncio.sleep(BACKOFF)
                elif exc.errno not in TRANSIENT:
                    errors.error("accept", exc)
                    await asyncio.sleep(BACKOFF)
                await asyncio.sleep(0)
                continue
            admit(conn)
            await asyncio.sleep(0)  # the loop's other work runs between accepts
    finally:
        reserve.close()
