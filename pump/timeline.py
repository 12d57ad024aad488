"""Timelines as Chrome Trace Event JSON (the JSON object format, with "traceEvents" and
"displayTimeUnit"), which ui.perfetto.dev and chrome://tracing open, and their PNG rendering.

One writer serves `pump trace export --perfetto` (a recorded job, pump/trace_export.py) and
`pump simulate --timeline` (a modelled step, pump/simulate/timeline.py).  Events are written
to the file as they are made, so a long trace never sits in memory as dicts; at most
`max_events` timed events are written (metadata events naming processes and threads are
not counted), and from the first one that does not fit every later one is left out, so the
file holds the trace's beginning whole and says where it was cut.

Conventions (what Perfetto's JSON importer reads): timestamps and durations in microseconds,
floats rounded to the nanosecond (Perfetto keeps integer nanoseconds); integer pids and tids;
complete slices ("X") on one (pid, tid) track nest, never overlap in part; spans that do
overlap are async begin/end pairs ("b"/"e") matched by (cat, id, name); counters ("C") carry
numbers, and Perfetto names each track "<name> <arg>".
"""

import gzip
import json

from pump import outfile

DEFAULT_MAX_EVENTS = 2_000_000


class Timeline:
    """A Chrome Trace Event JSON file being written to `out` (a binary file object)."""

    def __init__(self, out, max_events: int = DEFAULT_MAX_EVENTS):
        self.out = out
        self.max_events = max_events
        self.written = 0        # timed events written
        self.left_out = 0       # timed events not written: past max_events
        self.first_left_out_us = None
        self._next_id = 1
        self._first = True
        self._put(b'{"displayTimeUnit":"ms","traceEvents":[\n')

    # ---- writing ----
    def _put(self, data: bytes):
        self.out.write(data)

    def _event(self, event: dict):
        self._put((b"" if self._first else b",\n") + json.dumps(event, separators=(",", ":")).encode())
        self._first = False

    def _timed(self, *events) -> bool:
        """Write these events together, or none of them (a begin is never left without its end)."""
        if self.left_out or self.written + len(events) > self.max_events:
            if not self.left_out:
                self.first_left_out_us = events[0]["ts"]
            self.left_out += len(events)
            return False
        for e in events:
            self._event(e)
        self.written += len(events)
        return True

    # ---- metadata ----
    def name_process(self, pid: int, name: str, labels: str = None, sort_index: int = None):
        self._event({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": name}})
        if labels:
            self._event({"ph": "M", "name": "process_labels", "pid": pid, "tid": 0, "args": {"labels": labels}})
        if sort_index is not None:
            self._event({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0,
                         "args": {"sort_index": sort_index}})

    def name_thread(self, pid: int, tid: int, name: str):
        self._event({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": name}})
        self._event({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid, "args": {"sort_index": tid}})

    # ---- timed events; ts and end in microseconds ----
    def slice(self, pid: int, tid: int, cat: str, name: str, ts: float, end: float, args: dict = None):
        """A complete slice ("X") from ts to end on the (pid, tid) track."""
        start, stop = us(ts), us(end)
        e = {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": start, "dur": us(stop - start)}
        if args:
            e["args"] = args
        return self._timed(e)

    def instant(self, pid: int, tid: int, cat: str, name: str, ts: float, args: dict = None,
                scope: str = "t"):
        """An instant ("i"): on the thread's track (scope "t") or across the process ("p")."""
        e = {"ph": "i", "s": scope, "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": us(ts)}
        if args:
            e["args"] = args
        return self._timed(e)

    def counter(self, pid: int, name: str, ts: float, **values):
        """A counter sample ("C"): one track per value, "<name> <key>" in Perfetto."""
        return self._timed({"ph": "C", "name": name, "pid": pid, "tid": 0, "ts": us(ts), "args": values})

    def span(self, pid: int, tid: int, cat: str, name: str, ts: float, end: float, args: dict = None):
        """An async span: a "b"/"e" pair with an id of its own, for spans that overlap."""
        ident, self._next_id = self._next_id, self._next_id + 1
        begin = {"ph": "b", "cat": cat, "name": name, "id": ident, "pid": pid, "tid": tid, "ts": us(ts)}
        if args:
            begin["args"] = args
        return self._timed(begin, {"ph": "e", "cat": cat, "name": name, "id": ident, "pid": pid, "tid": tid,
                                   "ts": us(max(ts, end))})

    def close(self, notes: dict) -> str:
        """End the document with `notes` (and the cut, if any) under "otherData"; returns the
        line that says what was cut, or ""."""
        cut = ""
        if self.left_out:
            cut = (f"truncated at {self.max_events} events: {self.left_out} events from "
                   f"{self.first_left_out_us / 1e3:.3f} ms on were left out (--max-events)")
            notes = dict(notes, truncated=cut)
        self._put(b"\n],\n" + json.dumps({"otherData": notes}, indent=1)[1:-1].encode() + b"}\n")
        self.out.close()
        return cut


def us(value: float) -> float:
    """Microseconds rounded to the nanosecond: what Perfetto keeps, and shorter to write."""
    return round(float(value), 3)


def open_output(path: str):
    """The output file, opened for writing now (so a path that cannot be written is found before
    any work is done), gzip-compressed where the name ends in .gz; OSError says why not."""
    return outfile.open_output(path, compress=str(path).endswith(".gz"))


def load(path: str) -> dict:
    """A Chrome Trace Event JSON document (gzip or not); the array format is taken as its events."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    doc = json.loads(data)
    return {"traceEvents": doc} if isinstance(doc, list) else doc

