"""pump-run's link to a pumpd: find one (or start one for this job), register the job.

Modes (``--daemon``, ``[daemon] mode``):
  auto      the system pumpd if its socket answers, else the user's shared pumpd
            (pump/userd.py; started if none answers), which all of the user's jobs share
  system    the system pumpd; an error if none answers
  embedded  a pumpd started for this job alone, in a private directory, gone with it
  none      no daemon: the shim prefetches on its own (PUMP_SOCKET="")

The embedded pumpd is a child process (so a crash of either side spares the
other) that reports readiness the way it does to systemd, on a NOTIFY_SOCKET
pump-run listens on, and exits when pump-run is gone.
"""

import errno
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

from pump import config, outfile, protocol, userd

READY_TIMEOUT = 15.0  # seconds an embedded pumpd may take to start listening


class DaemonError(Exception):
    """No daemon where the mode requires one; str() says what to do."""


def _answers(path: str, mode: str) -> bool:
    """Whether a pumpd we may talk to answers at path; one of another uid or protocol
    version is an error under --daemon system, passed over with a warning under auto."""
    try:
        with protocol.Client(path, 1.0) as client:
            client.request({"op": "ping"})
        return True
    except protocol.PeerError as exc:
        if mode == "system":
            raise DaemonError(str(exc)) from None
        print(f"pump-run: warning: {exc}; using this user's own pumpd", file=sys.stderr)
        return False
    except (OSError, protocol.ProtocolError):
        return False


class DaemonLink:
    def __init__(self):
        self.socket_path = None
        self.job = None
        self.embedded = None   # the embedded pumpd's Popen
        self.directory = None  # its private directory
        self.trace_file = None  # --trace's path, once handed to pumpd

    def env(self) -> dict:
        """What the shim needs: where pumpd is (or "" for none) and the job to join."""
        if self.socket_path is None:
            return {protocol.SOCKET_ENV: ""}
        return {protocol.SOCKET_ENV: self.socket_path, "PUMP_JOB": self.job}

    def connect(self, cfg: config.JobConfig, name: str, verbose: int = 0, group: str = None):
        """Find or start the daemon the job's mode asks for, and register the job
        (handing pumpd the trace file, opened here with the user's permissions); with a
        group, join the job of this user's pump-runs of the same run if there is one."""
        mode = cfg.daemon_mode or "auto"
        if mode == "none":
            if cfg.trace_file:
                raise DaemonError("--trace needs a daemon (--daemon auto, system or embedded)")
            return
        system_path = cfg.daemon_socket or protocol.default_socket()
        if mode in ("auto", "system") and _answers(system_path, mode):
            self.socket_path = system_path
        elif mode == "system":
            raise DaemonError(f"no pumpd answers on {system_path} (start the service: "
                              "scripts/install-service; or use --daemon auto)")
        elif mode == "embedded":
            self._start_embedded(verbose)
        else:
            self.socket_path = userd.shared_socket(verbose)
        request = {"op": "register", "name": name, "policy": cfg.policy or "launch", **config.budget_terms(cfg)}
        if cfg.capacity is not None:
            request["capacity"] = cfg.capacity
        if group is not None:
            request["group"] = group
        trace_fd = ()
        if cfg.trace_file:
            try:
                trace_fd = (outfile.open_in_place(cfg.trace_file),)
            except OSError as exc:
                why = "a symbolic link, not followed" if exc.errno == errno.ELOOP else exc.strerror
                raise DaemonError(f"--trace {cfg.trace_file}: {why}") from None
            request["trace"] = True
            self.trace_file = cfg.trace_file
        try:
            try:
                self._register(request, trace_fd)
            except (ConnectionError, FileNotFoundError):
                if self.embedded is not None or self.socket_path == system_path:
                    raise
                # The shared pumpd stopped (its grace period ended) as we came: start another.
                self.socket_path = userd.shared_socket(verbose)
                self._register(request, trace_fd)
        finally:
            for fd in trace_fd:
                os.close(fd)

    def _register(self, request, fds):
        with protocol.Client(self.socket_path) as client:
            reply = client.request(request, fds=fds)
        self.job = reply["job"]
        if reply.get("saved") is False:
            print(f"pump-run: warning: pumpd could not save this job to its state directory "
                  f"({protocol.printable(str(reply.get('unsaved_reason')))}): the job runs, and pumpd writes it once "
                  "it can; a pumpd restart before then would forget it", file=sys.stderr)

    def end(self) -> dict:
        """Tell pumpd the command has exited: it reads what is left and closes the trace.
        Returns its reply: "trace" ({"records_written", "records_dropped", "problem"}, where
        there is a trace), "iteration_launches" (lookahead: per process that learned an
        iteration, its launches) and "link_bytes_per_s" (per process whose prefetches were
        timed, the median rate); {} when pumpd could not say (gone, or no daemon)."""
        if self.job is None:
            return {}
        try:
            with protocol.Client(self.socket_path, timeout=30.0) as client:
                return client.request({"op": "end", "job": self.job})
        except (OSError, protocol.ProtocolError):
            return {}  # a daemon gone meanwhile: nothing more to tell it

    def _start_embedded(self, verbose: int):
        self.directory = tempfile.mkdtemp(prefix="pumpd-")  # 0700
        self.socket_path = os.path.join(self.directory, "pumpd.sock")
        notify_path = os.path.join(self.directory, "notify")
        notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        notify.bind(notify_path)
        notify.settimeout(0.2)
        env = dict(os.environ, NOTIFY_SOCKET=notify_path)
        env.pop("LD_PRELOAD", None)  # pumpd itself never runs under the shim
        argv = [sys.executable, "-m", "pumpd", "--socket", self.socket_path, "--foreground",
                "--exit-with", str(os.getpid())] + ["-v"] * verbose
        try:
            # cwd "/": as daemons do, and so no `pump` directory where the job
            # runs shadows the installed package.
            self.embedded = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, cwd="/",
                                             start_new_session=True)  # the terminal's ^C is the job's
            deadline = time.monotonic() + READY_TIMEOUT
            while time.monotonic() < deadline:
                if self.embedded.poll() is not None:
                    raise OSError(f"it exited with status {self.embedded.returncode}")
                try:
                    message = notify.recv(4096).decode(errors="replace")
                except socket.timeout:
                    continue
                if "READY=1" in message.split("\n"):
                    return
            raise OSError(f"not ready within {READY_TIMEOUT:g} s")
        except OSError as exc:
            self.close()
            raise DaemonError(f"the embedded pumpd did not start ({exc})") from None
        finally:
            notify.close()
            os.unlink(notify_path)  # so a pumpd outliving a killed pump-run leaves nothing behind

    def close(self):
        """Stop the embedded pumpd (if any) and remove its directory."""
        if self.embedded is not None:
            if self.embedded.poll() is None:
                self.embedded.send_signal(signal.SIGTERM)
                try:
                    self.embedded.wait(5)
                except subprocess.TimeoutExpired:
                    self.embedded.kill()
                    self.embedded.wait()
            self.embedded = None
        if self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)
            self.directory = None
