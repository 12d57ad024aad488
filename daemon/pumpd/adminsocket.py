"""The administrator's socket where pumpd binds it itself (pump/admin.py says what it is
for; systemd's pumpd-admin.socket and deploy/pumpd-entrypoint bind it otherwise)."""

import os
import socket


def listen_admin(path: str) -> socket.socket:
    """A listening socket at path, 0600, in a 0700 directory (made if missing)."""
    directory = os.path.dirname(path)
    os.makedirs(directory, mode=0o700, exist_ok=True)
    os.chmod(directory, 0o700)
    try:
        os.unlink(path)  # a stale one, left by a pumpd that died
    except FileNotFoundError:
        pass
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    old_umask = os.umask(0o177)
    try:
        sock.bind(path)
    finally:
        os.umask(old_umask)
    sock.listen(socket.SOMAXCONN)  # a flood of connects waits in the kernel, not refused
    return sock
