"""The lookahead planner in a process of its own, so that its work cannot hold pumpd's
event loop.

Learning an iteration and planning it is pure Python and takes up to seconds for a long
one. On a thread of pumpd's own process it held the GIL, and the loop, which gives the
GIL up at every system call (epoll, accept, recv, send, /proc reads), then waited up to
a switch interval to get it back at each one: CPython's convoy effect. On a 2-core
machine with other work, one hostile user's rings made the planner hold the GIL for
most of a second at a time (0.73 s of the planner's CPU against 0.04 s of the loop's in
a 1.15 s stall), and other users' requests and the watchdog waited that long.

Here the planner runs in a child process (a fresh interpreter, holding one socket of
pumpd's) that keeps one Lookahead per session; pumpd's planner thread sends it a
session's batch and waits, GIL released, for what it planned. The child starts with the
first batch to plan and ends with the last lookahead session (its socket's EOF), so that
pumpd holds it only while it plans for someone; it also ends when pumpd does. A child that died is
started again at the next batch (the sessions' plans then learn anew).

A turn has a deadline in the child's CPU time (limits.PLAN_DEADLINE_SECONDS; a virtual-time
timer raises inside the planner's Python): a turn that meets it is given up, the session's
learning starts again from its next batch, and its published plan stays in force. A turn
stuck where the timer cannot reach (one long numpy call) is the backstop's: past twice the
deadline the child is killed, and the next turn starts another. The scheduler decides what
overruns cost (backoff, then the launch rule: pumpd/scheduler.py).
"""

import collections
import concurrent.futures
import dataclasses
import os
import resource
import signal
import socket
import subprocess
import sys
import time
import traceback
from multiprocessing.connection import Connection

from pump import channel
from pump.foresight import Foresight
from pumpd import lookahead
from pumpd import limits

BANDWIDTH_INTERVAL = 5.0  # seconds: a session's plan is made anew for a new link rate at most this often
BACKSTOP_POLL = 0.25      # seconds between looks at a turn's CPU time, past its deadline
PLANNER_NICE = 10         # the child's niceness, added to pumpd's
READY = "ready"           # what the child says once started

EXIT_SECONDS = 5.0  # a child told to end (EOF) that has not is killed after this long


@dataclasses.dataclass
class Planned:
    """What the child says of one session after a batch."""
    cost: float      # the child's CPU seconds on it
    budget: int      # the budget it planned for
    bandwidth: float # the link rate it planned at (bytes/s)
    period: int      # the iteration learned (launches; 0: not yet)
    order: int       # the victim order of its plan
    layout: tuple    # a new plan's layout (channel.Plan.layout), or None if unchanged
    overran: bool = False  # the turn met its deadline: nothing learned, the session learns anew
    trimmed: int = 0       # launches its history dropped to hold its block references, this turn


class PlannerError(RuntimeError):
    """The child failed on a batch (a planner bug) or died."""


class Handle:
    """pumpd's side of one session's Lookahead, which lives in the child."""

    def __init__(self, planner: "Planner", key: int, budget: int, bandwidth: float):
        self.planner, self.key, self.bandwidth = planner, key, bandwidth
        self.wanted_bandwidth = bandwidth            # the latest rate measured (planned at within BANDWIDTH_INTERVAL)
        self.bandwidth_set = None                    # when the rate planned at last changed (monotonic)
        self.overruns = 0                            # turns that met their deadline
        self.budget = budget or lookahead.NO_BUDGET  # the budget to plan for
        self.planned_budget = self.budget            # the budget the child last planned for
        self.planned_bandwidth = bandwidth           # ... and the link rate
        self.layout = channel.Plan.layout({})        # the newest layout from the child
        self.fresh = False                           # ... not yet published
        self.period = 0
        self.order = Foresight.order
        self.closed = False

    @property
    def pending(self) -> bool:
        """A budget noted that the child has not planned for yet."""
        return self.budget != self.planned_budget

    def set_budget(self, budget: int):
        """Noted; the child plans for it with the next batch."""
        self.budget = budget or lookahead.NO_BUDGET

    def set_bandwidth(self, bandwidth: float):
        """Noted; the child plans at this rate from the next turn on, or, if the rate changed
        within BANDWIDTH_INTERVAL, from the first turn past it: a rate that swings (a hostile
        ring's LINK records: issue 45) costs one plan made anew per interval, not one per batch."""
        self.wanted_bandwidth = bandwidth

    def _bandwidth_now(self) -> float:
        if self.wanted_bandwidth != self.bandwidth:
            now = time.monotonic()
            if self.bandwidth_set is None or now - self.bandwidth_set >= BANDWIDTH_INTERVAL:
                self.bandwidth, self.bandwidth_set = self.wanted_bandwidth, now
        return self.bandwidth

    def take_layout(self) -> tuple:
        self.fresh = False
        return self.layout

    def learned(self, planned: Planned):
        """What the child planned (on the loop, once the batch's future is done)."""
        self.planned_budget, self.period, self.order = planned.budget, planned.period, planned.order
        self.planned_bandwidth = planned.bandwidth
        if planned.layout is not None:
            self.layout, self.fresh = planned.layout, True

    def close(self):
        if not self.closed:
            self.closed = True
            self.planner.forget(self.key)


class Planner:
    """The child process and the one thread that talks to it; everything else is called
    from the event loop."""

    def __init__(self):
        self.thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="pumpd-planner")
        self.thread.submit(int)  # started now, not on the loop: a thread's start waits for it to run
        self.process = self.conn = None
        self.live = 0                    # open sessions' handles
        self.gone = collections.deque()  # sessions closed: the child drops them with the next batch
        self.known = set()               # sessions the running child has planned (it knows their allocations)
        self.stopped = False

    def session(self, key: int, budget: int, bandwidth: float) -> Handle:
        self.live += 1
        return Handle(self, key, budget, bandwidth)

    def submit(self, handle: Handle, batches, deadline: float = None,
               share: dict = None) -> concurrent.futures.Future:
        """The child learns the batches, in order (a Batch, a list of them, or None: only the
        handle's budget and rate), within ``deadline`` CPU seconds, its tables holding at most
        ``share`` (limits.planner_share; default: a lone process's); the future's result is a
        Planned."""
        if not isinstance(batches, list):
            batches = [] if batches is None else [batches]
        share = share or limits.planner_share(1, 1)
        deadline = limits.PLAN_DEADLINE_SECONDS if deadline is None else deadline
        return self.thread.submit(self._plan, handle.key, (handle.budget, handle._bandwidth_now(), share),
                                  batches, deadline)

    def knows(self, key: int) -> bool:
        """The running child has planned this session (a new one has not: a planner killed for
        its memory took every session's allocations with it)."""
        return key in self.known

    def forget(self, key: int):
        self.live -= 1
        self.gone.append(key)
        if self.live == 0 and not self.stopped:
            self.thread.submit(self._retire)

    def stop(self):
        """At pumpd's stop: the child ends now; a batch in flight fails on the thread,
        which ends before the loop closes (its future's result goes to the loop)."""
        self.stopped = True
        process = self.process
        if process is not None:
            process.kill()
        self.thread.shutdown(wait=True, cancel_futures=True)

    # ---- on the planner thread ----
    def _plan(self, key, terms, batches, deadline) -> Planned:
        if self.process is None:
            self._start()
        gone = []
        while self.gone:
            gone.append(self.gone.popleft())
        try:
            began = child_cpu_seconds(self.process.pid)
            self.conn.send((key, terms, batches, gone, deadline))
            wait = deadline
            while not self.conn.poll(wait):  # the turn's wall time reaches its CPU deadline first
                wait = BACKSTOP_POLL
                if child_cpu_seconds(self.process.pid) - began > 2 * deadline:
                    self.process.kill()
                    self._end()
                    return Planned(2 * deadline, terms[0], terms[1], 0, Foresight.order, None, True)
            planned = self.conn.recv()
        except (EOFError, OSError) as exc:
            self._end()
            raise PlannerError(f"the planner process ended ({exc.__class__.__name__}); a new one "
                               "starts with the next batch") from None
        if isinstance(planned, str):
            raise PlannerError(planned)
        self.known.add(key)
        return planned

    def _start(self):
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            # cwd "/": the installed package, never a source tree's (python -m puts cwd first).
            # One thread of BLAS and two malloc arenas: the planner is single-threaded, and each
            # thread's buffers and arenas reserve address space (limit_self), on a machine of many
            # cores enough to meet the limit at numpy's import.
            env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MALLOC_ARENA_MAX="2")
            self.process = subprocess.Popen([sys.executable, "-m", "pumpd.planner", str(theirs.fileno())],
                                            pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL, cwd="/", env=env)
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        self.conn = Connection(ours.detach())
        self.gone.clear()  # a new child knows no session
        try:  # its start (an interpreter's, the imports) is not a turn's CPU time: the deadline starts after
            ready = self.conn.recv()
        except (EOFError, OSError):
            ready = None
        if ready != READY:
            self._end()
            raise PlannerError("the planner process ended as it started; a new one starts with the next batch")

    def _retire(self):
        """No lookahead session is left: the child ends (pumpd holds nothing for it)."""
        if self.live == 0 and self.process is not None:
            self._end()

    def _end(self):
        self.known = set()  # a new child knows no session: its first turn of each brings what pumpd knows
        self.conn.close()
        try:
            self.process.wait(EXIT_SECONDS)  # it ends at its socket's EOF
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.process = self.conn = None


def child_cpu_seconds(pid: int) -> float:
    """A process's CPU time so far (user and system), from /proc/PID/stat; 0.0 if unreadable."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Overrun(Exception):
    """A turn met its deadline (raised by the virtual-time timer's signal)."""


def _overrun(_signum, _frame):
    raise Overrun


def limit_self():
    """The child runs below pumpd's loop (nice PLANNER_NICE: on a busy machine the loop that
    reads rings and answers requests goes first; its deadline is in CPU time, which niceness
    does not stretch), is the OOM killer's first choice (oom_score_adj 1000: never pumpd before
    it), and meets a MemoryError at limits.PLANNER_ADDRESS_SPACE_BYTES (a lower hard limit
    already set stands), which ends that one turn as an overrun."""
    os.nice(PLANNER_NICE)
    try:
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write("1000")
    except OSError:
        pass
    _soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    most = limits.PLANNER_ADDRESS_SPACE_BYTES
    resource.setrlimit(resource.RLIMIT_AS, (most if hard == resource.RLIM_INFINITY else min(most, hard), hard))


def serve(conn: Connection):
    """The child: one Lookahead per session key, fed batch after batch until EOF."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C is pumpd's to act on
    signal.signal(signal.SIGVTALRM, _overrun)
    planners = {}
    conn.send(READY)
    while True:
        try:
            key, (budget, bandwidth, share), batches, gone, deadline = conn.recv()
        except EOFError:
            return
        for old in gone:
            planners.pop(old, None)
        began = time.process_time()
        try:
            try:
                signal.setitimer(signal.ITIMER_VIRTUAL, deadline)
                planner = planners.get(key)
                if planner is None:
                    planner = planners[key] = lookahead.Lookahead(budget, bandwidth)
                planner.set_budget(budget)
                planner.set_bandwidth(bandwidth)
                planner.limit(share)
                planner.plan(*batches)
            finally:
                signal.setitimer(signal.ITIMER_VIRTUAL, 0)
            policy = planner.policy
            trimmed = policy.history_trimmed + policy.need_skipped
            policy.history_trimmed = policy.need_skipped = 0
            reply = Planned(time.process_time() - began, policy.budget, policy.bandwidth, policy.period,
                            policy.order, planner.take_layout() if planner.fresh else None, trimmed=trimmed)
        except (Overrun, MemoryError):  # what it learned is half done: the session learns anew from its next turn
            planners.pop(key, None)
            reply = Planned(time.process_time() - began, budget, bandwidth, 0, Foresight.order, None, True)
        except Exception:  # noqa: BLE001 - a planner bug ends no task: pumpd logs it
            planners.pop(key, None)
            reply = traceback.format_exc()
        try:
            conn.send(reply)
        except OSError:  # pumpd is gone
            return


if __name__ == "__main__":  # python -m pumpd.planner FD: what Planner starts
    from pumpd import planner as module  # the module by its name, so that Planned pickles as pumpd.planner's
    module.limit_self()
    module.serve(Connection(int(sys.argv[1])))
