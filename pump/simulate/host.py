"""pump's driver calls, costed as fakecuda costs them (issue 28 item 2), on the thread that makes
them: fakecuda/cost.c (fc_migrate_ioctl_ns, fc_discard_ioctl_ns) with the constants read
from fakecuda_model.h, never copied (tests/test_simulate_host_costs.py runs fakecuda and holds
the two equal). The calls a launch's hook makes before its kernel are the launching thread's;
those decided after the kernel (a plan's trigger, policy off's evictions) are made by pump's
worker thread (shim/engine/prefetch_worker.c), which runs beside the launching thread and delays no
launch. The shim's launching thread takes over a worker's job it must order its own calls
after, when the worker has not begun it: not modelled here (the worker is never late)."""

import collections
import dataclasses

from pump.simulate import constants as K


@dataclasses.dataclass(frozen=True)
class HostCosts:
    """What one of pump's driver calls costs its calling thread, in seconds."""
    ioctl: float                # FAKECUDA_IOCTL_NS: the fixed part of a UVM ioctl
    block_pass: float           # FAKECUDA_BLOCK_PASS_NS: per 2 MiB VA block per pass
    move: float                 # FAKECUDA_MIGRATE_BLOCK_NS: per 2 MiB of pages moved, pro rata

    @classmethod
    def of_fakecuda(cls):
        f = K.fakecuda_constants()
        return cls(f["FAKECUDA_IOCTL_NS"] * 1e-9, f["FAKECUDA_BLOCK_PASS_NS"] * 1e-9,
                   f["FAKECUDA_MIGRATE_BLOCK_NS"] * 1e-9)

    def moved(self, nbytes: int) -> float:
        """The CPU time of moving nbytes of pages, beside the passes."""
        return nbytes * self.move / K.BLOCK_BYTES

    def migrate(self, blocks: int) -> float:
        """UVM_MIGRATE of a range of `blocks` VA blocks: two passes when it spans several."""
        return self.ioctl + blocks * (2 if blocks > 1 else 1) * self.block_pass if blocks else 0.0

    def probed_rate(self, bandwidth: float) -> float:
        """The rate a prefetch of many blocks meets as the shim times it (shim/engine/link_rate.c:
        events around the call), which pumpd plans at: per block its two passes (`migrate`'s,
        for a range of several blocks; the ioctl's fixed part spread thin) and its pages' CPU
        time on the calling thread, then its copy at `bandwidth` (the stream's work begins when
        the call has made it)."""
        return K.BLOCK_BYTES / (2 * self.block_pass + self.move + K.BLOCK_BYTES / bandwidth)

    def discard(self, blocks: int) -> float:
        """UVM_DISCARD of a range of `blocks` VA blocks: a wait per block."""
        return self.ioctl + blocks * self.block_pass if blocks else 0.0


class LaunchThread:
    """The clocks of the launching thread and of pump's worker through one hook's calls.  A
    call for block b joins the hook's last range of its kind (the shim keeps its prefetches and
    its evictions apart) when b's address follows that range's last block (it costs the range's
    cost with b, less without), else starts one.  costs None: the calls cost nothing."""

    def __init__(self, costs, block_address):
        self.costs, self.address = costs, [int(a) for a in block_address]   # plain ints: compared per call
        self.clock = 0.0            # the launching thread's
        self.worker = 0.0           # pump's worker's (the device's)
        self.on_worker = False      # the calls now are the worker's (after the hook's kernel)
        self.ranges = {}            # per kind of call: (last block, blocks) of the range one would join
        self.seconds = 0.0          # time in calls, in all (both threads)
        self.worker_seconds = 0.0   # ... of which the worker's
        self.started = 0            # ranges started, in all (an ioctl each, in fakecuda)
        # kind -> {n: what a range's n-th block adds to its call}: the same few values a
        # million times a run, each computed once
        self.step_costs = collections.defaultdict(dict)

    def hook(self, now=None):
        """A launch's hook begins its calls, at `now` at the earliest, on the launching thread;
        or (now omitted) its kernel is launched: the calls that follow, decided after it, are
        the worker's.  Ranges join no further."""
        self.on_worker = now is None
        if now is not None:
            self.clock = max(self.clock, now)
        self.ranges = {}

    def call(self, kind, b, now, wait=0.0, moved=0):
        """A call (kind: "prefetch", "evict" or "discard") for block b at `now` at the earliest;
        `wait`: the copy the ioctl waits for (the CPU time of moving the pages runs inside it);
        `moved`: the bytes of b's pages it moves.
        Returns when it returns, on the thread that makes it.  (One body, no helper: a run
        makes a million of these; for the same reason max() of two is written out, a builtin
        call costing ten comparisons.)"""
        costs = self.costs
        if costs is None:
            cost = 0.0
        else:
            # Moving the pages' CPU time runs while the copies pushed before it go: a call that
            # waits for its copies takes the longer (fakecuda's fc_prefetch_d2h_wait_ns: the
            # measured rate of a move to the host is the whole call's).  costs.moved(), inline.
            pages_cpu = moved * costs.move / K.BLOCK_BYTES
            if pages_cpu > wait:
                wait = pages_cpu
            last = self.ranges.get(kind)
            if last is not None and b == last[0] + 1 and self.address[b] == self.address[last[0]] + K.BLOCK_BYTES:
                n = last[1] + 1
            else:
                n = 1
                self.started += 1
            steps = self.step_costs[kind]
            cost = steps.get(n)
            if cost is None:
                cost = steps[n] = self._step_cost(kind, n)
            self.ranges[kind] = (b, n)
            cost += wait
            self.seconds += cost
            if self.on_worker:
                self.worker_seconds += cost
        if self.on_worker:
            self.worker = (now if now > self.worker else self.worker) + cost
            return self.worker
        self.clock = (now if now > self.clock else self.clock) + cost
        return self.clock

    def _step_cost(self, kind, n) -> float:
        """What the n-th block of a range of `kind` adds to its call."""
        price = self.costs.discard if kind == "discard" else self.costs.migrate
        return price(n) - price(n - 1) if n > 1 else price(1)

    def discards(self, blocks, now):
        """call("discard", b, now) for each of `blocks` in turn (a freed range's blocks, hundreds
        at a time on a large model): the same sums in the same order, in one call."""
        if not blocks:
            return
        clock = max(self.worker if self.on_worker else self.clock, now)
        if self.costs is not None:
            address, steps, on_worker = self.address, self.step_costs["discard"], self.on_worker
            seconds, worker_seconds = self.seconds, self.worker_seconds
            last, n = self.ranges.get("discard", (None, 0))
            for b in blocks:
                if last is not None and b == last + 1 and address[b] == address[last] + K.BLOCK_BYTES:
                    n += 1
                else:
                    n = 1
                    self.started += 1
                cost = steps.get(n)
                if cost is None:
                    cost = steps[n] = self._step_cost("discard", n)
                last = b
                seconds += cost          # + its wait, 0.0: a discard waits for no copy
                if on_worker:
                    worker_seconds += cost
                clock += cost
            self.ranges["discard"] = (last, n)
            self.seconds, self.worker_seconds = seconds, worker_seconds
        if self.on_worker:
            self.worker = clock
        else:
            self.clock = clock
