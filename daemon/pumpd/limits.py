"""What any one user can make pumpd hold, in one place, and why each value.

pumpd's socket is open to every local user: each resource a request, a
connection or a ring record can make it keep is capped per uid, uid 0's too.  As
dbus-daemon does, the global caps keep a reserve only the administrator (root on
the administrator's socket, pump/admin.py) may use, so that it can still look
(`pump status`) and steer while users sit at their caps.
docs/daemon-limits.md says the same for users.
"""

import logging

from pump.protocol import FDS_MAX

log = logging.getLogger("pumpd")

# ---- connections ----
CONNECTIONS_MAX = 4096           # all users together; each costs pumpd one descriptor
ROOT_RESERVE = 64                # of CONNECTIONS_MAX (and of the descriptors): the administrator's alone
CONNECTIONS_PER_UID_MAX = 512    # a job holds one per process (its shim's session) and
                                 # pump-run one; 512 processes of one user is a large job
INCOMPLETE_PER_UID_MAX = 32      # connections that have not completed a first message: a
                                 # client sends one at once, so more is a flood
# ---- what a connection can make pumpd keep ----
SESSIONS_PER_UID_MAX = 256       # each holds a ring and a plan (two descriptors, 1 MiB)
SESSIONS_MAX = 4096              # all users: 8 Ki descriptors, 4 GiB of rings at most
JOBS_PER_UID_MAX = 256           # each is a state file, a table row, a claim on a pool
JOBS_MAX = 4096                  # all users (root's reserve as for connections)
FUNCTIONS_PER_UID_MAX = 1 << 16  # kernel names kept (up to 1 KiB each): a PyTorch job names a
                                 # few thousand kernels; 64 Ki of them is at most ~70 MiB
ALLOCATIONS_PER_UID_MAX = 1 << 18  # managed allocations tracked live (~100 B each, ~26 MiB)
PLANNED_BLOCKS_PER_UID_MAX = 1 << 19  # 2 MiB blocks a lookahead planner keeps a size for (it
                                 # keeps each for good): 1 TiB of managed memory, ~60 MiB
PENDING_PER_UID_MAX = 1 << 19    # ring records read and waiting for the planner (backlog.py):
                                 # about 100 B each decoded at most, ~50 MiB
# ---- the lookahead planner's time (pumpd/planner.py, pumpd/scheduler.py) ----
PLAN_DEADLINE_SECONDS = 5.0      # the planner's CPU time for one session's turn (learning a
                                 # batch, planning an iteration); a learned GPT-2 step's plan takes
                                 # well under a second (see docs/daemon-limits.md)
PLANNER_REFS_PER_UID_MAX = 1 << 23  # block references the planner's histories hold for one
                                 # user (about 40 bytes each where not shared: ~320 MiB), shared
                                 # out evenly between the user's lookahead processes
PLAN_OVERRUNS_MAX = 3            # turns of one process that meet it before it falls back to
                                 # the launch rule; each one doubles its wait for the next turn

# ---- descriptors: what the caps above let pumpd hold for its clients ----
DESCRIPTORS_PER_CONNECTION = 1 + FDS_MAX  # its socket, and what the message being read carries
                                 # (FDS_MAX per message, checked at each recvmsg; a connection is
                                 # read a message at a time)
DESCRIPTORS_PER_SESSION = 3      # the ring's header mapping and the plan's (mmap keeps a
                                 # descriptor of its own), and the ring's reader (records are
                                 # read with pread: pump/channel.py's Ring says why); the memfds
                                 # themselves go to the shim
DESCRIPTORS_PER_JOB = 1          # its trace file, while pump-run --trace records

# ---- status replies ----
STATUS_PAGE_JOBS = 100           # jobs per status reply: ~600 bytes each, well within a frame

# ---- errors in the daemon's own tasks ----
ERROR_LOG_INTERVAL = 10.0        # seconds: at most one log line per task per interval
ERROR_RETRY_PAUSE = 0.1          # seconds before a task that raised runs again: no spinning


def over_cap(uid: int, mine: int, per_uid_max: int, everyone: int, global_max: int,
             admin: bool = False) -> str:
    """Why one more of something would be too many for uid ("" if it is not): its own
    count against per_uid_max, the global count against global_max less the
    administrator's reserve.  Only the administrator is held to neither."""
    if not admin and mine >= per_uid_max:
        return f"uid {uid} has {mine}, the most allowed per user"
    if everyone >= (global_max if admin else global_max - ROOT_RESERVE):
        return f"pumpd holds {everyone}, the most it takes" + ("" if admin else " (the rest is the administrator's)")
    return ""


def descriptors_at_most(connections: int, sessions: int, jobs: int) -> int:
    """The most descriptors that many connections, sessions and jobs make pumpd hold: for all
    users it must stay well under the service's LimitNOFILE."""
    return (connections * DESCRIPTORS_PER_CONNECTION + sessions * DESCRIPTORS_PER_SESSION
            + jobs * DESCRIPTORS_PER_JOB)


class Tally:
    """Per-uid counts of one kind of table entry with a cap; what did not fit is counted
    in ``dropped`` and logged once per uid."""

    def __init__(self, what: str, per_uid_max: int):
        self.what, self.per_uid_max = what, per_uid_max
        self.held = {}       # uid -> entries held
        self.dropped = {}    # uid -> entries refused
        self.told = set()    # uids already logged

    def take(self, uid: int, n: int) -> int:
        """How many of n more entries uid may keep (the rest are counted as dropped)."""
        held = self.held.get(uid, 0)
        granted = max(0, min(n, self.per_uid_max - held))
        self.held[uid] = held + granted
        if granted < n:
            self.dropped[uid] = self.dropped.get(uid, 0) + n - granted
            if uid not in self.told:
                self.told.add(uid)
                log.warning("uid %d holds %d %s, the most kept per user: further ones are dropped "
                            "(counted in %s_dropped)", uid, self.per_uid_max, self.what, self.what)
        return granted

    def give_back(self, uid: int, n: int):
        self.held[uid] = max(0, self.held.get(uid, 0) - n)


class Quota:
    """What one session holds of its uid's tallies: taken entry by entry as ring records
    come, all given back when the session closes."""

    def __init__(self, uid: int, tallies: dict):
        self.uid, self.tallies = uid, tallies      # what -> Tally
        self.held = dict.fromkeys(tallies, 0)
        self.dropped = dict.fromkeys(tallies, 0)

    def take(self, what: str, n: int = 1) -> bool:
        """n more entries of what, all or none."""
        granted = self.tallies[what].take(self.uid, n)
        if granted == n:
            self.held[what] += n
            return True
        self.tallies[what].give_back(self.uid, granted)
        self.dropped[what] += 1
        return False

    def give_back(self, what: str, n: int = 1):
        n = min(n, self.held[what])
        if n:
            self.held[what] -= n
            self.tallies[what].give_back(self.uid, n)

    def release(self):
        for what, n in self.held.items():
            self.tallies[what].give_back(self.uid, n)
            self.held[what] = 0


def table_tallies() -> dict:
    """The per-uid tallies of the tables ring records grow (one set per daemon)."""
    return {"functions": Tally("functions", FUNCTIONS_PER_UID_MAX),
            "allocations": Tally("allocations", ALLOCATIONS_PER_UID_MAX),
            "planned_blocks": Tally("planned_blocks", PLANNED_BLOCKS_PER_UID_MAX),
            "pending_records": Tally("pending_records", PENDING_PER_UID_MAX)}
