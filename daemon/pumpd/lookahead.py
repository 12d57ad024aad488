"""pumpd's side of `--policy lookahead`: one Foresight (pump/foresight.py) per process,
fed what pumpd measures.

The policy needs three figures it cannot read from a trace here:
- kernel times: the GPU's own, where the shim timed launches of the key (its KERNEL records,
  shim/engine/kernel_time.c: timing events just before and after a launch on its stream, a key's
  first few launches and then one now and then): a key's time is the shortest of its
  latest KERNEL_SAMPLES (faults and stalls only lengthen a kernel).  The launching thread's pace is not one: it runs ahead of the GPU
  until the driver's launch queue is full, and after a pause at the host's speed (a replay
  that paused each step gave pumpd 113..162 us host-paced intervals where the kernels took
  0..12 us, and its plan parted from the model's).  A key not timed yet falls back to the
  interval between consecutive launch calls, which a GPU-bound job's full launch queue paces
  at the rate the kernels finish.  The shim stamps each launch less its
  thread's time in pump's own driver calls (its prefetches and evictions, on that thread), so
  the intervals hold the program's pace, not the calls pump's plan made: planning from them
  would stretch the plan's clock exactly where it moves memory. A pause for data loading, a
  synchronisation or a checkpoint is not a kernel: an interval over PAUSE_FACTOR times the
  median of the last RECENT_INTERVALS intervals counts as that median (not the batch's own
  median: one ring read may bring only a launch or two, all of them after a pause). Nor is
  one interval the host stretched (another thread, pumpd's own planning, a host page fault)
  its kernel's time: a launch is given the median of its launch key's intervals among the
  last KEY_WINDOW (the same kernel on the same memory takes about the same time each
  iteration). The plan leaves room for transfers in flight by the longest kernel
  (Foresight.reserve_bytes), so one stretched interval taken as a kernel's time moved the
  plan from one run to the next (a replay on fakecuda faulted 256 or 288 times a step,
  by that alone);
- the link's bandwidth: the median rate of the process's latest prefetches as the GPU timed
  them (the shim's LINK records, shim/engine/link_rate.c: bytes over the time between timing events
  before and after one prefetch on pump's stream), else the highest host-to-GPU PCIe
  throughput NVML has reported for any GPU while pumpd ran, else the PCIe Gen5 x16 figure of
  the simulator's model. A plan made at an assumed rate leaves the wrong room for transfers
  in flight (Foresight.reserve_bytes: the rate x the longest kernel): on fakecuda's 25 GB/s
  link, pumpd planning at Gen5's 63 GB/s made a replay fault where the model did not
  (tests/test_replay_vs_simulate.py);
- the budget: the job's (arbiter, config or `pump-run --budget`), else the one the shim holds
  on its own above the device's memory (its BUDGET records: the device's free memory less a
  margin, shim/policy/budget.c; without it an oversubscribed job's plan evicted nothing and the shim's
  own rule did all the moving), else the GPU's memory as NVML reports it, else no eviction at
  all (the plan then only prefetches ahead).

Learning an iteration and planning it cost up to seconds for a long one, so pumpd runs
:meth:`Lookahead.plan` in its planner's own process (pumpd/planner.py), never on its event
loop's process: the loop only notes a new budget and copies the layout the planner made into
the process's plan.
"""

import collections

import numpy as np

from pump import channel, link
from pump.foresight import FREED_KEPT_MAX, HISTORY_REFS_MAX, KEY_CACHE_MAX, Foresight
from pump.iteration import MAX_HISTORY

# Launch intervals under this are the launching thread's own pace, not kernel times.
KERNEL_SECONDS_MIN = 1e-6
PAUSE_FACTOR = 50
RECENT_INTERVALS = 4096
# NVML throughput below this says nothing about the link (nothing was moving).
BANDWIDTH_FLOOR = 1e9
NO_BUDGET = 1 << 60
# Launch intervals kept, with their launch keys, for each key's median (16 bytes each).
KEY_WINDOW = 1 << 16
# GPU-timed kernel times kept per launch key, the latest of each, for at most KERNEL_KEYS_MAX
# keys (past that the table starts again: what one session makes pumpd hold stays bounded).
KERNEL_SAMPLES = 8
KERNEL_KEYS_MAX = 1 << 16


class Lookahead:
    """The Foresight of one process and the measurements that drive it."""

    def __init__(self, budget: int, bandwidth: float):
        self.policy = Foresight(budget or NO_BUDGET, bandwidth)
        self.policy.retime = self._timed  # a key's GPU time that came after its launch was read
        self.budget = budget or NO_BUDGET  # the budget to plan for (the policy's, once plan() ran)
        self.bandwidth = bandwidth         # the link's rate to plan for (likewise)
        self.layout = channel.Plan.layout({})  # the plan's tables, made by plan()
        self.fresh = False            # a layout made and not yet published
        self.last_launch_ns = None
        self.recent = np.empty(0)     # the last RECENT_INTERVALS launch intervals (seconds)
        self.window_keys = np.empty(0, np.uint64)  # the last KEY_WINDOW intervals' launch keys...
        self.window_seconds = np.empty(0)          # ...and the intervals, pauses left out
        self.kernel_ns = {}           # launch key -> its latest GPU-timed kernel times (ns)...
        self.kernel_seconds = {}      # ... and the shortest of them (s)
        self.kernel_table = None      # kernel_seconds as sorted arrays (keys, seconds), made when needed
        self.kernel_keys_max = KERNEL_KEYS_MAX  # pumpd sets each process's share of these (limit())
        self.window_max = KEY_WINDOW

    def limit(self, share: dict):
        """What this process's tables may hold (limits.planner_share), each at most its own
        default: what one planner learns for all users stays within limits.PLANNER_TABLES_MAX."""
        policy = self.policy
        policy.refs_max = min(HISTORY_REFS_MAX, share["refs"])
        policy.detector.history_max = min(MAX_HISTORY, share["launches"])
        policy.cached_keys_max = min(KEY_CACHE_MAX, share["cached_keys"])
        policy.freed_kept_max = min(FREED_KEPT_MAX, share["freed_blocks"])
        self.kernel_keys_max = min(KERNEL_KEYS_MAX, share["kernel_keys"])
        self.window_max = min(KEY_WINDOW, share["window"])

    def plan(self, *batches: channel.Batch):
        """The planner's work (off the loop): the budget noted, batches learned in order (None:
        none), and the plan's layout made anew, once, if the policy changed it."""
        if self.budget != self.policy.budget:
            self.policy.set_budget(self.budget)
        if self.bandwidth != self.policy.bandwidth:
            self.policy.set_bandwidth(self.bandwidth)
        self.learn(*batches)
        if self.policy.changed:
            self.layout = channel.Plan.layout(self.policy.triggers())
            self.fresh = True

    def take_layout(self) -> tuple:
        self.fresh = False
        return self.layout

    def learn(self, *batches: channel.Batch):
        """Batches read one after another (None: none), learned in one pass: each key's median
        taken once over the window and them all, and no needs made for launches that the
        batches after them would push out of the history at once (extent_refs). A turn may
        bring a thousand batches (issue 45's attack 2 brought 948 of 69 launches, whose
        medians and needs, made batch by batch, took 11 s and 352 s of the planner's CPU)."""
        batches = [b for b in batches if b is not None]
        for batch in batches:
            self._note_kernels(batch.kernels)
        refs_after, later = [], 0
        for batch in reversed(batches):
            refs_after.append(later)
            later = min(later + self.policy.extent_refs(batch), self.policy.refs_max)
        for batch, seconds, after in zip(batches, self._kernel_seconds(batches), reversed(refs_after)):
            self.policy.observe(batch, kernel_seconds=seconds, refs_after=after)

    def _kernel_seconds(self, batches) -> list:
        """Each batch's kernel times per launch (None where it has no launch times): launch
        intervals, a pause (over PAUSE_FACTOR times the median of the recent intervals, not of
        one read's few) taken as that median, then each key's median over the window."""
        keys, intervals, timed = [], [], []
        for i, batch in enumerate(batches):
            times = batch.launch_time
            if times is None or len(times) == 0:
                continue
            previous = times[0] if self.last_launch_ns is None else self.last_launch_ns
            seconds = np.maximum(np.diff(np.concatenate(([previous], times)).astype(np.int64)) / 1e9,
                                 KERNEL_SECONDS_MIN)
            self.recent = np.concatenate((self.recent, seconds))[-RECENT_INTERVALS:]
            median = float(np.median(self.recent))
            seconds[seconds > PAUSE_FACTOR * median] = median
            self.last_launch_ns = int(times[-1])
            keys.append(channel.launch_keys(batch))
            intervals.append(seconds)
            timed.append(i)
        out = [None] * len(batches)
        if timed:
            every = np.concatenate(keys)
            per_launch = self._timed(every, self._per_key(every, np.concatenate(intervals)))
            for i, part in zip(timed, np.split(per_launch, np.cumsum([len(k) for k in keys])[:-1])):
                out[i] = part
        return out

    def _note_kernels(self, kernels):
        for _device, key, ns in kernels:
            samples = self.kernel_ns.get(key)
            if samples is None:
                if len(self.kernel_ns) >= self.kernel_keys_max:
                    self.kernel_ns.clear()
                    self.kernel_seconds.clear()
                samples = self.kernel_ns[key] = collections.deque(maxlen=KERNEL_SAMPLES)
            samples.append(ns)
            self.kernel_seconds[key] = min(samples) / 1e9
            self.kernel_table = None

    def _timed(self, keys, seconds):
        """Each launch's kernel time: its key's shortest GPU-timed sample where the shim timed
        one, else `seconds` (from the launch intervals); vectorised like _per_key."""
        if not self.kernel_seconds:
            return seconds
        if self.kernel_table is None:
            known = np.fromiter(self.kernel_seconds, np.uint64, len(self.kernel_seconds))
            order = np.argsort(known)
            self.kernel_table = known[order], np.fromiter(self.kernel_seconds.values(), float)[order]
        known, timed = self.kernel_table
        at = np.minimum(np.searchsorted(known, keys), len(known) - 1)
        return np.where(known[at] == keys, timed[at], seconds)

    def _per_key(self, keys, seconds):
        """Each launch's kernel time: the (lower) median of its key's intervals in the window,
        this batch's included; vectorised (a batch may hold 65,536 distinct keys)."""
        kept = max(self.window_max, len(keys))  # the batch's own, whatever the window: its keys are looked up
        self.window_keys = np.concatenate((self.window_keys, keys))[-kept:]
        self.window_seconds = np.concatenate((self.window_seconds, seconds))[-kept:]
        order = np.lexsort((self.window_seconds, self.window_keys))
        k, v = self.window_keys[order], self.window_seconds[order]
        starts = np.flatnonzero(np.concatenate(([True], k[1:] != k[:-1])))
        counts = np.diff(np.append(starts, len(k)))
        medians = v[starts + (counts - 1) // 2]
        return medians[np.searchsorted(k[starts], keys)]

    def set_budget(self, budget: int):
        """Noted; plan() plans for it."""
        self.budget = budget or NO_BUDGET

    def set_bandwidth(self, bandwidth: float):
        """Noted; plan() plans for it (unless it is close to the rate planned for)."""
        self.bandwidth = bandwidth


def best_throughput(telemetry_sample, best: float) -> float:
    """The highest host-to-GPU throughput (bytes/s) seen so far, updated from a sample
    (NVML's RX is what the GPU receives)."""
    for gpu in (telemetry_sample or {}).get("gpus", []):
        rx = gpu.get("pcie_rx_bytes_per_s")
        if rx and rx > best:
            best = float(rx)
    return best


def bandwidth(link_rate: float, best_measured: float) -> float:
    """The link bandwidth the plans assume: the rate of the process's prefetches as the GPU
    timed them (its LINK records), else the best NVML has seen, else PCIe Gen5 x16's."""
    if link_rate > 0:
        return link_rate
    return best_measured if best_measured >= BANDWIDTH_FLOOR else link.PCIE5_X16_BYTES_PER_S


def default_budget(telemetry_sample) -> int:
    """The first GPU's memory as NVML reports it, or 0 (none known)."""
    for gpu in (telemetry_sample or {}).get("gpus", []):
        if gpu.get("memory_total"):
            return int(gpu["memory_total"])
    return 0
