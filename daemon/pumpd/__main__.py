"""pumpd [--socket PATH] [--config FILE] [--foreground]: pump's control-plane daemon.

pumpd never forks itself into the background (systemd runs it as a foreground
process, Type=notify; `--foreground` is accepted for clarity).  Its socket:
--socket, else the config file's [daemon] socket, else $PUMP_SOCKET, else
$RUNTIME_DIRECTORY/pumpd.sock under systemd, /run/pump/pumpd.sock for root, and
pumpd.sock in the user's checked runtime directory (pump/runtime_dir.py) for anyone
else; a socket systemd passes (pumpd.socket) overrides them all.  Job state lives
in a 0700 "jobs" directory in $RUNTIME_DIRECTORY under systemd, else beside the
socket.  --shared: the user's shared pumpd (pump/userd.py), elected by a lock
beside its socket.  Under systemd pumpd refuses to run as root.

The system pumpd also serves the administrator's socket (pump/admin.py): the one systemd
passes named "admin" (pumpd-admin.socket), else --admin-socket, else, for a pumpd root
starts by hand on the system socket, /run/pump-admin/pumpd.sock.
"""

import argparse
import asyncio
import logging
import os
import signal
import sys

from pump import admin, config, protocol, runtime_dir, userd
from pumpd import limits, systemd
from pumpd.jobs import StateDirError
from pumpd.server import Daemon

log = logging.getLogger("pumpd")


def default_socket() -> str:
    if os.environ.get(protocol.SOCKET_ENV):
        return os.environ[protocol.SOCKET_ENV]
    if os.environ.get("RUNTIME_DIRECTORY"):
        return os.path.join(os.environ["RUNTIME_DIRECTORY"].split(":")[0], "pumpd.sock")
    if os.geteuid() == 0:
        return protocol.SYSTEM_SOCKET
    return runtime_dir.user_socket()


def is_system_socket(path: str) -> bool:
    """The system service's socket is open to every local user (SO_PEERCRED decides)."""
    return bool(os.environ.get("RUNTIME_DIRECTORY")) or path == protocol.SYSTEM_SOCKET


def state_dir(socket_path: str) -> str:
    """Where the jobs/ directory goes: the service's own runtime directory (pumpd.socket's
    /run/pump belongs to root), else beside the socket."""
    runtime = os.environ.get("RUNTIME_DIRECTORY")
    return runtime.split(":")[0] if runtime else os.path.dirname(socket_path)


def refuses_root() -> str | None:
    """Why pumpd will not start, when it is a systemd service running as root: the
    service serves every local user, and a mistake in its code must not be root's."""
    if os.environ.get("INVOCATION_ID") and os.geteuid() == 0:
        return ("refusing to run as root under systemd: set User= in the unit "
                "(scripts/pumpd.service runs as the user pump, on a socket systemd opens)")
    return None


def _admin_socket(args, socket_path: str):
    """The administrator's socket pumpd binds itself: --admin-socket, else the default
    where root runs the system pumpd by hand; None for a user's own pumpd."""
    if args.admin_socket:
        return args.admin_socket
    if os.geteuid() == 0 and socket_path == protocol.SYSTEM_SOCKET and args.exit_with is None and not args.shared:
        return admin.ADMIN_SOCKET
    return None


def build_parser():
    p = argparse.ArgumentParser(prog="pumpd", description="pump's control-plane daemon.")
    p.add_argument("--socket", metavar="PATH", help="the Unix socket to listen on")
    p.add_argument("--config", metavar="FILE", help="pumpd.toml (default: /etc/pump/pumpd.toml if present)")
    p.add_argument("--foreground", action="store_true", help="stay in the foreground (always so)")
    p.add_argument("--admin-socket", metavar="PATH",
                   help="the administrator's socket, 0600 root's (default for root on the system socket: "
                        f"{admin.ADMIN_SOCKET})")
    p.add_argument("-v", dest="verbose", action="count", default=0, help="more logging")
    # pump-run's embedded daemon: stop when that process is gone.
    p.add_argument("--exit-with", metavar="PID", type=int, help=argparse.SUPPRESS)
    # pump-run's shared pumpd (pump/userd.py): hold the election lock; stop after
    # --idle-exit seconds without a job.
    p.add_argument("--shared", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--idle-exit", metavar="SECONDS", type=float, help=argparse.SUPPRESS)
    return p


def _setup_logging(level: str, verbose: int):
    handler = logging.StreamHandler(sys.stderr)
    if systemd.stderr_is_journal():
        handler.setFormatter(systemd.JournalFormatter("%(message)s"))
    else:
        handler.setFormatter(logging.Formatter("pumpd: %(message)s"))
    log.addHandler(handler)
    log.addFilter(_escape_controls)
    levels = {"error": logging.ERROR, "warning": logging.WARNING, "info": logging.INFO, "debug": logging.DEBUG}
    log.setLevel(logging.DEBUG if verbose > 1 else logging.INFO if verbose else levels[level])
    log.propagate = False


def _escape_controls(record) -> bool:
    """Log lines quote names and text from clients: control characters are shown escaped
    (a job named "\x1b[2J" must not clear root's terminal or forge journal lines)."""
    message = record.getMessage()
    if not message.isprintable():
        record.msg, record.args = protocol.printable(message), ()
    return True


def _budget_bytes(text):
    """The daemon's default budget in bytes; a percentage is the shim's to resolve."""
    if text is None:
        return None
    try:
        return config.parse_size(text)
    except ValueError:
        log.warning("[budgets] default_budget %s: a percentage applies only through a job's "
                    "own PUMP_BUDGET; pumpd sets no default", text)
        return None


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    refusal = refuses_root()
    if refusal:
        print(f"pumpd: {refusal}", file=sys.stderr)
        return 2
    path = args.config or ("/etc/pump/pumpd.toml" if os.path.exists("/etc/pump/pumpd.toml") else None)
    try:
        cfg = config.load_daemon_file(path) if path else config.DaemonConfig()
        limits.configure(cfg.limits(), path or "pumpd.toml")
    except config.ConfigError as exc:
        print(exc, file=sys.stderr)
        return 2
    except ValueError as exc:  # a [limits] value past what it may be
        print(exc, file=sys.stderr)
        return 2
    # An embedded pumpd shares the job's terminal, a shared one writes a file that lives
    # as long as the runtime directory: warnings only, unless -v.
    _setup_logging("warning" if args.exit_with is not None or args.shared else cfg.log_level, args.verbose)
    try:
        named = systemd.named_listen_fds()
    except ValueError as exc:
        log.error("%s", exc)
        return 2
    listen = [s for name, s in named if name != admin.ADMIN_FD_NAME]
    admin_listen = [s for name, s in named if name == admin.ADMIN_FD_NAME]
    try:
        socket_path = (listen[0].getsockname() if listen else None) or args.socket or cfg.socket or default_socket()
    except runtime_dir.RuntimeDirError as exc:
        log.error("%s", exc)
        return 2
    election = None  # the lock, held open until pumpd exits
    if args.shared:
        election = userd.hold_lock(socket_path)
        if election is None:
            log.info("another pumpd of this user serves %s: leaving it to that one", socket_path)
            return 0
    telemetry = None
    if args.exit_with is None:  # an embedded pumpd serves one job: no GPU telemetry
        from pumpd.telemetry import Telemetry
        telemetry = Telemetry(nvml=cfg.nvml)
        telemetry.interval = cfg.interval_s
    try:
        daemon = Daemon(socket_path, os.path.join(state_dir(socket_path), "jobs"),
                        exit_with=args.exit_with,
                        socket_mode=0o666 if is_system_socket(socket_path) else 0o600,
                        telemetry=telemetry, metrics_listen=cfg.metrics_listen,
                        metrics_options={"per_job": cfg.metrics_per_job, "max_jobs": cfg.metrics_max_jobs},
                        default_budget=_budget_bytes(cfg.default_budget), jobs_dir=cfg.jobs_dir,
                        gpu_pool=cfg.gpu_pool, idle_exit=args.idle_exit,
                        admin_socket=None if admin_listen else _admin_socket(args, socket_path))
    except StateDirError as exc:
        log.error("%s", exc)
        return 1

    async def run():
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, daemon.stop)
        loop.add_signal_handler(signal.SIGHUP, lambda: None)
        await daemon.run(listen[0] if listen else None,
                         ready=lambda: systemd.notify(f"READY=1\nSTATUS=listening on {socket_path}"),
                         admin_sock=admin_listen[0] if admin_listen else None)

    try:
        asyncio.run(run())
    except (RuntimeError, OSError) as exc:
        log.error("%s", exc)
        return 1
    finally:
        systemd.notify("STOPPING=1")
        if telemetry is not None:
            telemetry.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
