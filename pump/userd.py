"""The user's shared pumpd: one per uid, boot and pid namespace, on the checked runtime
directory (pump/runtime_dir.py), for every job the user runs without a system service.

pump-run finds it by its socket, or starts it: a pumpd in its own session (setsid, so
the first job's Ctrl-C, hangup or end does not reach it) that exits once it has had no
job for a grace period.  Two pump-runs starting at once each start one; the pumpds hold
an election by flock() on a lock file beside the socket, held for the winner's lifetime:
the loser exits at once, and its pump-run takes the winner's socket ("join the winner").
A lock whose holder died is free again (the kernel drops it), and the winner clears the
stale socket before it binds.  docs/daemon-sharing.md says what is trusted and which
configuration governs.
"""

import fcntl
import os
import subprocess
import sys
import time

from pump import protocol, runtime_dir

GRACE_ENV = "PUMP_DAEMON_GRACE"  # seconds the shared pumpd stays with no job
GRACE_DEFAULT = 5.0
START_TIMEOUT = 15.0             # seconds a starting pumpd may take to answer
LOCK_NAME = "pumpd.lock"
LOG_NAME = "pumpd.log"


def grace_seconds() -> float:
    text = os.environ.get(GRACE_ENV, "")
    if not text:
        return GRACE_DEFAULT
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value <= 3600:
        raise ValueError(f"{GRACE_ENV}={text!r}: must be a number of seconds, 0 to 3600")
    return value


# ---- the daemon's side: the election ----
def hold_lock(socket_path: str, wait_s: float = START_TIMEOUT):
    """pumpd's lock on its directory, a descriptor to keep open for its lifetime; None when
    another pumpd holds it and answers on socket_path (or still holds it after wait_s)."""
    path = os.path.join(os.path.dirname(socket_path), LOCK_NAME)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            pass
        # A holder that answers is the winner; one that is stopping lets go soon.
        if protocol.ping(socket_path, timeout=0.5) is not None or time.monotonic() > deadline:
            os.close(fd)
            return None
        time.sleep(0.05)


# ---- the client's side: find it or start it ----
def shared_socket(verbose: int = 0) -> str:
    """The socket of the user's shared pumpd, started if none answers; OSError (with the
    runtime directory's RuntimeDirError as its text) when it cannot be."""
    try:
        directory = runtime_dir.user_runtime_dir()
    except runtime_dir.RuntimeDirError as exc:
        raise OSError(str(exc)) from None
    path = os.path.join(directory, runtime_dir.SOCKET_NAME)
    if protocol.ping(path) is None:
        _start(directory, path, verbose)
    return path


def _start(directory: str, path: str, verbose: int):
    log_path = os.path.join(directory, LOG_NAME)
    log_fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    # Its own start configuration: /etc/pump/pumpd.toml if present, never the first job's
    # PUMP_* variables or preload (the daemon serves jobs that come later too).
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD" and not k.startswith("PUMP_")}
    argv = [sys.executable, "-m", "pumpd", "--socket", path, "--foreground", "--shared",
            "--idle-exit", f"{grace_seconds():g}"] + ["-v"] * verbose
    try:
        daemon = subprocess.Popen(argv, env=env, cwd="/", stdin=subprocess.DEVNULL, stdout=log_fd,
                                  stderr=log_fd, start_new_session=True)
    finally:
        os.close(log_fd)
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if protocol.ping(path, timeout=0.5) is not None:
            return  # ours, or the winner of a race
        if daemon.poll() not in (None, 0):  # 0: it lost the election; the winner answers soon
            raise OSError(f"the shared pumpd exited with status {daemon.returncode} (see {log_path})")
        time.sleep(0.05)
    raise OSError(f"no shared pumpd answers on {path} within {START_TIMEOUT:g} s (see {log_path})")
