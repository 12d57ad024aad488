"""pumpd's per-user log bounds (daemon/pumpd/userlog.py), on an injected clock: one user's flood
of lines is held to a burst and then a rate, said in one line when its window closes; another
user's lines go on; a global cap holds many users together (issue 45, finding 4)."""

import logging

import pytest

from pumpd.userlog import UserLog


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


@pytest.fixture
def logged(caplog):
    caplog.set_level(logging.INFO, logger="pumpd")
    return lambda: [r.getMessage() for r in caplog.records]


def test_a_flood_from_one_uid_is_held_and_counted_and_another_uid_goes_on(logged):
    clock = Clock()
    log = UserLog(clock, burst=20, rate=1.0)
    for i in range(1000):
        log.info(1000, "pid %d: bad message", i)
    log.info(1001, "job %s registered", "j1")
    assert len(logged()) == 21 and logged()[-1] == "job j1 registered"
    assert log.suppressed == {1000: 980}  # for the metrics: counted for good, not only until said
    log.flush()                                   # the window has not closed: no token yet
    assert len(logged()) == 21
    clock.now += 1.0
    log.flush()
    assert logged()[-1] == "uid 1000: 980 log lines suppressed (each user logs at most 20 at once, then 1 a second)"
    clock.now += 1.0
    log.info(1000, "pid %d: bad message", 1)       # a token again: said
    assert logged()[-1] == "pid 1: bad message" and len(logged()) == 23


def test_many_uids_together_are_held_to_the_global_cap(logged):
    clock = Clock()
    log = UserLog(clock, burst=20, rate=1.0, global_burst=50, global_rate=10.0)
    for uid in range(200):
        log.info(uid, "uid %d's line", uid)
    assert len(logged()) == 50
    clock.now += 5.0
    log.flush()
    assert len(logged()) == 50 + 150              # each held uid says once what it lost
    assert logged()[-1] == "uid 199: 1 log line suppressed (each user logs at most 20 at once, then 1 a second)"


def test_uids_past_the_cap_are_counted_and_idle_ones_forgotten(logged):
    clock = Clock()
    log = UserLog(clock, burst=2, rate=1.0, uids_max=3)
    for uid in range(3):
        for _ in range(3):
            log.info(uid, "x")                      # each holds one line
    log.info(99, "past the cap")
    assert "past the cap" not in logged() and log.held_unknown == 1
    clock.now += 10
    log.flush()
    assert logged()[-1] == "1 log lines of users past the first 3 suppressed"
    clock.now += 10
    log.flush()                                     # all refilled, nothing held: forgotten
    assert log.buckets == {}
