"""pumpd's long-running tasks never end on an error: each runs supervised.

A task's body that raises something unexpected (a bug, a full disk, a client's
descriptor gone bad) is logged, rate-limited, and started again after a pause,
so that no single fault stops ingest, liveness or accepting for every job. And
they all end when pumpd stops (stop_tasks), even one that let a cancellation
pass.
"""

import asyncio
import logging
import time

from pumpd.limits import ERROR_LOG_INTERVAL, ERROR_RETRY_PAUSE

log = logging.getLogger("pumpd")


class RateLimitedLog:
    """Unexpected errors: logged with their traceback at most once per interval per place."""

    def __init__(self, interval: float = ERROR_LOG_INTERVAL):
        self.interval, self.last, self.suppressed = interval, {}, {}

    def error(self, where: str, exc: BaseException):
        """A bug or a fault nobody foresaw: with its traceback."""
        more = self._due(where)
        if more is not None:
            log.error("%s: unexpected %s: %s (pumpd goes on)%s", where, exc.__class__.__name__, exc,
                      f"; {more} more since the last report" if more else "", exc_info=exc)

    def warning(self, where: str, text: str):
        """A fault foreseen (out of descriptors, a user at a cap): one line."""
        more = self._due(where)
        if more is not None:
            log.warning("%s: %s%s", where, text, f" ({more} more since the last report)" if more else "")

    def _due(self, where: str):
        """None if where was reported within the interval, else how many were not since."""
        now = time.monotonic()
        if now - self.last.get(where, -self.interval) < self.interval:
            self.suppressed[where] = self.suppressed.get(where, 0) + 1
            return None
        self.last[where] = now
        return self.suppressed.pop(where, 0)


async def supervised(name: str, body, errors: RateLimitedLog):
    """Run ``await body()`` until it returns; start it again whenever it raises."""
    while True:
        try:
            return await body()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - whatever it was, the daemon serves on
            errors.error(name, exc)
            await asyncio.sleep(ERROR_RETRY_PAUSE)


STOP_ROUNDS = 20          # cancellations a task gets before pumpd stops without it
STOP_ROUND_SECONDS = 0.5  # ... each given this long to end


async def stop_tasks(tasks) -> list:
    """Cancels the tasks and waits for them to end; returns those that never did (said once).

    A task's cancellation can be lost: before Python 3.12, asyncio.wait_for returns its inner
    future's result when that future completes as the waiting task is cancelled
    (python/cpython#86296), so a loop around it goes on. A shared pumpd stuck so at its idle exit
    kept its lock and socket with accepting stopped: every later pump-run of the user waited
    15 s and ran without a daemon. So each task still running is cancelled again, a few times."""
    pending = set(tasks)
    for _ in range(STOP_ROUNDS):
        for t in pending:
            t.cancel()
        _, pending = await asyncio.wait(pending, timeout=STOP_ROUND_SECONDS)
        if not pending:
            return []
    log.error("tasks that would not stop: %s: pumpd stops without them", ", ".join(t.get_name() for t in pending))
    return list(pending)
