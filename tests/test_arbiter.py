"""The multi-job arbiter (daemon/pumpd/arbiter.py): its arithmetic alone (shares, minimums,
maximums, priorities, fixed budgets, a pool too small, rounding; properties by hypothesis);
inside pumpd with the fake shim (budgets reach plans and `pump status`, are divided anew
as jobs come and are set, survive a restart); and with real fakecuda jobs under pump-run
and the real shim, whose own counters say what each holds resident."""

import collections
import dataclasses
import json
import pathlib
import signal
import subprocess
import sys
import time

import pytest
from hypothesis import given, settings, strategies as st

from fakeshim import FakeShim
from helpers import PUMP_RUN, clean_env, start_pumpd, stop_pumpd
from pump import protocol
from pumpd.arbiter import BLOCK, Claim, divide
from test_daemon import status, wait_for

MiB = 1 << 20
PUMP = str(pathlib.Path(sys.executable).parent / "pump")


def budgets(pool, *claims):
    return {k: g.budget for k, g in divide(pool, claims).items()}


def states(pool, *claims):
    return {k: g.state for k, g in divide(pool, claims).items()}


# ---- the arithmetic ----

def test_equal_shares_split_the_pool():
    assert budgets(24 * MiB, Claim("a"), Claim("b")) == {"a": 12 * MiB, "b": 12 * MiB}


def test_shares_are_weights():
    assert budgets(24 * MiB, Claim("a", share=1), Claim("b", share=2)) == {"a": 8 * MiB, "b": 16 * MiB}
    assert budgets(24 * MiB, Claim("a", share=0.5), Claim("b", share=1.5)) == {"a": 6 * MiB, "b": 18 * MiB}


def test_a_job_at_its_max_leaves_the_rest_to_the_others():
    assert budgets(24 * MiB, Claim("a", max_bytes=4 * MiB), Claim("b")) == {"a": 4 * MiB, "b": 20 * MiB}


def test_every_job_at_its_max_leaves_the_pool_partly_unassigned():
    assert budgets(24 * MiB, Claim("a", max_bytes=4 * MiB), Claim("b", max_bytes=6 * MiB)) == \
        {"a": 4 * MiB, "b": 6 * MiB}


def test_a_minimum_lifts_a_job_and_the_others_share_the_rest():
    assert budgets(24 * MiB, Claim("a", min_bytes=16 * MiB), Claim("b")) == {"a": 16 * MiB, "b": 8 * MiB}
    # A minimum under the job's share changes nothing.
    assert budgets(24 * MiB, Claim("a", min_bytes=2 * MiB), Claim("b")) == {"a": 12 * MiB, "b": 12 * MiB}


def test_fixed_budgets_are_kept_and_count_against_the_pool():
    grants = divide(24 * MiB, [Claim("f", fixed_bytes=8 * MiB), Claim("a"), Claim("b")])
    assert {k: (g.budget, g.state) for k, g in grants.items()} == \
        {"f": (8 * MiB, "fixed"), "a": (8 * MiB, "met"), "b": (8 * MiB, "met")}
    # Fixed budgets beyond the pool: kept, and nothing is left for the others.
    assert budgets(8 * MiB, Claim("f", fixed_bytes=10 * MiB), Claim("a")) == {"f": 10 * MiB, "a": 0}


def test_budgets_are_whole_blocks_but_never_under_a_minimum():
    # 25 MiB / 2 = 12.5 MiB each: rounded down to 12 MiB; the rest stays in the pool.
    assert budgets(25 * MiB, Claim("a"), Claim("b")) == {"a": 12 * MiB, "b": 12 * MiB}
    # 14 MiB / 2 = 7 MiB: 6 MiB in blocks.
    assert budgets(14 * MiB, Claim("a"), Claim("b")) == {"a": 6 * MiB, "b": 6 * MiB}
    # A minimum that is not whole blocks is granted exactly.
    odd = 5 * MiB + 12345
    assert budgets(6 * MiB, Claim("a", min_bytes=odd), Claim("b")) == {"a": odd, "b": 0}
    # ... and rounding above it goes down to whole blocks, not to the minimum: 7 MiB -> 6 MiB.
    assert budgets(8 * MiB, Claim("a", min_bytes=odd), Claim("b", max_bytes=1 * MiB)) == \
        {"a": 6 * MiB, "b": 0}
    # A share too small for one block gets none.
    assert budgets(24 * MiB, Claim("a", share=1), Claim("b", share=1000))["a"] == 0


def test_a_minimum_that_does_not_fit_waits_with_what_is_left():
    grants = divide(24 * MiB, [Claim("a", min_bytes=16 * MiB, promised=True),
                               Claim("b", min_bytes=16 * MiB, arrival=1)])
    assert {k: (g.budget, g.state) for k, g in grants.items()} == \
        {"a": (16 * MiB, "met"), "b": (8 * MiB, "unmet")}


def test_no_job_is_pushed_under_its_promised_minimum_by_a_higher_priority():
    grants = divide(24 * MiB, [Claim("a", min_bytes=16 * MiB, promised=True, priority=0),
                               Claim("b", min_bytes=16 * MiB, priority=100, arrival=1)])
    assert (grants["a"].budget, grants["a"].state) == (16 * MiB, "met")
    assert grants["b"].state == "unmet"


def test_priority_decides_which_waiting_minimum_is_granted():
    claims = [Claim("low", min_bytes=16 * MiB, priority=0, arrival=0),
              Claim("high", min_bytes=16 * MiB, priority=5, arrival=1)]
    assert states(24 * MiB, *claims) == {"low": "unmet", "high": "met"}
    # Equal priorities: the earlier arrival first.
    assert states(24 * MiB, Claim("x", min_bytes=16 * MiB, arrival=2),
                  Claim("y", min_bytes=16 * MiB, arrival=1)) == {"x": "unmet", "y": "met"}


def test_waiting_minimums_are_granted_in_strict_order():
    # "small" would fit, but "big" (higher priority) waits before it: no job jumps it.
    assert states(24 * MiB, Claim("held", min_bytes=8 * MiB, promised=True),
                  Claim("big", min_bytes=20 * MiB, priority=5),
                  Claim("small", min_bytes=2 * MiB)) == {"held": "met", "big": "unmet", "small": "unmet"}
    # A job that asks no minimum is never kept waiting.
    assert states(24 * MiB, Claim("big", min_bytes=30 * MiB, priority=5), Claim("none"))["none"] == "met"


def test_promised_minimums_beyond_a_shrunk_pool_are_kept():
    assert budgets(16 * MiB, Claim("a", min_bytes=12 * MiB, promised=True),
                   Claim("b", min_bytes=12 * MiB, promised=True)) == {"a": 12 * MiB, "b": 12 * MiB}


def test_an_empty_pool_and_no_claims():
    assert divide(24 * MiB, []) == {}
    assert budgets(0, Claim("a")) == {"a": 0}


def test_a_pool_given_as_a_percentage_waits_for_the_gpu_s_size():
    from pumpd.arbiter import Arbiter, Terms
    from pumpd.jobs import Job
    fixed, shared = Job("j1", "fixed", 0, 1, 0.0, created=1.0), Job("j2", "shared", 0, 2, 0.0, created=2.0)
    fixed.terms, shared.terms = Terms(fixed_percent=25), Terms()
    arbiter = Arbiter("50%", default_budget=1 << 30)
    arbiter.apply([fixed, shared])  # no telemetry yet: not divided; the default applies
    assert (shared.budget, shared.terms.source) == (1 << 30, "default")
    assert arbiter.observe_telemetry({"gpus": [{"index": 0, "memory_total": 80 << 30}]})
    assert arbiter.apply([fixed, shared]) == [shared]
    # 40 GiB of pool, of which the 25% budget (resolved by its shim) counts 20 GiB.
    assert (fixed.budget, fixed.terms.source) == (None, "config")
    assert (shared.budget, shared.terms.source, shared.terms.state) == (20 << 30, "arbiter", "met")
    assert not arbiter.observe_telemetry({"gpus": [{"index": 0, "memory_total": 80 << 30}]})


# ---- properties ----

_sizes = st.integers(min_value=0, max_value=64 * 1024).map(lambda k: k * 64 * 1024)  # up to 4 GiB, 64 KiB steps
_claim = st.fixed_dictionaries({
    "share": st.one_of(st.integers(1, 100), st.floats(0.01, 100, allow_nan=False)),
    "min_bytes": st.one_of(st.just(0), _sizes),
    "max_extra": st.one_of(st.none(), _sizes),
    "priority": st.integers(-3, 3),
    "fixed_bytes": st.one_of(st.none(), st.none(), st.none(), _sizes.filter(bool)),
    "promised": st.booleans(),
})


def _claims(specs):
    return [Claim(str(i), s["share"], s["min_bytes"],
                  None if s["max_extra"] is None else s["min_bytes"] + s["max_extra"],
                  s["priority"], float(i), s["fixed_bytes"], s["promised"]) for i, s in enumerate(specs)]


@settings(max_examples=400, deadline=None)
@given(pool=_sizes, specs=st.lists(_claim, max_size=8))
def test_properties_of_a_division(pool, specs):
    claims = _claims(specs)
    grants = divide(pool, claims)
    assert set(grants) == {c.key for c in claims}
    committed = sum(c.fixed_bytes if c.fixed_bytes is not None else
                    (c.min_bytes if grants[c.key].state == "met" else 0) for c in claims)
    total = sum(g.budget for g in grants.values())
    assert total <= max(pool, committed)          # within the pool, unless minimums alone exceed it
    for c in claims:
        g = grants[c.key]
        if c.fixed_bytes is not None:
            assert (g.budget, g.state) == (c.fixed_bytes, "fixed")
            continue
        if c.promised or c.min_bytes == 0:
            assert g.state == "met"                # a promise is kept
        if g.state == "met":
            assert g.budget >= c.min_bytes         # no job under its granted minimum
        if c.max_bytes is not None:
            assert g.budget <= c.max_bytes
        assert g.budget == c.min_bytes or g.budget % BLOCK == 0
    # The pool is handed out (but for rounding) while some job could take more.
    uncapped = [c for c in claims if c.fixed_bytes is None and
                (c.max_bytes is None or grants[c.key].budget + BLOCK <= c.max_bytes)]
    if uncapped and committed <= pool:
        assert total >= pool - len(claims) * BLOCK


@settings(max_examples=300, deadline=None)
@given(pool=_sizes, specs=st.lists(_claim, min_size=1, max_size=6), which=st.integers(0, 5),
       factor=st.floats(1.0, 50.0, allow_nan=False))
def test_a_larger_share_never_gets_less(pool, specs, which, factor):
    claims = _claims(specs)
    i = which % len(claims)
    bigger = list(claims)
    bigger[i] = dataclasses.replace(claims[i], share=claims[i].share * factor)
    assert divide(pool, bigger)[str(i)].budget >= divide(pool, claims)[str(i)].budget


# ---- inside pumpd (the fake shim's plan is what the real shim reads) ----

@pytest.fixture
def pool_pumpd(tmp_path):
    """A pumpd whose [budgets] gpu_pool is 24 MiB."""
    toml = tmp_path / "pumpd.toml"
    toml.write_text('[budgets]\ngpu_pool = "24MiB"\ndefault_budget = "1GiB"\n')
    path = tmp_path / "pumpd.sock"
    proc = start_pumpd(path, "--config", str(toml), "--admin-socket", str(tmp_path / "admin" / "pumpd.sock"),
                       stderr=subprocess.PIPE, text=True)
    yield str(path), proc
    stop_pumpd(proc)


def _admin(path) -> str:
    return str(pathlib.Path(path).parent / "admin" / "pumpd.sock")


def _register(path, name, **terms):
    """As the administrator, whose terms stand as sent (a user's are held to jobs.d)."""
    with protocol.Client(_admin(path)) as c:
        return c.request({"op": "register", "name": name, "policy": "launch", **terms})["job"]


def _jobs(path):
    return {j["name"]: j for j in status(path)}


def test_pumpd_divides_its_pool_and_publishes_the_budgets(pool_pumpd):
    path, _ = pool_pumpd
    a = FakeShim(path, job=_register(path, "a", share=1))
    b = FakeShim(path, job=_register(path, "b", share=2))
    assert wait_for(lambda: (a.plan.budget_bytes, b.plan.budget_bytes) == (8 * MiB, 16 * MiB))
    jobs = _jobs(path)
    assert (jobs["a"]["budget_bytes"], jobs["a"]["budget_source"], jobs["a"]["budget_state"]) == \
        (8 * MiB, "arbiter", "met")
    assert jobs["b"]["share"] == 2 and (jobs["b"]["gpu_uuids"], jobs["b"]["gpus"]) == ([], [0])
    with protocol.Client(path) as c:
        pools = c.request({"op": "status"})["pools"]
    assert pools == [{"gpu": 0, "pool_bytes": 24 * MiB, "assigned_bytes": 24 * MiB, "jobs": 2, "unmet": 0}]
    # A fixed budget (the administrator's, past jobs.d) is kept and counted: 24 - 6 = 18 MiB left, 6 and 12.
    c_job = FakeShim(path, job=_register(path, "c", budget=6 * MiB))
    assert wait_for(lambda: (a.plan.budget_bytes, b.plan.budget_bytes, c_job.plan.budget_bytes) ==
                    (6 * MiB, 12 * MiB, 6 * MiB))
    assert _jobs(path)["c"]["budget_source"] == "config"
    for shim in (a, b, c_job):
        shim.close()


def test_set_overrides_the_arbiter_and_clearing_it_gives_the_job_back(pool_pumpd):
    path, _ = pool_pumpd
    a = FakeShim(path, job=_register(path, "a"))
    b = FakeShim(path, job=_register(path, "b"))
    assert wait_for(lambda: a.plan.budget_bytes == 12 * MiB)
    admin = _admin(path)  # only the administrator fixes it
    with protocol.Client(admin) as c:
        c.request({"op": "set", "job": a.job, "budget": 20 * MiB})
    assert wait_for(lambda: (a.plan.budget_bytes, b.plan.budget_bytes) == (20 * MiB, 4 * MiB))
    assert _jobs(path)["a"]["budget_source"] == "set"
    with protocol.Client(admin) as c:
        c.request({"op": "set", "job": a.job, "budget": 0})
    assert wait_for(lambda: (a.plan.budget_bytes, b.plan.budget_bytes) == (12 * MiB, 12 * MiB))
    assert _jobs(path)["a"]["budget_source"] == "arbiter"
    a.close()
    b.close()


def test_a_minimum_that_does_not_fit_is_shown_and_logged(pool_pumpd):
    path, proc = pool_pumpd
    a = FakeShim(path, job=_register(path, "a", min_budget=16 * MiB))
    b = FakeShim(path, job=_register(path, "b", min_budget=16 * MiB, priority=100))
    assert wait_for(lambda: (a.plan.budget_bytes, b.plan.budget_bytes) == (16 * MiB, 8 * MiB))
    jobs = _jobs(path)
    assert (jobs["a"]["budget_state"], jobs["b"]["budget_state"]) == ("met", "unmet")
    assert jobs["b"]["min_budget_bytes"] == 16 * MiB and jobs["b"]["priority"] == 100
    a.close()
    b.close()
    stop_pumpd(proc)
    log = proc.stderr.read()
    assert f"job {b.job} (b): its min_budget 16.0 MiB does not fit GPU 0's pool (24.0 MiB, 2 jobs)" in log


def test_a_rebalance_that_changes_many_budgets_is_one_log_line(pool_pumpd):
    """256 registers once wrote 22,472 lines (each rebalance logged every job): past 4 changes a
    rebalance says so in one line."""
    path, proc = pool_pumpd
    shims = []
    for i in range(8):
        shims.append(FakeShim(path, job=_register(path, f"many{i}")))
        assert wait_for(lambda: len({s.plan.budget_bytes for s in shims}) == 1 and shims[-1].plan.budget_bytes)
    for s in shims:
        s.close()
    stop_pumpd(proc)
    lines = proc.stderr.read().splitlines()
    each = [line for line in lines if "budget " in line and " -> " in line and "(arbiter:" in line]
    summaries = [line for line in lines if "rebalance: " in line]
    per_size = collections.Counter(line.split(" among ")[1] for line in each)
    assert summaries and max(per_size.values()) <= 4, (per_size, summaries)   # each rebalance: 4 lines at most
    assert all(" jobs' budgets changed; GPU 0's pool of 24.0 MiB among " in line for line in summaries), summaries


def test_promises_and_terms_survive_a_pumpd_restart(tmp_path):
    toml = tmp_path / "pumpd.toml"
    toml.write_text('[budgets]\ngpu_pool = "24MiB"\n')
    path = str(tmp_path / "pumpd.sock")
    proc = start_pumpd(path, "--config", str(toml), "--admin-socket", _admin(path))
    try:
        a = _register(path, "a", min_budget=16 * MiB)  # its minimum is promised
        proc.kill()
        proc.wait()
        proc = start_pumpd(path, "--config", str(toml), "--admin-socket", _admin(path))
        b = _register(path, "b", min_budget=16 * MiB, priority=100)  # comes later: waits
        jobs = {j["job"]: j for j in status(path)}
        assert (jobs[a]["budget_bytes"], jobs[a]["budget_state"]) == (16 * MiB, "met")
        assert (jobs[b]["budget_bytes"], jobs[b]["budget_state"]) == (8 * MiB, "unmet")
    finally:
        stop_pumpd(proc)


def test_without_a_pool_budgets_are_the_config_s_or_the_default(tmp_path):
    toml = tmp_path / "pumpd.toml"
    toml.write_text('[budgets]\ndefault_budget = "1GiB"\n')
    path = str(tmp_path / "pumpd.sock")
    proc = start_pumpd(path, "--config", str(toml), "--admin-socket", _admin(path))
    try:
        _register(path, "plain", share=3, min_budget=1 << 20)
        _register(path, "fixed", budget=2 << 30)
        _register(path, "percent", budget_percent=50)
        jobs = _jobs(path)
        assert (jobs["plain"]["budget_bytes"], jobs["plain"]["budget_source"]) == (1 << 30, "default")
        assert (jobs["fixed"]["budget_bytes"], jobs["fixed"]["budget_source"]) == (2 << 30, "config")
        # A percentage is the shim's to resolve: pumpd publishes none, and shows it.
        assert (jobs["percent"]["budget_bytes"], jobs["percent"]["budget_percent"]) == (None, 50)
        assert all(j["budget_state"] is None for j in jobs.values())
    finally:
        stop_pumpd(proc)


def test_pump_status_shows_the_budget_s_source_and_the_pool(pool_pumpd, tmp_path):
    path, _ = pool_pumpd
    a = FakeShim(path, job=_register(path, "a", min_budget=16 * MiB))
    b = FakeShim(path, job=_register(path, "b", min_budget=16 * MiB))
    env = dict(clean_env(), PUMP_SOCKET=path, TMPDIR=str(tmp_path))
    out = subprocess.run([PUMP, "status"], env=env, capture_output=True, text=True,
                         cwd="/", timeout=30)
    assert out.returncode == 0, out.stderr
    rows = {line.split()[1]: line for line in out.stdout.splitlines()[1:] if line.startswith("j")}
    assert "16.0 MiB" in rows["a"] and "arbiter" in rows["a"]
    assert "8.0 MiB" in rows["b"] and "arbiter, min unmet" in rows["b"]
    assert "GPU 0: pool 24.0 MiB, 24.0 MiB assigned to 2 jobs (1 waiting for its minimum)" in out.stdout
    doc = json.loads(subprocess.run([PUMP, "status", "--json"], env=env,
                                    capture_output=True, text=True, cwd="/", timeout=30).stdout)
    assert doc["pools"] == [{"gpu": 0, "pool_bytes": 24 * MiB, "assigned_bytes": 24 * MiB, "jobs": 2,
                             "unmet": 1, "daemon": path}]
    a.close()
    b.close()


# ---- real jobs: fakecuda programs under pump-run and the real shim ----

RATE = 20000   # launches per second: an epoch of 1000 launches lasts 50 ms


class RealJob:
    """launch_stream (16 managed allocations of 2 MiB, 32 MiB in all, each launch naming two)
    under pump-run --config, with the job's [memory] terms; runs until stopped."""

    def __init__(self, c_build, socket_path, tmp_path, name, **memory):
        self.name = name
        self.dir = tmp_path / name
        self.dir.mkdir()
        config = self.dir / "job.toml"
        config.write_text(f'[job]\nname = "{name}"\n[prefetch]\nepoch_launches = 1000\n[memory]\n' +
                          "".join(f"{k} = {v!r}\n" for k, v in memory.items()))
        # TMPDIR: where pump-run makes the directory of the shim's counter records.
        env = dict(clean_env(), LD_LIBRARY_PATH=str(c_build / "plain"), TMPDIR=str(self.dir))
        self.proc = subprocess.Popen([PUMP_RUN, "--daemon", "system", "--socket", socket_path,
                                      "--config", str(config), "--", str(c_build / "plain" / "launch_stream"),
                                      "2000000000", str(RATE), "16"],
                                     env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def shim(self) -> dict:
        """The shim's own counters, read live from its record (empty until it has one)."""
        from pump import stats
        records = [r for d in self.dir.glob("pump-run-*") for r in stats.read_dir(d, errors=[])]
        return stats.aggregate(records) if records else {}

    def stop(self) -> int:
        """SIGTERM to pump-run, which hands it to the program; its exit status."""
        self.proc.terminate()
        try:
            self.proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.communicate()
        return self.proc.returncode


def _settled(path, jobs, expected):
    """Every job's budget in status and in its shim is as expected, and what its shim
    holds resident is within it (one 50 ms epoch after a budget shrinks)."""
    by_name = _jobs(path)
    for job in jobs:
        row, shim = by_name.get(job.name), job.shim()
        if row is None or (row["budget_bytes"], row["budget_source"]) != (expected[job.name], "arbiter"):
            return False
        if shim.get("budget_bytes") != expected[job.name] or shim["resident_bytes"] > shim["budget_bytes"]:
            return False
        if row["resident_bytes"] > row["budget_bytes"]:  # the shim's COUNTERS event, twice a second
            return False
    return len(by_name) == len(jobs)


def _stay_under(path, jobs, pool, seconds=1.0):
    """For a while: each job's shim holds within its budget, all together within the pool."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        figures = {job.name: job.shim() for job in jobs}
        for name, f in figures.items():
            assert f["resident_bytes"] <= f["budget_bytes"], (name, f)
        assert sum(f["resident_bytes"] for f in figures.values()) <= pool, figures
        assert sum(f["budget_bytes"] for f in figures.values()) <= pool, figures
        time.sleep(0.05)
    for job in jobs:
        # The budget held by evicting (32 MiB touched, less allowed), and the job ran on.
        f = job.shim()
        assert f["bytes_evicted"] > 0 and f["prefetch_bytes"] > 0 and job.proc.poll() is None, (job.name, f)


def test_arbiter_with_real_jobs(c_build, tmp_path):
    pool = 24 * MiB
    toml = tmp_path / "pumpd.toml"
    (tmp_path / "jobs.d").mkdir()
    (tmp_path / "jobs.d" / "b.toml").write_text("[memory]\nshare = 2\n")  # what b may ask for
    toml.write_text(f'[daemon]\njobs_dir = "{tmp_path / "jobs.d"}"\n[budgets]\ngpu_pool = "24MiB"\n')
    path = str(tmp_path / "pumpd.sock")
    daemon = start_pumpd(path, "--config", str(toml), "--admin-socket", _admin(path))
    jobs = []
    try:
        # Two jobs, budgets from their config files: 1:2 of the pool.
        a = RealJob(c_build, path, tmp_path, "a", share=1)
        b = RealJob(c_build, path, tmp_path, "b", share=2)
        jobs += [a, b]
        assert wait_for(lambda: _settled(path, [a, b], {"a": 8 * MiB, "b": 16 * MiB}), timeout=30), \
            (_jobs(path), a.shim(), b.shim())
        _stay_under(path, [a, b], pool)

        # A third starts: the first two give some back.
        c = RealJob(c_build, path, tmp_path, "c", share=1)
        jobs.append(c)
        assert wait_for(lambda: _settled(path, [a, b, c], {"a": 6 * MiB, "b": 12 * MiB, "c": 6 * MiB}),
                        timeout=30), (_jobs(path), a.shim(), b.shim(), c.shim())
        _stay_under(path, [a, b, c], pool)

        # One ends: its share goes back to the others.
        assert a.stop() == 128 + signal.SIGTERM  # pump-run's status for a command killed by a signal
        assert wait_for(lambda: _settled(path, [b, c], {"b": 16 * MiB, "c": 8 * MiB}), timeout=30), \
            (_jobs(path), b.shim(), c.shim())
        _stay_under(path, [b, c], pool)
        with protocol.Client(path) as client:
            assert client.request({"op": "status"})["pools"] == \
                [{"gpu": 0, "pool_bytes": pool, "assigned_bytes": pool, "jobs": 2, "unmet": 0}]
    finally:
        for job in jobs:
            if job.proc.poll() is None:
                job.stop()
        stop_pumpd(daemon)


@pytest.mark.parametrize("field,value,message", [
    ("share", 0, "register: field 'share' must be a number > 0 and <= 1000000"),
    ("share", True, "register: field 'share' must be a number > 0 and <= 1000000"),
    ("priority", 1001, "register: field 'priority' must be an integer -1000..1000"),
    ("priority", 1.5, "register: field 'priority' must be an integer -1000..1000"),
    ("budget_percent", 0, "register: field 'budget_percent' must be an integer 1..100"),
    ("min_budget", -1, "register: field 'min_budget' must be a byte count (0 .. 2**64-1) or null"),
])
def test_register_refuses_bad_terms(pool_pumpd, field, value, message):
    path, _ = pool_pumpd
    with protocol.Client(path) as c:
        with pytest.raises(protocol.ProtocolError) as exc:
            c.request({"op": "register", "name": "bad", field: value})
        assert str(exc.value) == message
        assert c.request({"op": "status"})["jobs"] == []  # nothing registered; the connection goes on
