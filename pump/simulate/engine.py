"""The discrete-event model behind `pump simulate`: one pass over a workload's launches, in
program order, for one policy at one capacity.

Two layers, the shim's rules as shim/policy/residency.c states them:
- the shim's BELIEF (2 MiB blocks believed resident, the budget, its eviction orders) decides
  prefetches and evictions exactly as the shim does for each policy;
- the TRUTH (which 64 KiB pages are on the GPU, gpu_truth.py) counts faults and bytes as
  fakecuda and the driver do: a fault per touched page not on the GPU, serviced in batches with
  the driver's fault-time prefetcher, prefetch bytes = pages really moved, eviction bytes =
  resident pages really moved back (discarded pages move nothing).
With a GPU preset the GPU itself holds at most `capacity` bytes (2 MiB chunks): a fault that
needs room makes the driver evict a chunk in its list order, on the fault path, before the
fill.  With the fakecuda model device memory is unlimited and only the budget holds: fakecuda
evicts only when its device memory (FAKECUDA_DEVICE_MEMORY, 80 GiB by default) is full, which
the replays this model predicts never reach.

Time: four FIFO resources, each op starting when its inputs are ready:
- the host issues launches HOST_LAUNCH_S apart, at most LAUNCH_QUEUE_DEPTH ahead of the GPU,
  and waits for the GPU at each step's start (a training loop reads its loss every step);
  pump's own driver calls run on the launching thread (today's shim has no worker of its own;
  fakecuda's default, FAKECUDA_IOCTL_THREAD unset, charges them there too) and cost what
  fakecuda charges, from the same constants read from fakecuda_model.h (host.py): per range
  of contiguous blocks one ioctl plus a pass per block (two passes for a range of several),
  per discard range one ioctl plus a wait per block, and an eviction to the host also waits
  for its copy inside the ioctl (UVM_MIGRATE without its async flag, uvm_migrate.c).  Calls a
  launch's hook makes before the launch delay its kernel; those after it (a plan's trigger)
  delay the next launch.  Ranges join only within one hook's moves of one kind.
- the compute stream runs kernel k after kernel k-1, after its launch, after the prefetches of
  its blocks (the kernel waits on its prefetch event), for its roofline time plus its faults'
  service time, the pages the driver's prefetcher adds at the link's line rate, and the
  driver's evictions on its fault path;
- the prefetch stream (host->GPU) and the eviction stream (GPU->host) each move bytes at the
  model's rate of explicit migrations, full duplex, or half duplex: then one copy at a time,
  either way, each in the first gap of the link long enough for it once it is ready
  (link.py: a stream waiting on an event does not hold the link); an eviction starts after
  the last kernel that used the block, and a prefetch that needs room waits until enough
  evictions have completed.  The driver's evictions on the fault path move at the link's line
  rate (the side that favours the naive baseline).
Counts follow program order (each stream's ordering is what makes that exact on fakecuda).
A run decides here and times its moves in link.py (Streams), which can time another run's
recorded moves in its stead (link.Moves: the range's second case, runs.py).
"""

import collections
import contextlib
import dataclasses

import numpy as np

from pump.foresight import BLOCK_SHIFT, Foresight, discard_range
from pump.simulate import constants as K
from pump.simulate.gpu_truth import FaultRules, GpuTruth
from pump.simulate.host import HostCosts, LaunchThread
from pump.simulate.link import Streams
from pump.simulate.segments import RUN_EVENTS, run_event
from pump.simulate.victims import UseOrder, VictimSearch
from pump.simulate.workload import collector_paused

POLICIES = ("naive", "launch", "lookahead", "ideal")
# Per step: faults, bytes each way, kernels' waits for data and prefetches' waits for room, and
# the launching thread's seconds in pump's driver calls.
STEP_COUNTS = ("faults", "h2d", "d2h", "data_wait", "prefetch_wait", "host")
# The Result's counts that follow from what a run decides, not from when (link.Moves).
DECIDED = ("faults", "fault_batches", "bytes_prefetched_h2d", "bytes_faulted_h2d", "bytes_fault_prefetched_h2d",
           "bytes_d2h", "bytes_discarded", "unsafe_discards", "prefetch_calls", "evictions", "driver_evictions",
           "max_believed", "max_resident")


@dataclasses.dataclass(frozen=True)
class Model:
    name: str
    gpu: K.GpuPreset            # the card: its FLOPs and memory roofs (workload.kernel_seconds)
    bandwidth: float            # bytes/s of explicit migrations host->GPU: prefetches
    link_bytes_per_s: float     # the link's line rate: the driver's evictions on the fault path
    fault_seconds: float        # the faulting kernel's stall per serviced fault
    fault_batch: int
    host_launch_seconds: float
    queue_depth: int
    gpu_limits_memory: bool     # the driver evicts at capacity (a real GPU), or not within the replays modelled (fakecuda)
    # Prefetches and evictions on the two directions of the link at once, or one after another
    # (the worst case of PREFETCH_DUPLEX in constants.py).
    full_duplex: bool = True
    # The policy is told each launch's exact extents and the framework's frees (a framework
    # integration's view), or only what today's shim reports to pumpd: allocation bases.
    policy_sees_extents: bool = True
    # pumpd reads the ring every K.DAEMON_READ_LAUNCHES launches, or each step whole: a
    # lookahead replay on fakecuda (bench/replay_trace --step-pause) issues a step's launches
    # in a few ms, then pauses, and pumpd reads and plans in the pause.
    daemon_reads_steps: bool = False
    # bytes/s of explicit migrations GPU->host (pump's evictions); 0: as `bandwidth`.
    d2h_bandwidth: float = 0.0
    # The link's line rate GPU->host (the driver's evictions and write-backs); 0: as link_bytes_per_s.
    link_d2h_bytes_per_s: float = 0.0
    # pump's driver calls cost the launching thread what fakecuda charges (host.HostCosts), or nothing.
    host_costs: bool = True
    # The driver's fault-time prefetcher: its threshold in percent (None: off) and min_faults.
    prefetch_threshold: int = K.PREFETCH_THRESHOLD_PERCENT
    prefetch_min_faults: int = K.PREFETCH_MIN_FAULTS

    @property
    def d2h_rate(self) -> float:
        return self.d2h_bandwidth or self.bandwidth

    @property
    def link_out(self) -> float:
        return self.link_d2h_bytes_per_s or self.link_bytes_per_s


def gpu_model(gpu: str = K.DEFAULT_GPU, link: float = None, prefetch: float = None,
              full_duplex: bool = True, evict: float = None, link_out: float = None) -> Model:
    """A GPU preset (K.GPU_PRESETS) on its host link: `link` overrides the line rate (bytes/s
    host->GPU, and GPU->host unless `link_out` gives that), `prefetch` the rate of explicit
    migrations host->GPU and `evict` GPU->host (each at most its direction's line rate; default
    it).  ValueError naming the allowed presets for an unknown one."""
    if gpu not in K.GPU_PRESETS:
        raise ValueError(f"unknown GPU preset {gpu!r}; allowed: {', '.join(K.GPU_PRESETS)}")
    preset = K.GPU_PRESETS[gpu]
    link = link or preset.link_bytes_per_s
    out = link_out or link
    rate = min(prefetch or link, link)
    duplex = "" if full_duplex else ", half duplex"
    name = f"{gpu}, PCIe Gen{preset.pcie_generation} x{preset.pcie_lanes}{duplex}"
    path = preset.fault_path
    return Model(name, preset, rate, link, path.service_seconds, path.batch_faults,
                 K.HOST_LAUNCH_S, K.LAUNCH_QUEUE_DEPTH, True, full_duplex, d2h_bandwidth=min(evict or out, out),
                 link_d2h_bytes_per_s=out,
                 prefetch_threshold=path.prefetch_threshold, prefetch_min_faults=path.prefetch_min_faults)


def h100(bandwidth: float = None) -> Model:
    """The default preset, an H100 PCIe; `bandwidth` overrides its link (bytes/s each way)."""
    return gpu_model(K.DEFAULT_GPU, bandwidth)


def fakecuda(bandwidth: float = None, out: float = None) -> Model:
    """fakecuda's model (its fault path's knobs at their defaults); its kernels take the
    default preset's times. `bandwidth` replaces its rates (bytes/s), `out` GPU->host's."""
    f = K.fakecuda_constants()
    if f["FAKECUDA_PAGE"] != K.PAGE_BYTES or f["FAKECUDA_MANAGED_ALIGN"] != K.BLOCK_BYTES:
        raise ValueError(f"{K.FAKECUDA_MODEL_H}: page {f['FAKECUDA_PAGE']} / alignment "
                         f"{f['FAKECUDA_MANAGED_ALIGN']} differ from the simulator's {K.PAGE_BYTES} / {K.BLOCK_BYTES}")
    h2d = f["FAKECUDA_H2D_BYTES_PER_US"] * 1e6
    rate = bandwidth or h2d
    return Model("fakecuda", K.GPU_PRESETS[K.DEFAULT_GPU], rate, rate,
                 f["FAKECUDA_GPU_FAULT_US"] * 1e-6 + K.PAGE_BYTES / h2d, f["FAKECUDA_UVM_PERF_FAULT_BATCH_COUNT"],
                 f["FAKECUDA_LAUNCH_LATENCY_US"] * 1e-6, K.LAUNCH_QUEUE_DEPTH, False,
                 policy_sees_extents=False, daemon_reads_steps=True,
                 d2h_bandwidth=out or bandwidth or f["FAKECUDA_PREFETCH_D2H_BYTES_PER_US"] * 1e6,
                 link_d2h_bytes_per_s=out or bandwidth or f["FAKECUDA_EVICT_D2H_BYTES_PER_US"] * 1e6,
                 prefetch_threshold=f["FAKECUDA_UVM_PERF_PREFETCH_THRESHOLD"] if f["FAKECUDA_UVM_PERF_PREFETCH_ENABLE"]
                 else None, prefetch_min_faults=f["FAKECUDA_UVM_PERF_PREFETCH_MIN_FAULTS"])


def range_models(gpu: str = K.DEFAULT_GPU, link: float = None, link_out: float = None) -> list:
    """[(case, Model)] over the sourced range of explicit migrations (K.RANGE_CASES): the best
    case at the line rate, full duplex, and the worst, each direction at its own rate (of its
    own line rate, where `link_out` gives GPU->host's)."""
    base = gpu_model(gpu, link, link_out=link_out)
    link, out = base.link_bytes_per_s, base.link_out
    return [(case, gpu_model(gpu, link, link * h2d, duplex, out * d2h, out)) for case, h2d, d2h, duplex in K.RANGE_CASES]


# --model: h100 is the h100-pcie preset (--gpu picks another); fakecuda is fakecuda.
MODELS = {"h100": h100, "fakecuda": fakecuda}


@dataclasses.dataclass
class Result:
    policy: str
    capacity: int
    step_ends: list                   # seconds at which each step's last kernel ends
    steady: list                      # indices of the steps that count as steady state
    faults: int = 0
    fault_batches: int = 0
    bytes_prefetched_h2d: int = 0     # pages moved host->GPU by prefetches
    bytes_faulted_h2d: int = 0        # pages moved host->GPU by faults
    bytes_fault_prefetched_h2d: int = 0  # of which the driver's fault-time prefetcher added
    bytes_d2h: int = 0                # pages moved GPU->host by evictions (shim's or driver's)
    bytes_discarded: int = 0          # resident bytes discarded instead of written back
    unsafe_discards: int = 0          # discards refused: the range was not known dead
    prefetch_calls: int = 0
    evictions: int = 0                # blocks evicted
    driver_evictions: int = 0         # of which by the driver (GPU full)
    prefetch_wait_seconds: float = 0  # time prefetches waited for evictions to make room
    data_wait_seconds: float = 0      # time kernels, launched and next in line, waited for data
    max_believed: int = 0             # the most bytes the shim believed resident
    max_resident: int = 0             # the most bytes of 2 MiB chunks really on the GPU
    host_seconds: float = 0           # the launching thread's time in pump's driver calls
    driver_ranges: int = 0            # ranges pump's calls moved or discarded (ioctls, in fakecuda)
    per_step: dict = None             # per step: faults, bytes each way
    learned_at: int = None

    def _steady_times(self):
        return np.diff(np.concatenate(([0.0], self.step_ends)))[self.steady]

    @property
    def step_seconds(self) -> float:
        """The median steady step (a typical step)."""
        times = self._steady_times()
        return float(np.median(times)) if len(times) else float("nan")

    @property
    def step_mean_seconds(self) -> float:
        """The mean steady step: what the lower bound, a long-run mean, is compared with."""
        times = self._steady_times()
        return float(np.mean(times)) if len(times) else float("nan")

    def steady_mean(self, what: str) -> float:
        return float(np.mean(np.asarray(self.per_step[what])[self.steady])) if self.steady else float("nan")


def steady_steps(workload) -> list:
    """The steps that count: those that begin after the iteration is learned, less the first
    of them (the plan's first use warms up), when two or more remain; at least the last."""
    bounds = _step_bounds(workload)
    start = workload.learned_at or 0
    after = [s for s, (lo, _) in enumerate(bounds) if lo >= start]
    if len(after) >= 2:
        after = after[1:]
    return after or [len(bounds) - 1]


def _step_bounds(workload):
    """[(first launch, end launch)] of each step: from STEP records, else the period."""
    n = workload.launches
    starts = [s for s in workload.steps if 0 < s < n]
    if not starts and workload.period:
        starts = list(range(workload.period, n, workload.period))
    starts = [0] + starts
    return list(zip(starts, starts[1:] + [n]))


@collector_paused   # a run's heap entries and recorded moves, the workload's tuples: nothing to free
def run(workload, policy: str, capacity: int, model: Model, recorder=None, moves=None) -> Result:
    """recorder: told what happens, as it happens (pump/simulate/timeline.py), or None.
    moves: a link.Moves, empty: the run records its moves there; or recorded by a run of the
    same policy and capacity on the same GPU at other rates (runs.Runs.decided_by): the run
    times them as far as they reach (link.Streams), unless it records a timeline."""
    if policy not in POLICIES:
        raise ValueError(f"policy {policy!r}: allowed {', '.join(POLICIES)}")
    recorded = moves is not None and moves.until is not None
    if recorded and recorder is None:
        with contextlib.suppress(_Diverged):
            return _Run(workload, policy, capacity, model, replay=moves).go()
    return _Run(workload, policy, capacity, model, recorder, record=None if recorded else moves).go()


class _Diverged(Exception):
    """The run's first plan came where the recorded run's did not: it decides for itself."""


class _Run:
    """One run: what it decides (the shim's belief, the GPU's pages: here) and when it happens
    (self.streams); record: a link.Moves its moves go to, replay: one whose moves it times."""

    def __init__(self, w, policy, capacity, model, recorder=None, record=None, replay=None):
        self.w, self.policy, self.capacity, self.m = w, policy, int(capacity), model
        self.rec, self.recording, self.replay = recorder, record, replay
        self.link_out = model.link_out
        self.kernel_s = w.kernel_seconds(model.gpu)
        self.ran_s = np.zeros(w.launches)      # each kernel's time on the simulated GPU, faults included
        self.shortest = {}                     # launch key -> its kernel's shortest time so far
        nb = len(w.block_bytes)
        self.size = w.block_bytes.tolist()
        self.dead = [0] * nb                   # pages the framework's allocator took back (where discards read it)
        self.migrated = collections.OrderedDict()  # belief, least recently migrated first
        self.migrations = 0
        self.used = UseOrder(nb)                  # belief, least recently used first
        self.believed = 0
        self.bounds = _step_bounds(w)
        self.r = Result(policy, self.capacity, [], steady_steps(w),
                        per_step={k: [] for k in STEP_COUNTS})
        self.gpu = GpuTruth(w, self.r, self.capacity, model.gpu_limits_memory,
                            FaultRules(model.fault_batch, model.prefetch_threshold, model.prefetch_min_faults))
        self.foresight = None
        self.plan = {}
        costs = HostCosts.of_fakecuda() if model.host_costs else None
        if policy == "lookahead":  # pumpd plans at the rate the shim measures its prefetches at
            mean = float(np.mean(self.kernel_s)) or K.HOST_LAUNCH_S
            rate = costs.probed_rate(model.bandwidth) if costs else model.bandwidth
            self.foresight = Foresight(self.capacity, rate, launch_seconds=mean)
            self.foresight.retime = self._retime
        # Discard needs the framework's frees, which today's shim does not see.
        self.discards = self.foresight is not None and model.policy_sees_extents
        self.shim = policy in ("launch", "lookahead") or (policy == "naive" and not model.gpu_limits_memory)
        self.thread = LaunchThread(costs, w.block_address)
        self.streams = Streams(model, self.capacity, self.size, self.thread, self.r, recorder)

    # ---- belief ----
    def _believe(self, b):
        if b not in self.migrated:
            self.migrated[b] = None
            self.migrations += 1
            self.used.add(b, self.migrations)
            self.believed += self.size[b]

    def _forget(self, b):
        if b in self.migrated:
            del self.migrated[b]
            self.used.remove(b)
            self.believed -= self.size[b]

    def _host_totals(self):
        if self.streams.called:   # a run that made no call keeps the Result's own zeros
            self.r.host_seconds, self.r.driver_ranges = self.thread.seconds, self.thread.started

    def _evict(self, b, now):
        """The shim evicts b to the host (a plan may name a block not believed resident: pages
        a kernel faulted in move all the same); link.Streams.evict times it."""
        believed = b in self.migrated
        if believed:   # _forget, inline: half a million times a run
            del self.migrated[b]
            self.used.remove(b)
            self.believed -= self.size[b]
        moved = self.gpu.evict(b)
        self.r.evictions += 1
        self.streams.evict(b, moved, believed, now)

    def _prefetch(self, b, now):
        """The shim prefetches b; returns when it is on the GPU."""
        r, migrated = self.r, self.migrated
        if b not in migrated:   # _believe, inline: half a million times a run
            migrated[b] = None
            self.migrations += 1
            self.used.add(b, self.migrations)
            self.believed += self.size[b]
        gpu, pages = self.gpu, self.w.block_pages[b]
        # On a full GPU the driver evicts on the prefetch's path, then fills (evict, then fill).
        back = gpu.make_room(gpu.size[b], b) if b not in gpu.chunks else 0
        arriving = (pages & ~gpu.res[b]).bit_count() * K.PAGE_BYTES   # gpu.arriving(b, pages), inline
        moved = gpu.add(b, pages)
        r.bytes_prefetched_h2d += moved
        r.prefetch_calls += 1
        if self.believed > r.max_believed:
            r.max_believed = self.believed
        return self.streams.prefetch(b, back, arriving, moved, self.believed, now)

    def _victims_until(self, need, search, now):
        """Evict believed blocks in the search's order (victims.VictimSearch) until `need` more
        bytes fit."""
        while self.believed + need > self.capacity:
            v = search.next()
            if v is None:
                break
            self._evict(v, now)
        return self.believed + need <= self.capacity

    def _take(self, blocks, order, now):
        """What a launch takes before its kernel: its blocks not believed resident are
        prefetched, making room in `order` first; the first that fit are taken, from the first
        that does not the rest fault.  The launch rule takes its whole allocations (PUMP), a
        launch the plan knows its `need` blocks (an array, as the launch's are)."""
        missing = self.used.absent(blocks).tolist()
        if not missing:
            return now
        search = VictimSearch(order, self.used, set(blocks.tolist()))
        ready = now
        for b in missing:
            if b in self.migrated:   # named twice
                continue
            if not self._victims_until(self.size[b], search, now):
                break
            arrives = self._prefetch(b, now)
            if arrives > ready:
                ready = arrives
        search.close()
        return ready

    def _trigger(self, plan, now, launch):
        """The plan's trigger for a launch, after its kernel: planned evictions, then the
        prefetches that fit the budget (the rest come in by the `need` rule later).  A block
        it names for prefetch counts as used by it, whether it came in now or was resident."""
        _need, prefetch, evict = plan
        for b in evict:
            self._evict(b, now)
        for b in prefetch:
            if b not in self.migrated:
                if self.believed + self.size[b] > self.capacity:
                    continue
                self._prefetch(b, now)
            self.used.name(b, launch)

    # ---- allocator events ----
    def _events(self, k, now):
        for what, addr, size in self.w.events.get(k, ()):
            if what in RUN_EVENTS:   # frees; in segments, dead tensors' blocks and tensors placed there
                run_event(self, what, addr, size)
            elif what in ("block_free", "block_alloc") and self.discards:   # only a discard reads dead pages
                self._mark_dead(addr, size, what == "block_free")
                if what == "block_free":
                    self._discard(discard_range(addr, size), now)

    def _mark_dead(self, addr, size, dead):
        marks = self.dead
        for b, mask in self.w.page_masks(addr, size, inward=dead):
            marks[b] = marks[b] | mask if dead else marks[b] & ~mask

    def _discard(self, dead_range, now):
        """cuMemDiscardBatchAsync of a range the framework freed: its resident pages become
        clean (no write-back when evicted); refused unless every page of it is dead."""
        if dead_range is None:
            return
        masks, dead = self.w.page_masks(*dead_range, inward=True), self.dead
        if any(mask & ~dead[b] for b, mask in masks):
            self.r.unsafe_discards += 1
            return
        self.streams.discards([b for b, _mask in masks], now)
        discard = self.gpu.discard
        for b, mask in masks:
            discard(b, mask)

    # ---- the pass ----
    def go(self) -> Result:
        w, m, r = self.w, self.m, self.r
        n = w.launches
        kend = np.zeros(n)
        cpu = prev_end = 0.0
        batch_iter = iter(w.batches)
        next_batch = next(batch_iter, None)
        step_starts = {lo for lo, _ in self.bounds}
        step_last = {hi - 1 for _, hi in self.bounds}
        ideal = self.policy == "ideal"
        arg_arrays, touched = w.block_arrays
        streams = self.streams
        base = [0] * len(STEP_COUNTS)  # the counts when the step began
        for k in range(n):
            # pumpd reads a batch once its last launch has been made: its plan holds from then.
            while next_batch is not None and next_batch[0] + len(next_batch[1].launch_function) <= k:
                if self.foresight is not None:
                    self._feed(next_batch)
                next_batch = next(batch_iter, None)
            if self.plan and self.recording is not None:   # what follows depends on the plan's rates
                self.recording.stop(k, self._decided())
                self.recording = streams.moves = None
            if self.replay is not None and (self.plan or k == self.replay.until):
                self._go_on(k)
            cpu = max(cpu, self.thread.clock) + m.host_launch_seconds  # after the last hook's calls
            if k >= m.queue_depth:
                cpu = max(cpu, kend[k - m.queue_depth])
            if k in step_starts and k:
                cpu = max(cpu, prev_end)
            self.thread.hook(cpu)
            ready = cpu
            planned = self.plan.get(int(w.keys[k])) if self.plan else None
            if self.rec is not None:
                self.rec.launch(k, cpu)
            faults = moved_back = faulted = by_prefetcher = 0
            if not ideal:
                ready = self._before_kernel(k, cpu, planned, arg_arrays[k])
                faults, faulted, by_prefetcher, moved_back = self._kernel(k)
                ready = max(ready, self.thread.clock)  # the kernel is launched after the hook's calls
                self.thread.hook()  # the trigger's calls, after the kernel, are another batch
                if len(touched[k]):
                    ready = max(ready, float(streams.ready[touched[k]].max()))
                duration = (self.kernel_s[k] + faults * m.fault_seconds
                            + by_prefetcher / m.link_bytes_per_s + moved_back / self.link_out)
            else:
                duration = self.kernel_s[k]
            start = max(prev_end, ready)
            r.data_wait_seconds += start - max(prev_end, self.thread.clock)
            prev_end = kend[k] = start + duration
            self.ran_s[k] = duration
            if self.rec is not None:
                self.rec.kernel(k, start, duration, faults, faulted, moved_back, self.gpu.bytes, self.believed)
            if not ideal:
                streams.last_user_end[arg_arrays[k]] = prev_end
                streams.last_user_end[touched[k]] = prev_end
                self._after_kernel(k, cpu, planned, arg_arrays[k])
            if k in step_last:
                base = self._step_end(prev_end, base)
        if self.foresight is not None:
            r.learned_at = self.foresight.learned_at
        self._host_totals()
        if self.recording is not None:
            self.recording.stop(n)
        return r

    def _before_kernel(self, k, cpu, planned, args) -> float:
        """Launch k's hook: the allocator's events, then what the launch takes (the plan's
        `need`, else the launch rule); returns when its prefetches end."""
        if self.replay is not None:
            return self.streams.replay(self.replay.before[k], cpu)
        if self.recording is not None:
            self._record_to(self.recording.before)
        self._events(k, cpu)
        if planned is not None:
            return self._take(planned[0], self.used, cpu)
        if self.shim and self.policy != "naive":
            # The launch rule, also for a launch the plan does not know: the shim's launch rule
            # evicts least recently used first, in migration order once a plan is in force
            # (shim/policy/residency.c, launch_rule_order).
            return self._take(args, self.migrated if self.plan else self.used, cpu)
        return cpu

    def _kernel(self, k) -> tuple:
        """Launch k's kernel touches its pages: (faults, bytes faulted in, of which by the
        driver's prefetcher, bytes the driver evicted on the way)."""
        if self.replay is not None:
            return self.replay.kernels[k]
        r = self.r
        kernel = self.gpu.kernel(self.w.touch_order[k])
        if self.recording is not None:
            self.recording.kernels.append(kernel)
        if self.discards:   # only then are pages clean
            clean = self.gpu.clean
            for b, mask in self.w.touched[k]:
                if clean[b]:
                    clean[b] &= ~mask  # a discarded page a kernel uses is live again
        faults, faulted, by_prefetcher, _moved_back = kernel
        r.faults += faults
        r.bytes_faulted_h2d += faulted
        r.bytes_fault_prefetched_h2d += by_prefetcher
        return kernel

    def _after_kernel(self, k, cpu, planned, args):
        """After launch k's kernel: its blocks' use (the launch rule's and the plan's victim
        order), then the naive shim's evictions (fakecuda's model) or the plan's trigger."""
        if self.replay is not None:
            self.streams.replay(self.replay.after[k], cpu)
            return
        if self.recording is not None:
            self._record_to(self.recording.after)
        if self.policy != "naive":
            self.used.use(args, k + 1)
        if self.policy == "naive" and self.shim:
            for b in self.used.absent(args).tolist():
                self._believe(b)
            if self.believed > self.capacity:
                self._victims_until(0, VictimSearch(self.migrated, self.used, set(self.w.arg_blocks[k])), cpu)
            self.r.max_believed = max(self.r.max_believed, self.believed)
        elif planned is not None:
            self._trigger(planned, cpu, k + 1)

    def _step_end(self, end, base) -> list:
        """A step ends at `end`: its counts (STEP_COUNTS) less `base`, those at its start (the
        decided ones as recorded, where the run times recorded moves); returns them."""
        r = self.r
        self._host_totals()
        if self.replay is not None:
            for what, value in zip(DECIDED, self.replay.counts[len(r.step_ends)]):
                setattr(r, what, value)
        elif self.recording is not None:
            self.recording.counts.append(tuple(getattr(r, what) for what in DECIDED))
        r.step_ends.append(end)
        now = (r.faults, r.bytes_prefetched_h2d + r.bytes_faulted_h2d, r.bytes_d2h,
               r.data_wait_seconds, r.prefetch_wait_seconds, r.host_seconds)
        for i, what in enumerate(STEP_COUNTS):
            r.per_step[what].append(now[i] - base[i])
        return list(now)

    # ---- recorded moves (link.Moves) ----
    def _record_to(self, launches):
        """The moves timed from here go to a new entry of `launches` (Moves.before or .after)."""
        self.streams.moves = []
        launches.append(self.streams.moves)

    def _decided(self):
        """What the run has decided so far (a copy): its belief, the GPU's pages, the counts."""
        return (list(self.dead), collections.OrderedDict(self.migrated), self.migrations, self.used.copy(),
                self.believed, self.gpu.copy(self.r), tuple(getattr(self.r, what) for what in DECIDED))

    def _go_on(self, k):
        """The recorded moves end at launch k: from the recorded run's state there, the run
        decides for itself; if its first plan comes here too (else _Diverged)."""
        if k != self.replay.until or not self.plan:
            raise _Diverged
        dead, migrated, self.migrations, used, self.believed, gpu, counts = self.replay.state
        self.dead, self.migrated, self.used, self.gpu = list(dead), collections.OrderedDict(migrated), used.copy(), \
            gpu.copy(self.r)
        for what, value in zip(DECIDED, counts):
            setattr(self.r, what, value)
        self.replay = None

    def _feed(self, item):
        start, batch = item
        nl = len(batch.launch_function)
        if not self.m.policy_sees_extents:
            batch = dataclasses.replace(batch, extents={}, block_frees=[], block_allocs=[])
        self.foresight.observe(batch, kernel_seconds=self._timed(start, nl))
        if self.foresight.changed:
            self.plan = {key: (np.asarray(self._blocks_of_ranges(need), np.int64), self._blocks_of_ranges(prefetch),
                               self._blocks_of_ranges(evict))
                         for key, (need, prefetch, evict) in self.foresight.triggers().items()}

    def _timed(self, start, n):
        """The kernel times pumpd plans with: as the shim's timing events give them (their
        time on the GPU, faults included), each launch key's shortest so far (daemon/pumpd/
        lookahead.py: faults and stalls only lengthen a kernel)."""
        shortest, out = self.shortest, np.empty(n)
        for i, (key, ran) in enumerate(zip(self.w.keys[start:start + n].tolist(), self.ran_s[start:start + n].tolist())):
            out[i] = shortest[key] = min(shortest.get(key, ran), ran)
        return out

    def _retime(self, keys, seconds):
        """At a plan: each key's shortest time so far (pumpd's, likewise: lookahead.py)."""
        shortest = self.shortest
        return np.array([shortest.get(key, s) for key, s in zip(keys.tolist(), seconds.tolist())])

    def _blocks_of_ranges(self, ranges):
        out, block_of = [], self.w.block_of
        for addr, size in ranges:
            for x in range(addr >> BLOCK_SHIFT, (addr + size + K.BLOCK_BYTES - 1) >> BLOCK_SHIFT):
                b = block_of.get(x)
                if b is not None:
                    out.append(b)
        return out
