"""A lookahead session's backlog (daemon/pumpd/backlog.py): the batches read while its plan is
made wait for the planner, bounded per session and per uid; past the bounds their launches
are skipped and their allocations and frees kept as one net change."""

import numpy as np

from helpers import channel_record
from pump import channel
from pumpd import backlog
from pumpd.backlog import Backlog
from pumpd.limits import Quota, table_tallies

LAUNCH_RECORDS = 1000


def launches(n=LAUNCH_RECORDS, base=1 << 30) -> channel.Batch:
    return channel.decode(np.concatenate([channel_record("launch", 0, 1, 7 << 4, 0, base)] * n))


def allocs_and_frees(allocs=(), frees=()) -> channel.Batch:
    return channel.Batch(records=1, allocs=list(allocs), frees=list(frees))


def test_batches_wait_in_order_and_give_their_records_back():
    tallies = table_tallies()
    b = Backlog(Quota(1000, tallies))
    first, second = launches(), launches(5)
    b.add(first)
    b.add(second)
    assert b and b.records == LAUNCH_RECORDS + 5 and tallies["pending_records"].held[1000] == LAUNCH_RECORDS + 5
    assert b.take() == [first, second]
    assert not b and b.records == 0 and tallies["pending_records"].held[1000] == 0 and b.skipped == 0


def test_past_the_session_bound_launches_are_skipped_and_allocations_kept(monkeypatch):
    monkeypatch.setattr(backlog, "BACKLOG_RECORDS", 2 * LAUNCH_RECORDS)
    b = Backlog(Quota(1000, table_tallies()))
    kept = [launches(), launches()]
    for batch in kept:
        b.add(batch)
    # Skipped: an allocation made and kept, one made and freed (in a later batch and in the
    # same one), an old one freed, an old one freed and its base allocated again: only what
    # the planner needs to know stays.
    b.add(allocs_and_frees(allocs=[(1 << 40, 4 << 20), (2 << 40, 2 << 20)], frees=[(5 << 40, 2 << 20)]))
    b.add(launches())
    b.add(allocs_and_frees(allocs=[(3 << 40, 8 << 20), (5 << 40, 4 << 20)],
                           frees=[(2 << 40, 2 << 20), (3 << 40, 8 << 20), (4 << 40, 2 << 20)]))
    assert b.skipped == LAUNCH_RECORDS + 2
    taken = b.take()
    assert taken[:2] == kept
    frees, allocs = taken[2:]
    assert frees.launch_function is None and allocs.launch_function is None
    assert sorted(frees.frees) == [(4 << 40, 2 << 20), (5 << 40, 2 << 20)]
    assert sorted(allocs.allocs) == [(1 << 40, 4 << 20), (5 << 40, 4 << 20)]
    after = launches()
    b.add(after)  # room again once taken
    assert b.take() == [after] and b.skipped == LAUNCH_RECORDS + 2


def test_the_uid_bound_holds_across_sessions():
    tallies = table_tallies()
    tallies["pending_records"].per_uid_max = 3 * LAUNCH_RECORDS // 2
    one, two, other = Backlog(Quota(1000, tallies)), Backlog(Quota(1000, tallies)), Backlog(Quota(1001, tallies))
    one.add(launches())
    two.add(launches())  # over uid 1000's share: skipped
    other.add(launches())  # another uid's share is its own
    assert (one.records, two.skipped, other.records) == (LAUNCH_RECORDS, LAUNCH_RECORDS, LAUNCH_RECORDS)
    one.take()
    two.add(launches())  # given back: room again
    assert two.records == LAUNCH_RECORDS
