"""The multi-job arbiter: how one GPU's memory pool is divided into the budgets of
the jobs that share it (DESIGN.md: "arbiter: GPU budgets").

pumpd.toml's ``[budgets] gpu_pool`` is what the arbiter hands out on each GPU (bytes,
or a percentage of the GPU's memory as NVML reports it).  Each job states its terms in
its config's ``[memory]`` section:

- ``budget``: a fixed budget.  The job keeps it, outside the division, and it counts
  against the pool (so does a budget set with ``op set``, which overrides the config).
- ``share`` (default 1): its weight in the division.
- ``min_budget`` (default 0): the least it must get.  Once granted, a minimum is a
  promise: no job that comes later pushes it under it, whatever its priority.
- ``max_budget`` (default none): the most it can use.
- ``priority`` (default 0, higher first): the order in which jobs waiting for their
  minimum are granted it, when the pool cannot hold every minimum.

The division (:func:`divide`, pure) goes in three steps:

1. Fixed budgets are taken off the pool.
2. Minimums are granted: promises kept first, then the jobs still waiting, in order of
   priority (higher first), then arrival.  The order is strict: a job waits while one
   before it waits, so a large minimum is not starved by small ones arriving after it.
   A job whose minimum does not fit is still run (pump cannot stop a program using its
   GPU), with what the division below gives it beyond a minimum of 0, and is marked
   "unmet" until its minimum fits; pumpd logs a warning.
3. Water-filling: the rest goes to all arbitrated jobs in proportion to their shares,
   each held within [its granted minimum, its max_budget]: budget = clamp(L * share),
   with one level L making the budgets add up to the pool (or every job at its max).

Budgets are rounded down to whole 2 MiB blocks (the shim works on 2 MiB blocks, so a
finer budget means nothing), never under a granted minimum.  Their sum stays within
the pool, unless promised minimums and fixed budgets alone exceed it (the pool shrank).

:class:`Arbiter` applies a division to pumpd's jobs: it works out each job's terms,
writes each job's budget, its source and state, and logs every change.

Which GPUs: each process's shim names the devices it works on by UUID (DEVICE records),
and NVML telemetry says which NVML index has that UUID; a job counts against the pool of
each GPU it uses.  A job seen on no device yet, or only on devices NVML does not list (no
NVML, a MIG instance), counts against GPU 0.  A job on several GPUs is a claim in each
GPU's division and gets the least of its grants as its one budget (the shim caps what is
resident on each device with it), so it stays within every pool it uses; the rest of its
larger grants stays unassigned until the next division.  Its minimum is met when it is
met on every GPU it uses; once granted, the promise holds on any GPU it uses later too.
"""

from __future__ import annotations

import dataclasses
import logging
from fractions import Fraction
from typing import Dict, Iterable, List, Optional

from pump.config import budget_terms, parse_size
from pump.stats import human_bytes
from pumpd.telemetry import nvml_indices

log = logging.getLogger("pumpd")

BLOCK = 2 << 20        # the shim's block: budgets are whole blocks
NOTHING = 1            # the budget published for a grant of 0: a plan's 0 means "no cap"
LOG_EACH_UP_TO = 4      # budget changes logged one line each; past it, one line for the rebalance

# Where a job's budget comes from (Job.status()'s "budget_source").
FIXED_SOURCES = ("set", "config")      # op set, or the job's config or flag
ARBITER, DEFAULT = "arbiter", "default"


@dataclasses.dataclass(frozen=True)
class Claim:
    """One job's terms for one GPU's pool, as :func:`divide` takes them."""

    key: str                          # the job's id
    share: float = 1.0                # > 0
    min_bytes: int = 0
    max_bytes: Optional[int] = None   # None: no cap
    priority: int = 0
    arrival: float = 0.0              # earlier first among equal priorities
    fixed_bytes: Optional[int] = None  # a fixed budget: not divided, taken off the pool
    promised: bool = False            # its minimum was granted before: a promise kept


@dataclasses.dataclass(frozen=True)
class Grant:
    budget: int                       # bytes
    state: str                        # "fixed", "met" (its minimum is granted) or "unmet"


def divide(pool: int, claims: Iterable[Claim]) -> Dict[str, Grant]:
    """The budgets of the claims on a pool of ``pool`` bytes (see the module's text)."""
    claims = list(claims)
    grants = {c.key: Grant(c.fixed_bytes, "fixed") for c in claims if c.fixed_bytes is not None}
    available = max(pool - sum(g.budget for g in grants.values()), 0)
    shared = [c for c in claims if c.fixed_bytes is None]

    promised = sum(c.min_bytes for c in shared if c.promised)
    met = {c.key for c in shared if c.promised or c.min_bytes == 0}
    blocked = False
    for c in sorted((c for c in shared if c.key not in met), key=lambda c: (-c.priority, c.arrival, c.key)):
        if not blocked and promised + c.min_bytes <= available:
            promised += c.min_bytes
            met.add(c.key)
        else:
            blocked = True  # strict order: none after a waiting job jumps it

    floors = {c.key: (c.min_bytes if c.key in met else 0) for c in shared}
    levels = _water_fill(available, shared, floors)
    for c in shared:
        rounded = int(levels[c.key] // BLOCK) * BLOCK
        grants[c.key] = Grant(max(rounded, floors[c.key]), "met" if c.key in met else "unmet")
    return grants


def _water_fill(total: int, claims: List[Claim], floors: Dict[str, int]) -> Dict[str, Fraction]:
    """clamp(L * share, floor, max) for each claim, with the level L that makes them add up
    to ``total`` (all at their floors if those exceed it; all at their caps if those fall
    short).  Exact arithmetic: a float level could hand out a byte too many."""
    shares = {c.key: Fraction(c.share) for c in claims}
    caps = {c.key: c.max_bytes for c in claims}

    def level_of(c: Claim, level: Fraction) -> Fraction:
        x = max(level * shares[c.key], Fraction(floors[c.key]))
        return x if caps[c.key] is None else min(x, Fraction(caps[c.key]))

    def filled(level: Fraction) -> Fraction:
        return sum((level_of(c, level) for c in claims), Fraction(0))

    # The sum is piecewise linear in the level, with corners where a claim leaves its
    # floor or reaches its cap: find the last corner at or under the total, then solve
    # on the straight piece after it.
    corners = sorted({Fraction(0)} | {Fraction(floors[c.key]) / shares[c.key] for c in claims}
                     | {Fraction(c.max_bytes) / shares[c.key] for c in claims if c.max_bytes is not None})
    lo, hi = 0, len(corners) - 1
    if filled(corners[0]) >= total:
        return {c.key: level_of(c, corners[0]) for c in claims}
    while lo < hi:  # the last corner whose sum is <= total
        mid = (lo + hi + 1) // 2
        if filled(corners[mid]) <= total:
            lo = mid
        else:
            hi = mid - 1
    corner = corners[lo]
    rising = sum((shares[c.key] for c in claims
                  if floors[c.key] <= corner * shares[c.key]
                  and (caps[c.key] is None or corner * shares[c.key] < caps[c.key])), Fraction(0))
    if rising == 0:  # every claim is at its cap past this corner: the pool is not all needed
        return {c.key: level_of(c, corner) for c in claims}
    level = corner + (total - filled(corner)) / rising
    return {c.key: level_of(c, level) for c in claims}


@dataclasses.dataclass
class Terms:
    """A job's terms for its budget (its config, ``op set``) and what the arbiter made of
    them; kept on the Job and in its state file."""

    fixed_bytes: Optional[int] = None     # [memory] budget (or --budget) as bytes
    fixed_percent: Optional[int] = None   # ... as a percentage of the GPU (the shim resolves it)
    set_bytes: Optional[int] = None       # op set: overrides the config; None: not set
    set_max_bytes: Optional[int] = None   # a user's op set past what jobs.d allows: a cap on the job
    share: float = 1.0
    min_bytes: int = 0
    max_bytes: Optional[int] = None
    priority: int = 0
    gpu_uuids: List[str] = dataclasses.field(default_factory=list)  # the GPUs its processes use
    gpus: List[int] = dataclasses.field(default_factory=list)  # the NVML indices the arbiter counted it on
    promised: bool = False                # the arbiter granted its minimum
    source: Optional[str] = None          # where Job.budget comes from: FIXED_SOURCES, ARBITER, DEFAULT
    state: Optional[str] = None           # the arbiter's "met" or "unmet"; None when not divided

    @classmethod
    def from_request(cls, request: dict) -> "Terms":
        """From a register request's fields (pump-run sends only those set)."""
        return cls(fixed_bytes=request.get("budget") or None, fixed_percent=request.get("budget_percent"),
                   share=request.get("share", 1.0), min_bytes=request.get("min_budget") or 0,
                   max_bytes=request.get("max_budget"), priority=request.get("priority", 0))

    def within(self, allowed: "Terms", pooled: bool) -> "Terms":
        """These terms (a user's register request) held to what the administrator allows.

        ``allowed`` are the terms of the system's jobs.d/NAME.toml (the defaults where it
        says nothing: share 1, priority 0, no minimum, no fixed budget).  A user may ask for
        less than allowed, never more: share, priority and min_budget are cut to the allowed
        ones.  Where a pool is divided (``pooled``), a fixed budget is taken off the pool
        before others are served, so one larger than the allowed fixed budget (of the same
        kind, bytes or percent) is not kept as fixed: bytes become the job's max_budget (a cap
        on itself, divided like any job), a percentage is dropped.  Without a pool a fixed
        budget caps only the job itself and stands.  Root's requests are not held (pumpd)."""
        held = dataclasses.replace(self, share=min(self.share, allowed.share),
                                   priority=min(self.priority, allowed.priority),
                                   min_bytes=min(self.min_bytes, allowed.min_bytes))
        if pooled and self.fixed_bytes is not None and (allowed.fixed_bytes is None
                                                        or self.fixed_bytes > allowed.fixed_bytes):
            held.fixed_bytes = None
            held.max_bytes = self.fixed_bytes if self.max_bytes is None else min(self.max_bytes, self.fixed_bytes)
        if pooled and self.fixed_percent is not None and (allowed.fixed_percent is None
                                                          or self.fixed_percent > allowed.fixed_percent):
            held.fixed_percent = None
        if held != self:
            log.info("terms asked %s held to %s (what jobs.d allows)", self.claimed(), held.claimed())
        return held

    def cap_bytes(self) -> Optional[int]:
        """The most the division may give the job: its max_budget, and a cap its owner set."""
        caps = [c for c in (self.max_bytes, self.set_max_bytes) if c is not None]
        return min(caps) if caps else None

    def set_by_user(self, budget: Optional[int], allowed: "Terms", pooled: bool):
        """A user's op set (not the administrator's), held as a register request is
        (:meth:`within`): a budget jobs.d allows as fixed, or any where no pool is divided,
        is kept as set; a larger one only caps the job's own share of the pool.  None clears."""
        held = Terms(fixed_bytes=budget).within(allowed, pooled)
        self.set_bytes, self.set_max_bytes = held.fixed_bytes, held.max_bytes

    def claimed(self) -> str:
        return (f"share {self.share:g}, priority {self.priority}, min {self.min_bytes}, "
                f"fixed {self.fixed_bytes if self.fixed_percent is None else f'{self.fixed_percent}%'}, "
                f"max {self.max_bytes}")

    @classmethod
    def from_config(cls, cfg) -> "Terms":
        """From a resolved pump.config.JobConfig (the system's jobs.d file, for a shim
        preloaded by hand): as pump-run would have sent them."""
        return cls.from_request(budget_terms(cfg))

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, doc: dict) -> "Terms":
        doc = dict(doc)
        doc.pop("gpu", None)  # an older pumpd's placement: always GPU 0, unknown
        return cls(**doc)


class Arbiter:
    """Divides each GPU's pool among pumpd's jobs and writes each job's budget.

    ``pool`` is pumpd.toml's gpu_pool (bytes "24GiB", or a percentage "90%" of each GPU's
    memory, known only through NVML telemetry); None: no pool, and a job's budget is
    its fixed one, else ``default_budget`` (bytes), else none."""

    def __init__(self, pool: Optional[str] = None, default_budget: Optional[int] = None):
        self.pool = pool
        self.default_budget = default_budget
        self.gpu_memory: Dict[int, int] = {}   # GPU index -> total bytes, from telemetry
        self.gpu_uuids: Optional[List[dict]] = None  # [{"uuid", "index"}] NVML lists; None: no sample yet
        self.pools: Dict[int, dict] = {}       # GPU -> the last division's totals, for status
        self._warned = set()

    def observe_telemetry(self, sample: Optional[dict]) -> bool:
        """Take each GPU's memory and UUID from a telemetry sample; True if any changed."""
        gpus = (sample or {}).get("gpus", [])
        memory = {g["index"]: g["memory_total"] for g in gpus if g.get("memory_total")}
        uuids = [{"uuid": g["uuid"], "index": g["index"]} for g in gpus if g.get("uuid")]
        changed = (memory, uuids) != (self.gpu_memory, self.gpu_uuids)
        self.gpu_memory, self.gpu_uuids = memory, uuids
        return changed

    def placement(self, job) -> List[int]:
        """The NVML indices of the GPUs a job uses, by UUID; [0] where none is known."""
        index_of = nvml_indices(job.terms.gpu_uuids, self.gpu_uuids or [])
        unlisted = [u for u in job.terms.gpu_uuids if u not in index_of]
        # Said only where it matters (a pool) and once telemetry has had its say.
        if unlisted and self.pool is not None and self.gpu_uuids is not None:
            if not self.gpu_uuids:
                self._warn_once("no-uuids", "[budgets] gpu_pool: NVML lists no GPU (no NVML telemetry), so "
                                "the GPUs jobs use are not known by index: every job counts against GPU 0")
            for uuid in unlisted if self.gpu_uuids else ():
                self._warn_once(("unlisted", uuid), "job %s (%s) uses %s, which NVML does not list (a MIG "
                                "instance?): not counted against any pool%s", job.id, job.name, uuid,
                                "" if index_of else "; the job counts against GPU 0")
        return sorted(set(index_of.values())) or [0]

    def pool_bytes(self, gpu: int) -> Optional[int]:
        if self.pool is None:
            return None
        if not self.pool.endswith("%"):
            return parse_size(self.pool)
        total = self.gpu_memory.get(gpu)
        if total is None:
            self._warn_once(("pool", gpu), "[budgets] gpu_pool %s: GPU %d's memory is unknown (no NVML "
                            "telemetry): its jobs are not arbitrated until it is known", self.pool, gpu)
            return None
        return total * int(self.pool[:-1]) // 100

    def apply(self, jobs: Iterable) -> list:
        """Work out every job's budget; return the jobs whose budget, source, state or GPUs
        changed."""
        jobs = list(jobs)
        by_gpu: Dict[int, list] = {}
        for job in jobs:
            for gpu in self.placement(job):
                by_gpu.setdefault(gpu, []).append(job)
        self.pools = {}
        counted: Dict[int, dict] = {}          # GPU -> {job: bytes its division counted for it}
        results: Dict[object, list] = {}       # job -> [(budget, source, state, gpu, pool, members)]
        for gpu, members in sorted(by_gpu.items()):
            pool = self.pool_bytes(gpu)
            outcome = self._divide(gpu, pool, members) if pool is not None else self._undivided(members)
            counted[gpu] = {job: result[3] for job, result in outcome.items()}
            for job, result in outcome.items():
                results.setdefault(job, []).append((*result[:3], gpu, pool, len(members)))
        changed, changes = [], []
        for job in jobs:
            mine = results[job]
            budget, source, state, gpu, pool, members = min(mine, key=_tightness)
            if any(r[2] == "unmet" for r in mine):
                state = "unmet"
            if state == "met" and job.terms.min_bytes:
                job.terms.promised = True
            gpus = [r[3] for r in mine]
            if (job.budget, job.terms.source, job.terms.state, job.terms.gpus) != (budget, source, state, gpus):
                changes.append((job, job.budget, budget, source, state, gpu, pool, members))
                job.budget, job.terms.source, job.terms.state, job.terms.gpus = budget, source, state, gpus
                changed.append(job)
        self._log_changes(changes)
        for gpu, totals in self.pools.items():
            # What each job holds of this pool: its grant here, or less where another GPU's
            # division gave it less (its one budget is the least of its grants).
            totals["assigned_bytes"] = sum(
                min(n, job.budget) if job.terms.source == ARBITER else n for job, n in counted[gpu].items())
        return changed

    def _fixed(self, job):
        """(bytes or None, source) of a job's fixed budget, or None if it has none."""
        t = job.terms
        if t.set_bytes:
            return t.set_bytes, "set"
        if t.fixed_bytes:
            return t.fixed_bytes, "config"
        if t.fixed_percent:
            return None, "config"  # the shim resolves a percentage itself: pumpd publishes none
        return None

    def _undivided(self, jobs) -> dict:
        """{job: (budget, source, state, bytes counted)} where a GPU has no pool."""
        outcome = {}
        for job in jobs:
            fixed = self._fixed(job)
            if fixed is not None:
                outcome[job] = (*fixed, None, 0)
            elif job.terms.set_max_bytes:  # its owner's cap holds while a pool cannot be divided
                outcome[job] = (min(self.default_budget or job.terms.set_max_bytes, job.terms.set_max_bytes),
                                "set", None, 0)
            elif self.default_budget:
                outcome[job] = (self.default_budget, DEFAULT, None, 0)
            else:
                outcome[job] = (None, None, None, 0)
        return outcome

    def _divide(self, gpu: int, pool: int, jobs) -> dict:
        """{job: (budget, source, state, bytes counted against the pool)}: one GPU's division."""
        claims, fixed_of = [], {}
        for job in jobs:
            t = job.terms
            fixed = self._fixed(job)
            counted = None
            if fixed is not None:
                counted = fixed[0]
                if counted is None:  # a percentage: counted where the GPU's memory is known
                    total = self.gpu_memory.get(gpu)
                    counted = total * t.fixed_percent // 100 if total else 0
                    if not total:
                        self._warn_once(("percent", job.id), "job %s (%s): budget %d%% is not counted "
                                        "against GPU %d's pool: its memory is unknown (no NVML telemetry)",
                                        job.id, job.name, t.fixed_percent, gpu)
                fixed_of[job.id] = (*fixed, counted)
            claims.append(Claim(job.id, t.share, t.min_bytes, t.cap_bytes(), t.priority, job.created,
                                counted, t.promised))
        grants = divide(pool, claims)
        outcome = {}
        for job in jobs:
            grant = grants[job.id]
            if job.id in fixed_of:
                budget, source, counted = fixed_of[job.id]
                outcome[job] = (budget, source, None, counted)
            else:
                outcome[job] = (grant.budget or NOTHING, ARBITER, grant.state, grant.budget)
        assigned = sum(g.budget for g in grants.values())
        # Counts only: status shows every user the pools, but no other user's job.
        self.pools[gpu] = {"gpu": gpu, "pool_bytes": pool, "assigned_bytes": assigned, "jobs": len(jobs),
                           "unmet": sum(g.state == "unmet" for g in grants.values())}
        if assigned > pool:
            self._warn_once(("over", gpu, assigned), "GPU %d's pool (%s) is over-committed: fixed budgets "
                            "and promised minimums come to %s", gpu, human_bytes(pool), human_bytes(assigned))
        return outcome

    def _log_changes(self, changes):
        """A line per job whose budget changed, or past LOG_EACH_UP_TO of them one line for the
        rebalance (256 registers wrote 22,472 lines when each rebalance logged every job)."""
        if len(changes) <= LOG_EACH_UP_TO:
            for change in changes:
                self._log_change(*change)
            return
        unmet = sum(change[4] == "unmet" for change in changes)
        pools = sorted({(gpu, pool, members) for *_, gpu, pool, members in changes if pool is not None})
        log.info("rebalance: %d jobs' budgets changed%s%s (pump status lists them)", len(changes),
                 f", {unmet} below their min_budget until it fits" if unmet else "",
                 "".join(f"; GPU {gpu}'s pool of {human_bytes(pool)} among {members} jobs"
                         for gpu, pool, members in pools))

    def _log_change(self, job, was_bytes, budget, source, state, gpu, pool, members):
        shown = "none" if budget is None else human_bytes(budget)
        was = "none" if was_bytes is None else human_bytes(was_bytes)
        if state == "unmet":
            log.warning("job %s (%s): its min_budget %s does not fit GPU %d's pool (%s, %d job%s): "
                        "budget %s -> %s until it does", job.id, job.name, human_bytes(job.terms.min_bytes),
                        gpu, human_bytes(pool), members, "s" if members != 1 else "", was, shown)
        elif source == ARBITER:
            log.info("job %s (%s): budget %s -> %s (arbiter: GPU %d's pool of %s among %d job%s)",
                     job.id, job.name, was, shown, gpu, human_bytes(pool), members, "s" if members != 1 else "")
        else:
            log.info("job %s (%s): budget %s -> %s (%s)", job.id, job.name, was, shown, source or "no budget")

    def _warn_once(self, key, message, *args):
        if key not in self._warned:
            self._warned.add(key)
            log.warning(message, *args)


def _tightness(result) -> float:
    """Orders one job's (budget, ...) results on its GPUs: the least budget first, none
    (no cap) last."""
    return float("inf") if result[0] is None else result[0]
