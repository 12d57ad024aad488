"""pump-run: run a command under pump.

    pump-run [options] [--] COMMAND [ARGS...]

COMMAND runs as a child with libpump.so in LD_PRELOAD (so every process of its
tree loads the shim) and PUMP_* variables for the shim.  Each process that uses
CUDA writes its counters to a record in a private directory; at exit pump-run
sums them and prints one summary line on stderr.  A command that never uses CUDA
writes no record, and then pump-run adds nothing to its output.

Under managed_all (the default; --no-managed-all, [memory] managed_all) the shim turns the
program's device allocations into managed memory, and pump-run merges
expandable_segments:False into PyTorch's allocator settings (pump/torch_env.py: expandable
segments cannot be managed; a user's own choice wins).

Exit code: the command's, 128+N when it was killed by signal N, 127/126 when it
cannot be started, 2 for pump-run's own errors (one line on stderr). A job killed by a signal
is said on stderr as a shell says it (the signal, and "core dumped" where so; not for SIGINT
or SIGPIPE), since pump-run's own exit hides it from the shell; a non-zero exit status ends
the summary line.

PUMP=off in the environment runs COMMAND as if the prefix were not there (for launch
scripts with pump-run built in): exec'd in pump-run's place, no shim, no managed memory,
no daemon, no summary; one line on stderr says so (none with --quiet).

Signals.  SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGWINCH and SIGCONT
are forwarded to the child, except those the kernel itself sent (si_code ==
SI_KERNEL): the terminal's Ctrl-C, Ctrl-\\, window resize and hangup go to the
whole foreground process group, the child included, so forwarding them would
deliver them twice (a program that counts Ctrl-Cs, like "press Ctrl-C again to
quit", would see two).  Signals sent with kill() to pump-run (SI_USER), e.g. by a
batch scheduler or ``kill -INT <pid>``, are forwarded.  This is sudo's rule.
Limitation: a kill() aimed at the whole process group (``kill -- -PGID``, GNU
timeout) reaches the child twice, once directly and once forwarded.  To read
si_code, pump-run blocks these signals and takes them with sigtimedwait() while
the child runs; the child starts with the signal mask pump-run was given.  A
signal that was ignored when pump-run started stays ignored (nohup works).
"""

import argparse
import dataclasses
import json
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile

import pump
from pump.cli_common import OneLineParser, die
from pump import config, launchers, outfile, protocol, reaper, shim, stats, torch_env, trace
from pump.daemon_link import DaemonError, DaemonLink
from pump.protocol import ProtocolError, printable

PROG = "pump-run"

FORWARDED_SIGNALS = (
    signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT,
    signal.SIGUSR1, signal.SIGUSR2, signal.SIGWINCH, signal.SIGCONT,
)
SI_KERNEL = 0x80  # Linux si_code of a signal the kernel sent (e.g. from a tty)

def _die(message: str, code: int = 2):
    die(PROG, message, code)


def _group(text: str) -> str:
    if not protocol.GROUP_RE.fullmatch(text):
        raise argparse.ArgumentTypeError(f"bad value {text!r}; allowed: {protocol.GROUP_ALLOWED}")
    return text


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(
        prog=PROG,
        usage=f"{PROG} [options] [--] COMMAND [ARGS...]",
        description="Run COMMAND with the pump Unified Memory prefetcher (libpump.so). "
                    "PUMP=off in the environment runs COMMAND without pump.",
        allow_abbrev=False,
    )
    p.add_argument("--config", metavar="FILE", help="the job's TOML config file (see examples/job.toml)")
    p.add_argument("--name", metavar="NAME", help="the job's name (also picks /etc/pump/jobs.d/NAME.toml)")
    p.add_argument("--policy", choices=config.POLICIES,
                   help="off: no prefetching, counts only (managed_all stays on: PUMP=off drops pump whole); "
                        "launch: prefetch what each launch names (default); "
                        "lookahead: also what pumpd learns comes next")
    p.add_argument("--capacity", metavar="SIZE", type=config.check_capacity,
                   help="cap on the job's managed footprint (PUMP_CAPACITY): "
                        + config.CAPACITY_ALLOWED.replace("%", "%%"))
    p.add_argument("--budget", metavar="SIZE", type=config.check_budget,
                   help="cap on the job's GPU-resident managed bytes (PUMP_BUDGET): "
                        + config.BUDGET_ALLOWED.replace("%", "%%"))
    p.add_argument("--managed-all", action=argparse.BooleanOptionalAction,
                   help="turn the program's device allocations into managed memory, within the "
                        "job's capacity (default: on; --no-managed-all: leave them device memory, "
                        "as sharing CUDA tensors between processes needs)")
    p.add_argument("--daemon", dest="daemon_mode", choices=config.DAEMON_MODES,
                   help="auto: the system pumpd if it answers, else this user's shared pumpd, "
                        "started if none runs (default); system; embedded: one for this job alone; none")
    group = p.add_mutually_exclusive_group()
    group.add_argument("--group", type=_group, metavar="GROUP",
                       help="one job with the other pump-runs of this user that name GROUP (default: "
                            "the Slurm job step or torchrun run pump-run runs in, if any)")
    group.add_argument("--no-group", action="store_true", help="a job of its own, even under Slurm or torchrun")
    p.add_argument("--trace", metavar="FILE", help="record the job's allocations and launches to FILE "
                                                   "(pump_channel.h's trace layout; needs a daemon)")
    p.add_argument("--socket", metavar="PATH", help="the system pumpd's socket (default: $PUMP_SOCKET "
                                                    "or " + "/run/pump/pumpd.sock)")
    p.add_argument("--stats", metavar="FILE",
                   help="write the job's counters and per-process records as JSON at exit")
    p.add_argument("--quiet", action="store_true", help="no summary line on stderr")
    p.add_argument("-v", dest="verbose", action="count", default=0,
                   help="shim logging (PUMP_LOG=1; -vv: PUMP_LOG=2)")
    p.add_argument("--serve-env", action="store_true",
                   help="no command: register the job, write the variables pump-run gives a command "
                        "(NAME=VALUE, each ending in a NUL byte, then a NUL byte) and hold the job "
                        "until stdin closes (for Slurm's SPANK plugin: deploy/slurm/)")
    p.add_argument("--shim-path", action="store_true",
                   help="print the path of libpump.so and exit")
    p.add_argument("--version", action="version", version=f"{PROG} {pump.__version__}")
    p.add_argument("command", nargs=argparse.REMAINDER, metavar="COMMAND [ARGS...]",
                   help=argparse.SUPPRESS)
    return p


def preload_value(shim_file: str, existing: str) -> str:
    """LD_PRELOAD with shim_file first, then the existing entries (not repeated)."""
    entries = [e for e in re.split(r"[ :]", existing or "") if e]

    def is_shim(entry):
        if entry == shim_file:
            return True
        try:
            return "/" in entry and os.path.samefile(entry, shim_file)
        except OSError:
            return False

    rest = [e for e in entries if not is_shim(e)]
    if not rest:
        return shim_file
    if len(rest) == len(entries):
        return f"{shim_file}:{existing}"  # keep the user's value as written
    return ":".join([shim_file] + rest)


# Passed even when defaulted: pump-run's default (on) is not a bare LD_PRELOAD's (the shim's).
ALWAYS_PASSED = ("managed_all",)


def job_environment(cfg, shim_file: str, env, verbose: int = 0):
    """(the environment pump-run gives a job's command, the notices to print): env with
    libpump.so preloaded and the shim's and PyTorch's variables for the job's settings cfg.
    What belongs to one pump-run alone (its stats directory, its pumpd and job, its
    watchdog) is not in it: child_env and main add those."""
    env = dict(env)
    env["LD_PRELOAD"] = preload_value(shim_file, env.get("LD_PRELOAD", ""))
    notices = []
    # Only what the user chose: the shim has the same defaults, documented with it.
    chosen = dataclasses.replace(cfg, **{f: None for f, src in cfg.source.items()
                                         if src == "default" and f not in ALWAYS_PASSED})
    env.update(config.job_env(chosen))
    if cfg.managed_all:
        allocator_env, notice = torch_env.managed_all_allocator_env(env)
        env.update(allocator_env)
        notices += [notice] if notice else []
    if cfg.policy == "lookahead" and cfg.managed_all and cfg.source.get("torch_allocator") == "default":
        # Lookahead plans by addresses: a PyTorch step's repeat under pump's allocator, which places
        # each tensor where it went the step before (shim/policy/placement.c), not under the caching one.
        env["PUMP_TORCH_ALLOCATOR"] = "pump"
    if cfg.managed_all or cfg.torch_allocator == "pump":
        env.update(torch_env.boot_env(env))
    if cfg.policy == "lookahead":  # the shim's launch rule, with pumpd's plans (PUMP_POLICY=lookahead)
        env["PUMP_KERNEL_TIMES"] = "1"  # which pumpd plans on (the GPU times a few launches of each key)
    if verbose:
        env["PUMP_LOG"] = str(min(verbose, 2))
    return env, notices


def child_env(args, cfg, shim_file: str, stats_dir: str, link: DaemonLink) -> dict:
    env, notices = job_environment(cfg, shim_file, os.environ, args.verbose)
    for notice in notices:
        print(f"{PROG}: notice: {notice}", file=sys.stderr)
    env["PUMP_STATS_DIR"] = stats_dir
    env.update(link.env())
    return env


class _HeldSignals:
    """Block the forwarded signals (those not ignored) and SIGCHLD while the child runs
    and pump-run reports, so each can be taken with its siginfo; on exit, drop any
    still pending (the child is gone) and restore the mask."""

    def __enter__(self):
        self.watched = {s for s in FORWARDED_SIGNALS if signal.getsignal(s) != signal.SIG_IGN}
        self.watched.add(signal.SIGCHLD)
        if signal.getsignal(signal.SIGCHLD) == signal.SIG_IGN:
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # else the exit status is lost
        self.old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, self.watched)
        return self

    def __exit__(self, *exc):
        while signal.sigtimedwait(self.watched, 0) is not None:
            pass
        signal.pthread_sigmask(signal.SIG_SETMASK, self.old_mask)


def _start_child(old_mask, parent: int):
    signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
    reaper.die_with_parent(parent)  # a SIGKILLed pump-run takes its job along (pump/reaper.py)


def ending_of(status: int):
    """How the job ended, from its wait status, for pump-run's output: None for exit status 0."""
    if os.WIFSIGNALED(status):
        signo = os.WTERMSIG(status)
        try:
            name = signal.Signals(signo).name
        except ValueError:
            name = f"signal {signo}"
        said = signal.strsignal(signo) or name
        core = ", core dumped" if os.WCOREDUMP(status) else ""
        return f"the job was killed by {name} ({said}){core}"
    code = os.waitstatus_to_exitcode(status)
    return None if code == 0 else f"the job exited with status {code}"


# Signals a shell does not report when they end a job (bash: SIGINT, SIGPIPE)
QUIET_SIGNALS = frozenset({signal.SIGINT, signal.SIGPIPE})


def run_child(command, env, held: _HeldSignals):
    """Run command, forwarding signals (see the module docstring); return (its exit code, how it
    ended: ending_of's text, or None; False if it could not be started)."""
    parent = os.getpid()
    try:
        proc = subprocess.Popen(
            command, env=env, close_fds=False,  # pass on fds as a bare exec would
            # the child starts with pump-run's original mask (pump-run has no threads,
            # so preexec_fn is safe here)
            preexec_fn=lambda: _start_child(held.old_mask, parent),
        )
    except OSError as exc:
        name = command[0]
        if isinstance(exc, FileNotFoundError):
            why = "No such file or directory" if "/" in name else "command not found"
            print(f"{PROG}: {name}: {why}", file=sys.stderr)
            return 127, False
        print(f"{PROG}: {name}: {exc.strerror or exc}", file=sys.stderr)
        return 126, False
    while True:
        info = signal.sigtimedwait(held.watched, 1.0)
        if info is None or info.si_signo == signal.SIGCHLD:
            pid, status = os.waitpid(proc.pid, os.WNOHANG)  # the raw status says "core dumped"
            if pid == proc.pid:
                break
        elif info.si_code != SI_KERNEL and info.si_pid != proc.pid:
            proc.send_signal(info.si_signo)
    rc = proc.returncode = os.waitstatus_to_exitcode(status)
    ending = ending_of(status)
    if rc < 0 and -rc not in QUIET_SIGNALS:
        print(f"{PROG}: {ending}", file=sys.stderr)
    return (128 - rc if rc < 0 else rc), ending


def lookahead_line(iterations, links=None) -> str:
    """What lookahead learned, from pumpd's answer to end (None: pumpd could not say), and the
    link rates it planned at, where the processes' prefetches were timed (bytes/s)."""
    if iterations is None:
        return "lookahead: pumpd did not say whether it learned an iteration"
    learned = sorted({int(n) for n in iterations if isinstance(n, int) and n > 0})
    if not learned:
        return ("lookahead learned no iteration: the job's launches did not repeat while it ran (a PyTorch "
                "job's repeat under pump's allocator once its optimizer marks steps, under PyTorch's caching "
                "allocator only with PUMP_TORCH_NAMES=1: docs/limits.md), so the launch rule applied throughout")
    counts = " and ".join(str(n) for n in learned)
    rates = sorted({round(n / 1e9, 1) for n in links or () if isinstance(n, (int, float)) and n > 0})
    measured = f", planned at the link rate its prefetches met: {' and '.join(map(str, rates))} GB/s" if rates else ""
    return f"lookahead learned an iteration of {counts} launches{measured}"


def report(stats_dir, args, command, rc, stats_file, ending=None) -> bool:
    """Print the summary line, how the job ended where it did not exit 0 (`ending`; False: it
    never started), and write --stats; (False if --stats could not be written, the totals)."""
    bad = []
    records = stats.read_dir(stats_dir, errors=bad)
    for msg in bad:
        print(f"{PROG}: warning: skipped a stats record: {msg}", file=sys.stderr)
    totals = stats.aggregate(records)
    if records and not args.quiet:
        print(stats.summary_line(totals) + (f"; {ending}" if ending else ""), file=sys.stderr)
    elif not records and ending is not False and not args.quiet:
        print(f"{PROG}: pump was idle: no process of the job called the CUDA driver (a job on the CPU, "
              "or CUDA never initialised)", file=sys.stderr)
    if stats_file is None:
        return True, totals
    doc = {
        "pump_run": pump.__version__,
        "command": command,
        "exit_code": rc,
        "totals": totals,
        "processes": records,
        "bad_records": bad,
    }
    try:
        with stats_file:
            stats_file.write((json.dumps(doc, indent=2) + "\n").encode())
    except OSError as exc:
        print(f"{PROG}: --stats {args.stats}: {exc.strerror or exc}", file=sys.stderr)
        return False, totals
    return True, totals


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        shim_file = str(shim.shim_path())
    except shim.ShimNotFoundError as exc:
        _die(str(exc))
    if args.shim_path:
        print(shim_file)
        return 0
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if args.serve_env and command:
        _die("--serve-env takes no command (the processes given its variables are started by another launcher)")
    if not command and not args.serve_env:
        _die(f"no command given (usage: {PROG} [options] [--] COMMAND [ARGS...])")
    if not pump_wanted():
        return run_without_pump(command, args)
    if re.search(r"[ :]", shim_file):
        _die(f"libpump.so path {shim_file!r} has a space or colon, which LD_PRELOAD cannot hold")
    try:
        stats.get_ffi()  # a broken install fails now, not after the job
    except Exception as exc:
        _die(f"cannot load the stats record layout: {exc}")
    stats_file = None
    if args.stats:
        try:
            stats_file = outfile.open_output(args.stats)  # no link followed; written whole at exit
        except OSError as exc:
            _die(f"--stats {args.stats}: {exc.strerror or exc}")

    flags = {"policy": args.policy, "capacity": args.capacity, "budget": args.budget,
             "daemon_mode": args.daemon_mode, "daemon_socket": args.socket, "trace_file": args.trace,
             "managed_all": args.managed_all}
    try:
        cfg = config.resolve_job(flags, args.config, args.name)
    except config.ConfigError as exc:
        for line in exc.errors:
            print(f"{PROG}: {line}", file=sys.stderr)
        sys.exit(2)
    group = None if args.no_group else args.group or launchers.run_group()
    name = cfg.name or group or (os.path.basename(command[0])[:64] if command else "") or "job"
    link = DaemonLink()
    try:
        link.connect(cfg, name, args.verbose, group)
    except DaemonError as exc:
        _die(str(exc))
    except (OSError, ProtocolError) as exc:
        if cfg.daemon_mode == "system":
            _die(f"pumpd: {exc}")
        print(f"{PROG}: warning: no daemon for this job ({exc}); the shim prefetches on its own",
              file=sys.stderr)
        link.close()
        link = DaemonLink()

    if args.serve_env:
        return serve_env(args, cfg, shim_file, link, stats_file)
    watchdog = reaper.Watchdog()  # before the signals are held: it starts with none blocked
    with _HeldSignals() as held:
        stats_dir = tempfile.mkdtemp(prefix="pump-run-")  # mode 0700
        try:
            env = child_env(args, cfg, shim_file, stats_dir, link)
            rc, ending = run_child(command, dict(env, **watchdog.env()), held)
            watchdog.disarm()
            ok = finish(args, cfg, link, stats_dir, command, rc, stats_file, ending)
        finally:
            shutil.rmtree(stats_dir, ignore_errors=True)
            link.close()
    return rc if ok or rc != 0 else 2  # an unwritten --stats fails a job that succeeded


def capacity_line(totals: dict, capacity) -> str:
    """The job was refused memory at its capacity: by how much it was set, and the way past it."""
    n = totals["capacity_refusals"]
    cap = stats.human_bytes(totals.get("capacity_bytes", 0))
    why = f"--capacity {capacity}" if capacity else "by default the GPU's free memory at its first allocation"
    return (f"{n} allocation{'s' if n != 1 else ''} refused at the job's capacity ({cap}: {why}); "
            "--capacity host lets it go beyond GPU memory into host memory, where what does not fit on "
            "the GPU crosses the link each time it is used: slower, never wrong")


def pump_wanted() -> bool:
    """False where the environment says PUMP=off: a launch script with pump-run built in is then
    run as if the prefix were not there."""
    value = os.environ.get("PUMP", "")
    if value not in ("", "on", "off"):
        _die(f"PUMP={value[:40]!r}: allowed: off (run the command without pump), on, or unset")
    return value != "off"


def run_without_pump(command, args) -> int:
    """PUMP=off: the command in pump-run's place (exec), without the shim, managed memory, a
    daemon or a summary; --serve-env gives no variables. One line says so."""
    if not args.quiet:
        print(f"{PROG}: PUMP=off: running without pump (no shim, no managed memory, no daemon)", file=sys.stderr)
    if args.serve_env:
        sys.stdout.write("\0")
        sys.stdout.flush()
        while sys.stdin.buffer.read1(65536):
            pass
        return 0
    sys.stderr.flush()
    try:
        os.execvp(command[0], command)
    except OSError as exc:
        why = exc.strerror or str(exc)
        if isinstance(exc, FileNotFoundError) and "/" not in command[0]:
            why = "command not found"
        print(f"{PROG}: {command[0]}: {why}", file=sys.stderr)
        return 127 if isinstance(exc, FileNotFoundError) else 126


def finish(args, cfg, link, stats_dir, command, rc, stats_file, ending=None) -> bool:
    """The job is over: tell pumpd, print the summary (and what lookahead learned and the
    trace holds), write --stats; False if --stats could not be written."""
    ended = link.end()
    ok, totals = report(stats_dir, args, command, rc, stats_file, ending)
    if totals.get("capacity_refusals") and cfg.capacity != "host" and not args.quiet:
        print(f"{PROG}: {capacity_line(totals, cfg.capacity)}", file=sys.stderr)
    if cfg.policy == "lookahead" and link.job is not None and not args.quiet:
        print(f"{PROG}: {lookahead_line(ended.get('iteration_launches'), ended.get('link_bytes_per_s'))}", file=sys.stderr)
        for fallback in ended.get("lookahead_fallbacks") or ():
            print(f"{PROG}: lookahead gave way to the launch rule in {printable(str(fallback))}", file=sys.stderr)
    if link.trace_file:
        line = trace.report(link.trace_file, totals["events_written"], ended.get("trace"))
        print(f"{PROG}: {line}", file=sys.stderr)
    return ok


class _Released(Exception):
    """A signal asked a --serve-env pump-run to end its job."""


def _release(signo, frame):
    raise _Released()


def _hold_until_stdin_ends():
    """Read stdin to its end; a signal raises _Released at once. The kernel may deliver it to
    another thread (numpy's BLAS threads): the read would then go on until stdin ended (a CI run
    waited 30 s), so the signal's wakeup byte is waited for beside stdin."""
    wake_read, wake_write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    before = signal.set_wakeup_fd(wake_write)
    try:
        while True:
            ready, _, _ = select.select([sys.stdin.buffer, wake_read], [], [])
            if wake_read in ready:
                os.read(wake_read, 512)  # the handler raises in this thread, at the next instruction
            if sys.stdin.buffer in ready and not sys.stdin.buffer.read1(65536):
                return
    finally:
        signal.set_wakeup_fd(before)
        os.close(wake_read)
        os.close(wake_write)


def serve_env(args, cfg, shim_file, link, stats_file) -> int:
    """--serve-env: the job for processes another launcher starts (Slurm's SPANK plugin,
    deploy/slurm/): write the variables pump-run would give a command (those it sets or
    changes: NAME=VALUE, each ending in a NUL byte, then one more NUL byte), hold the job
    until stdin reaches its end or a signal comes (the processes have ended), then end it
    as after a command, the summary counting every process that used the variables."""
    stats_dir = tempfile.mkdtemp(prefix="pump-run-")  # mode 0700
    for signo in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signo, _release)
    try:
        env = child_env(args, cfg, shim_file, stats_dir, link)
        given = "".join(f"{name}={value}\0" for name, value in env.items() if os.environ.get(name) != value)
        try:
            sys.stdout.write(given + "\0")
            sys.stdout.flush()
            _hold_until_stdin_ends()
        except _Released:
            pass
        ok = finish(args, cfg, link, stats_dir, ["--serve-env"], 0, stats_file)
    finally:
        shutil.rmtree(stats_dir, ignore_errors=True)
        link.close()
    return 0 if ok else 2

if __name__ == "__main__":
    sys.exit(main())
