"""The lines pumpd logs because of what a user did (a bad message, a register, a session's
ignored record), bounded per user: journald rate-limits a whole unit, so one user's flood of
malformed requests (27,727 lines in 10 s, issue 45) would make it drop every other user's pumpd
lines. Each uid has a token bucket (BURST lines at once, then RATE a second) under a global one;
what a bucket holds back is counted and said in one line for that uid once its bucket refills
(flush(), called by pumpd's timer). Replies to clients are never held back: only the log is.
"""

import collections
import logging
import time

log = logging.getLogger("pumpd")

BURST, RATE = 20, 1.0                  # one uid's lines: 20 at once, then one a second
GLOBAL_BURST, GLOBAL_RATE = 200, 20.0  # every uid's together
UIDS_MAX = 4096                        # uids remembered; past it an idle one is forgotten


class _Bucket:
    __slots__ = ("tokens", "at", "held")

    def __init__(self, tokens: float, at: float):
        self.tokens, self.at, self.held = tokens, at, 0

    def take(self, burst: float, rate: float, now: float) -> bool:
        """Refill for the time since the last look, then spend a token if there is one."""
        self.tokens = min(burst, self.tokens + (now - self.at) * rate)
        self.at = now
        if self.tokens >= 1:
            self.tokens -= 1
            return True
        return False


class UserLog:
    def __init__(self, clock=time.monotonic, burst=BURST, rate=RATE, global_burst=GLOBAL_BURST,
                 global_rate=GLOBAL_RATE, uids_max=UIDS_MAX):
        self.clock, self.burst, self.rate = clock, burst, rate
        self.global_burst, self.global_rate, self.uids_max = global_burst, global_rate, uids_max
        self.buckets = {}                    # uid -> _Bucket
        self.everyone = _Bucket(global_burst, clock())
        self.held_unknown = 0                # lines of uids past uids_max, all held
        self.suppressed = collections.Counter()  # uid -> lines held back since pumpd started
        self.suppressed_unknown = 0          # ... of uids past uids_max

    def info(self, uid: int, fmt: str, *args):
        self.line(uid, logging.INFO, fmt, *args)

    def warning(self, uid: int, fmt: str, *args):
        self.line(uid, logging.WARNING, fmt, *args)

    def line(self, uid: int, level: int, fmt: str, *args):
        now = self.clock()
        bucket = self._bucket(uid, now)
        if bucket is None:
            self.held_unknown += 1
            self.suppressed_unknown += 1
        elif bucket.take(self.burst, self.rate, now) and self.everyone.take(self.global_burst, self.global_rate, now):
            log.log(level, fmt, *args)
        else:
            bucket.held += 1
            if uid in self.suppressed or len(self.suppressed) < self.uids_max:
                self.suppressed[uid] += 1
            else:
                self.suppressed_unknown += 1

    def _bucket(self, uid: int, now: float):
        bucket = self.buckets.get(uid)
        if bucket is not None:
            return bucket
        if len(self.buckets) >= self.uids_max:
            idle = next((u for u, b in self.buckets.items() if not b.held), None)
            if idle is None:
                return None
            del self.buckets[idle]
        bucket = self.buckets[uid] = _Bucket(self.burst, now)
        return bucket

    def flush(self):
        """The timer's look: a uid whose lines were held and whose bucket has a token again gets
        one line saying how many; a uid idle long enough to be full again is forgotten."""
        now = self.clock()
        for uid, bucket in list(self.buckets.items()):
            if bucket.held and bucket.take(self.burst, self.rate, now):
                log.warning("uid %d: %d log line%s suppressed (each user logs at most %d at once, then %g a "
                            "second)", uid, bucket.held, "s" if bucket.held != 1 else "", self.burst, self.rate)
                bucket.held = 0
            elif not bucket.held and min(self.burst, bucket.tokens + (now - bucket.at) * self.rate) >= self.burst:
                del self.buckets[uid]
        if self.held_unknown:
            log.warning("%d log lines of users past the first %d suppressed", self.held_unknown, self.uids_max)
            self.held_unknown = 0


user_log = UserLog()  # pumpd's; a test makes its own with an injected clock
