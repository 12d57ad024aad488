"""pumpd's fair ingest (daemon/pumpd/scheduler.py): deficit round-robin between owners."""

import time
import types

from pumpd.scheduler import Scheduler
from pumpd.tasks import RateLimitedLog

CHUNK_COST = 0.0005  # seconds each chunk of work takes, whoever's


class Host:
    """Reads a chunk by spinning for CHUNK_COST; a ring never empties."""

    def read_chunk(self, job, session, limit):
        end = time.perf_counter() + CHUNK_COST
        while time.perf_counter() < end:
            pass
        session.ring.tail += limit
        session.ring.header.head = session.ring.tail + 1_000_000
        return limit, None

    def plan_due(self, job, session):
        return False


def session():
    ring = types.SimpleNamespace(header=types.SimpleNamespace(head=1_000_000), tail=0, capacity=1 << 16)
    return types.SimpleNamespace(ring=ring, planning=False, closed=False, lookahead=None, chunk=None)


def test_many_processes_of_one_user_get_one_users_share():
    many = types.SimpleNamespace(uid=1000, sessions={i: session() for i in range(16)})
    one = types.SimpleNamespace(uid=1001, sessions={0: session()})
    scheduler = Scheduler(Host(), RateLimitedLog())
    try:
        for _ in range(200):
            scheduler.run_slice([many, one])
    finally:
        scheduler.stop()
    ratio = scheduler.spent[1000] / scheduler.spent[1001]
    assert 0.7 < ratio < 1.4, dict(scheduler.spent)
    assert scheduler.backlog  # rings that never empty leave work after each slice


def test_the_planner_process_learns_and_comes_back_after_dying():
    """The lookahead planner runs in a child process (pumpd/planner.py): it learns a
    training loop's iteration there, a child that died fails one batch, then a new one
    plans from scratch, and the child ends with the last session."""
    import numpy as np
    import pytest
    from pump import channel
    from pumpd.planner import Planner, PlannerError
    from synthetic_trace import training_trace
    trace, _, _ = training_trace(steps=4, layers=6)
    batch = channel.decode(np.concatenate(trace.records))
    planner = Planner()
    handle = planner.session(1, 64 << 20, 50e9)
    try:
        planned = planner.submit(handle, batch).result(60)
        handle.learned(planned)
        assert handle.period > 0 and handle.fresh and planned.cost > 0
        assert np.count_nonzero(handle.take_layout()[0]["key"]) > 0  # a plan with triggers
        handle.set_bandwidth(25e9)  # the link's rate measured (LINK records): the plan is made at it
        handle.learned(planner.submit(handle, None).result(60))
        assert handle.planned_bandwidth == 25e9
        first = planner.process.pid
        planner.process.kill()
        with pytest.raises(PlannerError, match="ended"):
            planner.submit(handle, batch).result(60)
        planned = planner.submit(handle, batch).result(60)  # a new child, which has not seen the session
        assert planner.process.pid != first and planned.period == handle.period
        handle.close()  # the last session gone: so is the child
        planner.thread.submit(lambda: None).result(60)
        assert planner.process is None
    finally:
        planner.stop()


def test_the_planner_is_the_oom_killers_first_choice():
    """The child planner's oom_score_adj is 1000, so that under the service's MemoryMax a planner
    grown by a hostile user's records is what the OOM killer takes, not pumpd; and the unit goes
    on past an OOM kill (OOMPolicy=continue: systemd's default, stop, would end the service)."""
    import pathlib
    import numpy as np
    from pump import channel
    from pumpd import planner as planning
    from synthetic_trace import training_trace
    unit = (pathlib.Path(__file__).resolve().parents[1] / "scripts" / "pumpd.service").read_text()
    assert "\nOOMPolicy=continue\n" in unit and "\nMemoryMax=2G\n" in unit
    trace, _, _ = training_trace(steps=4, layers=6)
    batch = channel.decode(np.concatenate(trace.records))
    planner = planning.Planner()
    handle = planner.session(1, 64 << 20, 50e9)
    try:
        handle.learned(planner.submit(handle, batch).result(60))
        assert pathlib.Path(f"/proc/{planner.process.pid}/oom_score_adj").read_text().strip() == "1000"
    finally:
        planner.stop()
