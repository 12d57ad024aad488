"""What a lookahead session's ring said while its plan was being made (issue 45 item 1).

pumpd reads every ring as it fills, planning or not: the trace and the session's tables
get every record at once, and a busy job's ring never waits (and drops) for a plan being
made for it or for someone else.  The planner learns the batches read meanwhile with its
next turn, all of them in one pass (one layout made, not one per batch).

What waits is bounded: past BACKLOG_RECORDS records for one session, or its uid's share of
PENDING_PER_UID_MAX (limits.py), a batch's launches are not kept for the planner (counted
in `planner_skipped`).  Its allocations and frees are: a planner that missed an allocation
would not know the blocks of every later launch on it.  They fold into one net change
(frees of what the planner knew, then the allocations live at its end), so what a flood of
skipped batches makes pumpd hold stays within the allocation tables' own caps.
"""

from pump import channel

BACKLOG_RECORDS = 1 << 17  # records of one session waiting for the planner (two default rings)


class Backlog:
    """One session's batches waiting for the planner, in ring order."""

    def __init__(self, quota):
        self.quota = quota           # the session's share of its uid's caps (limits.Quota)
        self.batches = []            # whole batches, and net changes standing for skipped ones
        self.records = 0             # records in the whole batches
        self.skipped = 0             # records whose launches the planner never saw
        self.net = None              # the net change of skipped batches since the last whole one

    def __bool__(self) -> bool:
        return bool(self.batches) or self.net is not None

    def add(self, batch: channel.Batch):
        if self.records + batch.records <= BACKLOG_RECORDS and self.quota.take("pending_records", batch.records):
            self.net = None
            self.batches.append(batch)
            self.records += batch.records
            return
        self.skipped += batch.records
        if self.net is None:
            self.net = NetChange()
            self.batches.append(self.net)
        self.net.fold(batch)

    def take(self) -> list:
        """The batches for the planner (channel.Batch each), oldest first; the backlog empties."""
        batches = [b.batches() if isinstance(b, NetChange) else [b] for b in self.batches]
        self.quota.give_back("pending_records", self.records)
        self.batches, self.records, self.net = [], 0, None
        return [batch for part in batches for batch in part]

    def clear(self):
        self.take()


class NetChange:
    """Skipped batches' allocations and frees as one change: the frees of allocations made
    before it, and the allocations live at its end (a base freed and allocated again is in
    both, as the planner needs it: the old one gone, the new one there)."""

    def __init__(self):
        self.frees = {}   # base -> size, freed (allocated before this change)
        self.allocs = {}  # base -> size, allocated here and live

    def fold(self, batch: channel.Batch):
        for base, size in batch.allocs:
            self.allocs[base] = size
        for base, size in batch.frees:  # decode() keeps a free only if no later alloc took its base
            if self.allocs.pop(base, None) is None:
                self.frees[base] = size

    def batches(self) -> list:
        """Two batches without launches: the frees first, then the allocations."""
        return [channel.Batch(frees=list(self.frees.items())), channel.Batch(allocs=list(self.allocs.items()))]
