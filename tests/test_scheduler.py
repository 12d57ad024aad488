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
