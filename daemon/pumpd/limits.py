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
# All users' entries of each of those four tables together (Tally's global cap): with caps per
# user alone, pumpd's memory grew with the number of users (memory_at_most). Twice one user's.
TABLES_MAX = {"functions": 2 * FUNCTIONS_PER_UID_MAX, "allocations": 2 * ALLOCATIONS_PER_UID_MAX,
              "planned_blocks": 2 * PLANNED_BLOCKS_PER_UID_MAX, "pending_records": 2 * PENDING_PER_UID_MAX}
# ---- the lookahead planner's time (pumpd/planner.py, pumpd/scheduler.py) ----
PLAN_DEADLINE_SECONDS = 5.0      # the planner's CPU time for one session's turn (learning a
                                 # batch, planning an iteration); a learned GPT-2 step's plan takes
                                 # well under a second (see docs/daemon-limits.md)
PLAN_OVERRUNS_MAX = 3            # turns of one process that meet it before it falls back to
                                 # the launch rule; each one doubles its wait for the next turn

# ---- the lookahead planner's tables ----
# One planner process learns every user's lookahead processes, so what its tables hold is held
# for all users together: each turn gives the process planned its share (planner_share), an equal
# part for each user with lookahead processes and an equal part of that for each of the user's
# processes, never more than one process's own most (the defaults in pump/foresight.py,
# pump/iteration.py, pumpd/lookahead.py). A share made smaller by another user's first process
# holds from the next turn on; what a smaller share leaves out is forgotten, oldest first, and
# counted (planner_trimmed) where it is a launch.
PLANNER_TABLES_MAX = {
    "refs": 1 << 22,          # 2 MiB-block references the launch histories hold
    "launches": 1 << 20,      # launches the iteration detectors keep (an iteration of up to half of
                              # its share is learned)
    "cached_keys": 1 << 17,   # launch keys whose blocks are cached
    "freed_blocks": 1 << 19,  # freed blocks the histories keep (bert-base frees ~19,000 a step)
    "kernel_keys": 1 << 17,   # launch keys with GPU-timed kernel times
    "window": 1 << 18,        # launch intervals kept for each key's median
}


# The planner's address space: past it a turn meets a MemoryError, which ends that turn as an
# overrun (pumpd and every other plan go on). Above what its tables may hold at every cap
# (memory_at_most's planner part, with room for the interpreter's and numpy's mappings), below
# the unit's MemoryMax=4G, so that the cgroup's OOM killer is a backstop only.
PLANNER_ADDRESS_SPACE_BYTES = 3 << 30


def planner_share(owners: int, processes: int) -> dict:
    """What one lookahead process's tables may hold in its turn: table -> entries, with `owners`
    users having lookahead processes and its own user `processes` of them."""
    return {table: max(1, most // max(1, owners) // max(1, processes)) for table, most in PLANNER_TABLES_MAX.items()}


# ---- what pumpd.toml's [limits] may set (pump/config_schema.py): name -> (the global here,
# the most it may be: a user's cap no more than all users', so that neither the descriptors nor
# the memory the caps let pumpd hold can grow) ----
ADJUSTABLE = {
    "connections_per_user": ("CONNECTIONS_PER_UID_MAX", CONNECTIONS_MAX - ROOT_RESERVE),
    "sessions_per_user": ("SESSIONS_PER_UID_MAX", SESSIONS_MAX - ROOT_RESERVE),
    "jobs_per_user": ("JOBS_PER_UID_MAX", JOBS_MAX - ROOT_RESERVE),
    "kernel_names_per_user": ("FUNCTIONS_PER_UID_MAX", TABLES_MAX["functions"]),
    "allocations_per_user": ("ALLOCATIONS_PER_UID_MAX", TABLES_MAX["allocations"]),
    "planned_blocks_per_user": ("PLANNED_BLOCKS_PER_UID_MAX", TABLES_MAX["planned_blocks"]),
    "pending_records_per_user": ("PENDING_PER_UID_MAX", TABLES_MAX["pending_records"]),
    "plan_overruns": ("PLAN_OVERRUNS_MAX", 100),
    "plan_deadline_s": ("PLAN_DEADLINE_SECONDS", 60.0),
}


def configure(settings: dict, where: str = "pumpd.toml"):
    """Apply [limits] (name -> value, checked for type by the schema) before pumpd starts
    serving; ValueError naming every value past what it may be."""
    problems = [f"{where}: [limits] {name} = {value}: at most {ADJUSTABLE[name][1]:,} "
                f"({'the cap for all users' if name.endswith('_per_user') else 'allowed'})"
                for name, value in settings.items() if value > ADJUSTABLE[name][1]]
    if problems:
        raise ValueError("\n".join(problems))
    for name, value in settings.items():
        globals()[ADJUSTABLE[name][0]] = value


# ---- memory: what the caps above let pumpd and its planner hold ----
# Bytes an entry of each table costs at the peak while it is made, measured through the code
# that keeps it (tests/test_daemon_memory.py holds each measurement under its figure, which is
# about 1.25 times what it measured), and the fixed costs beside them (RSS, measured there too).
BYTES_PER = {"functions": 1500, "allocations": 200, "pending_records": 280, "planned_blocks": 80,
             "refs": 56, "launches": 330, "cached_keys": 780, "freed_blocks": 64, "kernel_keys": 1060,
             "window": 100}
PUMPD_BASE_BYTES = 64 << 20      # pumpd with no client (45 MiB RSS measured)
PLANNER_BASE_BYTES = 48 << 20    # the planner process with no session (35 MiB)
SESSION_BYTES = 24 << 10         # a session in pumpd beyond its tables (9 KiB measured, and the
                                 # ring's and plan's header pages pumpd makes)
PLANNER_PROCESS_BYTES = 32 << 10  # a lookahead process in the planner beyond its tables (21 KiB)
CONNECTION_BYTES = 80 << 10      # a connection with a whole message unread (at most 64 KiB)
PARSE_BYTES = 8 << 20            # one message decoded at a time (JSON nested deep in 64 KiB)


def memory_at_most(sessions: int = SESSIONS_MAX, connections: int = CONNECTIONS_MAX) -> int:
    """The most memory pumpd and its planner hold, sessions and connections at these counts (all
    lookahead), every table full: what must fit the unit's MemoryMax with room to spare.
    Shared memory is the jobs' (pump/channel.py: the shim makes its plan's pages, pumpd reads
    rings with pread), but for the header pages in SESSION_BYTES."""
    from pumpd.backlog import BACKLOG_RECORDS
    from pumpd.tracing import QUEUE_BYTES_ALL_MAX
    tables = sum(TABLES_MAX[t] * BYTES_PER[t] for t in ("functions", "allocations", "pending_records"))
    # The planner's: the histories' references twice (the key cache and the history may each
    # hold tuples the other let go), the blocks of every allocation it was given room for.
    planner = sum(most * BYTES_PER[t] * (2 if t == "refs" else 1) for t, most in PLANNER_TABLES_MAX.items())
    planner += TABLES_MAX["planned_blocks"] * BYTES_PER["planned_blocks"]
    turn = 2 * BACKLOG_RECORDS * BYTES_PER["pending_records"]  # a turn's batches, pickled and unpickled
    return (PUMPD_BASE_BYTES + tables + sessions * SESSION_BYTES + connections * CONNECTION_BYTES + PARSE_BYTES
            + QUEUE_BYTES_ALL_MAX + turn
            + PLANNER_BASE_BYTES + planner + sessions * PLANNER_PROCESS_BYTES + turn)


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
    """Per-uid counts of one kind of table entry, capped per uid and for all uids together; what
    did not fit is counted in ``dropped`` and logged once per uid."""

    def __init__(self, what: str, per_uid_max: int, global_max: int = None):
        self.what, self.per_uid_max = what, per_uid_max
        self.global_max = per_uid_max if global_max is None else global_max
        self.held = {}       # uid -> entries held
        self.total = 0       # all uids' entries held
        self.dropped = {}    # uid -> entries refused
        self.told = set()    # uids already logged

    def take(self, uid: int, n: int) -> int:
        """How many of n more entries uid may keep (the rest are counted as dropped)."""
        held = self.held.get(uid, 0)
        granted = max(0, min(n, self.per_uid_max - held, self.global_max - self.total))
        self.held[uid] = held + granted
        self.total += granted
        if granted < n:
            self.dropped[uid] = self.dropped.get(uid, 0) + n - granted
            if uid not in self.told:
                self.told.add(uid)
                mine = held + granted >= self.per_uid_max
                log.warning("uid %d holds %d %s, %s: further ones are dropped (counted in %s_dropped)",
                            uid, held + granted, self.what,
                            "the most kept per user" if mine else f"and all users {self.total}, the most kept",
                            self.what)
        return granted

    def give_back(self, uid: int, n: int):
        n = min(n, self.held.get(uid, 0))
        self.held[uid] = self.held.get(uid, 0) - n
        self.total -= n


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
    """The tallies of the tables ring records grow (one set per daemon), per user and in all."""
    per_uid = {"functions": FUNCTIONS_PER_UID_MAX, "allocations": ALLOCATIONS_PER_UID_MAX,
               "planned_blocks": PLANNED_BLOCKS_PER_UID_MAX, "pending_records": PENDING_PER_UID_MAX}
    return {what: Tally(what, most, TABLES_MAX[what]) for what, most in per_uid.items()}
