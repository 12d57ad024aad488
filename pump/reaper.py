"""A pump-run killed with SIGKILL leaves nothing behind: its job's whole process tree ends.

Two parts, because a SIGKILL gives pump-run no chance to clean up itself:
- the command pump-run starts gets a parent-death signal (prctl PR_SET_PDEATHSIG,
  SIGKILL), set between fork and exec and checked against the race (pump-run may die
  before it is set: then getppid() is no longer pump-run and the child kills itself);
- its descendants (torchrun ranks, data-loader workers) have pump-run's child, not
  pump-run, as their parent, so a survivor must end them: a small watchdog, started
  in its own session, holds the read end of a pipe only pump-run can write.  pump-run
  writes "done" when the command has exited; end of file without it means pump-run
  died, and the watchdog SIGKILLs every process of the user's whose environment holds
  this job's random token (PUMP_RUN_TOKEN, which the command's whole tree inherits).

Why not a process group: the job must stay in the terminal's foreground group for
Ctrl-C to reach it as it would without pump (see pump/run.py's signal rules), and a
group holds more than the job (`pump-run job | tee log`).  Why not a cgroup: an
unprivileged user can make one only through systemd or cgroup delegation, which
batch nodes and containers often lack.  Why not pumpd: --daemon none has none, and a
shared pumpd may be gone.  Limits: a process that execs with an environment of its
own choosing, without the token, escapes (docs/daemon-sharing.md).
"""

import ctypes
import os
import secrets
import signal
import subprocess
import sys
import time

TOKEN_ENV = "PUMP_RUN_TOKEN"
PR_SET_PDEATHSIG = 1
KILL_ROUNDS = 100  # a tree that keeps forking is swept again, 20 ms apart

_libc = ctypes.CDLL(None, use_errno=True)  # loaded before any fork: preexec_fn only calls it


def die_with_parent(parent_pid: int):
    """In the child before exec: SIGKILL when pump-run dies, and now if it already has (a
    prctl that fails, which Linux never does for this option, leaves the watchdog alone)."""
    if _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0 and os.getppid() != parent_pid:
        os.kill(os.getpid(), signal.SIGKILL)


class Watchdog:
    """pump-run's side: start the watchdog; env() marks the job's processes; disarm() once
    the command has exited."""

    def __init__(self):
        self.token = secrets.token_hex(16)
        read_end, self.write_end = os.pipe()  # both close on exec: the job never holds them
        try:
            subprocess.Popen([sys.executable, "-m", "pump.reaper", self.token], stdin=read_end,
                             stdout=subprocess.DEVNULL, cwd="/", start_new_session=True,
                             env={k: v for k, v in os.environ.items() if k not in (TOKEN_ENV, "LD_PRELOAD")})
        finally:
            os.close(read_end)

    def env(self) -> dict:
        return {TOKEN_ENV: self.token}

    def disarm(self):
        os.write(self.write_end, b"done")
        os.close(self.write_end)


def _marked(token: str):
    """pidfds of this user's processes (not this one) whose environment holds the token:
    the pidfd is taken before the environment is read, so a reused pid is never signalled."""
    needle = f"{TOKEN_ENV}={token}".encode()
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            pidfd = os.pidfd_open(int(name))
        except OSError:
            continue
        try:
            if os.stat(f"/proc/{name}").st_uid == os.geteuid():
                with open(f"/proc/{name}/environ", "rb") as f:
                    if needle in f.read().split(b"\0"):
                        yield pidfd
                        continue
        except OSError:
            pass
        os.close(pidfd)


def kill_marked(token: str) -> int:
    """SIGKILL every marked process until none is left; how many were signalled."""
    killed = 0
    for _ in range(KILL_ROUNDS):
        found = 0
        for pidfd in _marked(token):
            try:
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
                found += 1
            except OSError:
                pass
            finally:
                os.close(pidfd)
        if not found:
            break
        killed += found
        time.sleep(0.02)
    return killed


def main(argv) -> int:
    if sys.stdin.buffer.read() != b"done":  # end of file alone: pump-run died
        kill_marked(argv[1])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
