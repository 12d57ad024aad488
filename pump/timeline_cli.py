"""What `pump trace export` and `pump simulate --timeline` share on the command line: their
options, and their outputs (the timeline's JSON and its PNG) opened before any work is done,
so a path that cannot be written costs one line and exit status 2, not a finished run."""

import os
import sys

from pump import config, outfile, timeline
from pump.cli_common import die

PROG = "pump"
# Drawing reads the whole timeline back: 42,332 events took 1.7 s and 55 MB more than the
# export alone (bench/traces/gpt2-medium.trace), so this many is a minute and a few GB.
PNG_MAX_EVENTS = 500_000


def _positive(text):
    if not text.isdigit() or int(text) < 1:
        raise config.BadValueError(f"bad value {text!r}; allowed: a whole number of events >= 1")
    return int(text)


def _size(text):
    try:
        return config.parse_size(text)
    except ValueError:
        raise config.BadValueError(f"bad value {text!r}; allowed: {config.SIZE_ALLOWED}") from None


def add_export_parser(sub, handler):
    p = sub.add_parser(
        "export", allow_abbrev=False, help="a trace as a timeline for Perfetto or chrome://tracing",
        description="Write FILE's records as Chrome Trace Event JSON (ui.perfetto.dev, chrome://tracing): per "
                    "process and stream the launch calls, allocations, frees and synchronisations at their "
                    "host times, the shim's resident, prefetched and evicted bytes as counters. Host-side "
                    "times only: without CUPTI the trace does not say when kernels ran on the GPU.")
    p.add_argument("--perfetto", metavar="OUT.json", required=True,
                   help="the timeline to write (gzip-compressed if the name ends in .gz)")
    p.add_argument("--png", metavar="OUT.png", help="also draw the timeline as a PNG (needs matplotlib)")
    p.add_argument("--budget", metavar="SIZE", type=_size,
                   help="draw this budget as a counter (the trace does not record the job's budget)")
    add_max_events(p)
    p.add_argument("file", metavar="FILE", help="a trace file (pump-run --trace, pump trace generate)")
    p.set_defaults(handler=handler)


def add_max_events(p):
    p.add_argument("--max-events", metavar="N", type=_positive, default=timeline.DEFAULT_MAX_EVENTS,
                   help=f"write at most N timeline events, then say where the timeline was cut "
                        f"(default {timeline.DEFAULT_MAX_EVENTS:,})")


class Outputs:
    """The timeline (JSON) and its PNG, opened for writing at once."""

    def __init__(self, what: str, json_path: str, png_path: str, max_events: int):
        self.what, self.json_path, self.png_path = what, json_path, png_path
        self.png = None
        if png_path:
            missing = matplotlib_missing()
            if missing:
                print(f"{PROG}: {what}: no PNG drawn: {missing}", file=sys.stderr)
                self.png_path = None
        self.opened = []
        for path in (json_path, self.png_path):
            if path:
                try:
                    f = timeline.open_output(path) if path == json_path else outfile.open_output(path)
                except OSError as exc:
                    self.abandon()
                    die(PROG, f"{what}: cannot write {path}: {exc.strerror}")
                self.opened.append((path, f))
        self.timeline = timeline.Timeline(self.opened[0][1], max_events)
        if self.png_path:
            self.png = self.opened[1][1]

    def abandon(self):
        """The work failed: close what was opened and remove it."""
        for _path, f in self.opened:
            f.discard()
        self.opened = []

    def finish(self, notes: dict, title: str):
        cut = self.timeline.close(notes)
        if cut:
            print(f"{PROG}: warning: {self.json_path}: {cut}", file=sys.stderr)
        print(f"timeline written: {self.json_path} ({self.timeline.written} events)")
        if self.png is not None and self.timeline.written > PNG_MAX_EVENTS:
            self.png.discard()
            print(f"{PROG}: {self.what}: no PNG drawn: {self.timeline.written} events, more than the "
                  f"{PNG_MAX_EVENTS:,} a PNG is drawn from (--max-events N cuts the timeline)", file=sys.stderr)
        elif self.png is not None:
            from pump import timeline_png
            timeline_png.render(timeline.load(self.json_path), self.png, title)
            self.png.close()
            print(f"timeline drawn: {self.png_path}")


def matplotlib_missing() -> str:
    """Why a PNG cannot be drawn here, or "" when it can."""
    try:
        import matplotlib  # noqa: F401
    except ImportError as exc:
        return f"matplotlib is not installed ({exc}); pip install 'pump[plot]'"
    return ""


def export(args) -> int:
    from pump import trace, trace_export
    out = Outputs("trace export", args.perfetto, args.png, args.max_events)
    try:
        notes = trace_export.export(args.file, out.timeline, args.budget)
    except trace.TraceError as exc:
        out.abandon()
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 1
    if notes.get("cut"):
        print(f"{PROG}: warning: {args.file}: {notes['cut']}; exported up to there", file=sys.stderr)
    out.finish(notes, f"{notes['name'] or 'job'} ({os.path.basename(args.file)}): host-side times")
    return 0
