"""Which pod a client is in, so that pods that share a uid do not share jobs.

pumpd runs in the host's pid namespace (in Kubernetes its DaemonSet sets hostPID), so
SO_PEERCRED names a client by its host pid and /proc/PID is the client's.  The rule:

- a client whose pid namespace is nested deeper than pumpd's (the NSpid: line of the
  world-readable /proc/PID/status lists more pids than pumpd's own) is in a container,
  and its realm is its cgroup (the world-readable /proc/PID/cgroup: one per container
  under Kubernetes, Docker and Podman);
- any other client's realm is "" (the host): a user's processes share their jobs
  whatever their cgroups (Slurm puts each job in one; `pump status` runs in another).

A job belongs to (uid, realm).  Where the kernel has SO_PEERPIDFD (Linux 6.5), pumpd
checks after reading /proc that the process it read is still the one that connected, so
a pid reused in between is not taken for it.
"""

import functools
import hashlib
import os
import signal
import socket

SO_PEERPIDFD = getattr(socket, "SO_PEERPIDFD", 77)  # linux/asm-generic/socket.h


class ProcessGone(OSError):
    """The process that connected is gone: its pid may name another by now."""


def _depth(pid) -> int:
    """How many pid namespaces the process is in (NSpid: one pid per namespace)."""
    with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as f:
        for line in f:
            if line.startswith("NSpid:"):
                return len(line.split()) - 1
    return 1  # a kernel before 4.1: no NSpid, no way to tell


@functools.lru_cache(maxsize=1)
def _own_depth() -> int:
    return _depth("self")


def realm(sock: socket.socket, pid: int) -> str:
    """The realm of the process at the other end of sock (pid from SO_PEERCRED)."""
    try:
        pidfd = sock.getsockopt(socket.SOL_SOCKET, SO_PEERPIDFD)
    except OSError:
        pidfd = None  # before Linux 6.5: pid and start time only (the Connection's)
    try:
        try:
            if _depth(pid) <= _own_depth():
                found = ""
            else:
                with open(f"/proc/{pid}/cgroup", "rb") as f:
                    found = "cgroup:" + hashlib.sha256(f.read()).hexdigest()[:16]
        except (FileNotFoundError, ProcessLookupError):
            raise ProcessGone(f"pid {pid} is gone") from None
        except PermissionError:  # /proc mounted hidepid: pumpd cannot tell, the host's
            found = ""
        if pidfd is not None:
            try:
                signal.pidfd_send_signal(pidfd, 0)
            except ProcessLookupError:
                raise ProcessGone(f"pid {pid} is gone") from None
            except PermissionError:
                pass  # another user's process, alive
        return found
    finally:
        if pidfd is not None:
            os.close(pidfd)
