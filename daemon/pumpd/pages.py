"""`pump status` replies in pages: root with thousands of jobs gets them all.

One reply is one frame (protocol.PAYLOAD_MAX), so a status reply carries the jobs
from the request's offset on, as many as fit (at most limits.STATUS_PAGE_JOBS),
with "total" and "next" (the offset of the next page; null after the last).
"""

from pump import protocol
from pumpd.limits import STATUS_PAGE_JOBS


def status_page(jobs: list, offset: int, pools: list, unsaved=None) -> dict:
    """The status reply for the jobs (in a stable order) from offset on; unsaved: job id ->
    why pumpd could not save its state (shown in its row)."""
    room = protocol.PAYLOAD_MAX - len(protocol.encode({"ok": True, "jobs": [], "pools": pools,
                                                      "total": len(jobs), "next": len(jobs)})) - 64
    page = []
    for job in jobs[offset: offset + STATUS_PAGE_JOBS]:
        row = job.status()
        if unsaved and job.id in unsaved:
            row["unsaved"] = unsaved[job.id]
        room -= len(protocol.encode(row)) - protocol.HEADER.size + 1  # +1: the comma
        if room < 0 and page:
            break
        page.append(row)
    after = offset + len(page)
    return {"ok": True, "jobs": page, "pools": pools, "total": len(jobs),
            "next": after if after < len(jobs) else None}
