"""pumpd's long-running tasks never end on an error: each runs supervised.

A task's body that raises something unexpected (a bug, a full disk, a client's
descriptor gone bad) is logged, rate-limited, and started again after a pause,
so that no single fault stops ingest, liveness or accepting for every job.
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
