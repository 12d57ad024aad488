"""A Chrome Trace Event document drawn as a PNG with matplotlib, for the docs and for a
look without a browser: per process a band of tracks (complete slices as bars, instants as
ticks, async spans packed into lanes) and below it the process's counters as step lines.
Reads any such document (pump's timelines, PyTorch profiler traces)."""

import collections

import matplotlib

matplotlib.use("Agg")
from matplotlib import pyplot  # noqa: E402

MAX_LANES = 3   # async lanes drawn per (process, category); deeper spans share the last one
# Counter lines often run on top of each other (memory believed resident and resident, the
# same bytes): each next one is drawn thinner and dashed otherwise, so that every one shows.
LINE_STYLES = (("-", 3.2), ((0, (5, 2)), 2.4), ((0, (3, 1, 1, 1)), 1.7), ((0, (1, 1)), 1.1))


def _label(names: dict, key, default: str) -> str:
    return names.get(key) or default


def render(doc: dict, out, title: str = ""):
    """Draw `doc` (timeline.load()) to `out` (a path or a binary file) as a PNG."""
    events = [e for e in doc.get("traceEvents", []) if isinstance(e, dict)]
    pnames, tnames, porder = {}, {}, {}
    for e in events:
        if e.get("ph") == "M":
            a = e.get("args") or {}
            if e.get("name") == "process_name":
                pnames[e.get("pid")] = a.get("name")
            elif e.get("name") == "thread_name":
                tnames[(e.get("pid"), e.get("tid"))] = a.get("name")
            elif e.get("name") == "process_sort_index":
                porder[e.get("pid")] = a.get("sort_index", 0)
    timed = [e for e in events if e.get("ph") in ("X", "i", "I", "b", "e", "C")
             and isinstance(e.get("ts"), (int, float)) and isinstance(e.get("pid"), int)]
    t0 = min((e["ts"] for e in timed), default=0.0)
    ms = lambda ts: (ts - t0) / 1e3  # noqa: E731

    tracks = collections.defaultdict(lambda: {"X": [], "i": []})   # (pid, tid) -> bars, ticks
    spans = collections.defaultdict(list)                          # (pid, cat) -> [(start, end, name)]
    counters = collections.defaultdict(list)                       # (pid, "name key") -> [(t, value)]
    open_spans = {}
    for e in timed:
        pid, ph = e["pid"], e["ph"]
        if ph == "X":
            tracks[(pid, e.get("tid"))]["X"].append((ms(e["ts"]), max(float(e.get("dur", 0)), 0) / 1e3,
                                                     e.get("cat", "")))
        elif ph in ("i", "I"):
            tracks[(pid, e.get("tid"))]["i"].append((ms(e["ts"]), e.get("cat", "")))
        elif ph == "b":
            open_spans[(pid, e.get("cat"), e.get("id"), e.get("name"))] = ms(e["ts"])
        elif ph == "e":
            start = open_spans.pop((pid, e.get("cat"), e.get("id"), e.get("name")), None)
            if start is not None:
                spans[(pid, e.get("cat", ""))].append((start, ms(e["ts"]), e.get("name", "")))
        else:
            for key, value in (e.get("args") or {}).items():
                if isinstance(value, (int, float)):
                    counters[(pid, f"{e.get('name', '')} {key}")].append((ms(e["ts"]), value))

    pids = sorted({k[0] for k in (*tracks, *spans, *counters)}, key=lambda p: (porder.get(p, 0), p))
    cats = sorted({c for t in tracks.values() for *_, c in t["X"]} | {c for t in tracks.values() for _, c in t["i"]}
                  | {k[1] for k in spans})
    colour = {c: pyplot.cm.tab10(i % 10) for i, c in enumerate(cats)}
    rows_of = {p: sorted(k for k in tracks if k[0] == p) for p in pids}
    lanes_of = {k: _lanes(v) for k, v in spans.items()}
    ratios = []
    for p in pids:
        n = len(rows_of[p]) + sum(min(MAX_LANES, max(lanes_of[k]) + 1) for k in lanes_of if k[0] == p)
        ratios.append(max(n, 1) * 0.35 + 0.4)
        if any(k[0] == p for k in counters):
            ratios.append(1.4)
    fig, axes = pyplot.subplots(len(ratios) or 1, 1, sharex=True, squeeze=False,
                                figsize=(12, min(60, 1.0 + sum(ratios))), gridspec_kw={"height_ratios": ratios or [1]})
    axes = iter(axes[:, 0])
    for p in pids:
        ax = next(axes)
        labels = []
        for row, key in enumerate(rows_of[p]):
            t = tracks[key]
            by_cat = collections.defaultdict(list)
            for start, dur, cat in t["X"]:
                by_cat[cat].append((start, dur))
            for cat, bars in by_cat.items():
                # white edges part slices that touch, where there are few enough to see them
                ax.broken_barh(bars, (row - 0.4, 0.8), facecolors=colour[cat], edgecolor="white",
                               linewidth=0.3 if len(bars) <= 200 else 0)
            ticks = collections.defaultdict(list)
            for start, cat in t["i"]:
                ticks[cat].append(start)
            for cat, xs in ticks.items():
                ax.plot(xs, [row] * len(xs), "|", color=colour[cat], markersize=9)
            labels.append(_label(tnames, key, f"tid {key[1]}"))
        for key in sorted(k for k in lanes_of if k[0] == p):
            base = len(labels)
            bars = collections.defaultdict(list)  # lane -> its spans, one artist each (thousands of spans)
            for (start, end, _name), lane in zip(spans[key], lanes_of[key]):
                bars[min(lane, MAX_LANES - 1)].append((start, max(end - start, 0)))
            for lane, xranges in bars.items():
                ax.broken_barh(xranges, (base + lane - 0.3, 0.6), facecolors=colour[key[1]], alpha=0.6, linewidth=0)
            lanes = min(MAX_LANES, max(lanes_of[key]) + 1)
            labels += [f"{key[1]} in flight" + (f" ({j + 1})" if lanes > 1 else "") for j in range(lanes)]
        ax.set_yticks(range(len(labels)), labels, fontsize=7)
        ax.set_ylim(len(labels) - 0.5, -0.5)
        ax.set_title(_label(pnames, p, f"pid {p}"), fontsize=9, loc="left")
        ax.grid(True, axis="x", alpha=0.3)
        if any(k[0] == p for k in counters):
            ax = next(axes)
            counts = ax.twinx()  # counters of other things than bytes, on their own scale
            for i, key in enumerate(sorted(k for k in counters if k[0] == p)):
                pts = sorted(counters[key])
                in_bytes = key[1].endswith(" bytes")
                style, width = LINE_STYLES[i % len(LINE_STYLES)]
                (ax if in_bytes else counts).step(
                    [x for x, _ in pts], [v / (1 << 20) if in_bytes else v for _, v in pts], where="post",
                    color=pyplot.cm.tab10(i % 10), linestyle=style, linewidth=width, zorder=2 + i,
                    label=key[1][:-len(" bytes")] + ", MiB" if in_bytes else key[1] + " (right scale)")
            ax.set_ylabel("MiB", fontsize=7)
            lines = ax.get_legend_handles_labels()
            more = counts.get_legend_handles_labels()
            ax.legend(lines[0] + more[0], lines[1] + more[1], fontsize=7, loc="upper left",
                      bbox_to_anchor=(1.06 if more[0] else 1.01, 1), borderaxespad=0)
            if not more[0]:
                counts.set_visible(False)
            for a in (ax, counts):
                a.tick_params(labelsize=7)
            ax.grid(True, alpha=0.3)
    for ax in axes:   # none left in a well-formed document; an empty one draws one bare axes
        ax.set_visible(False)
    handles = [matplotlib.patches.Patch(color=colour[c], label=c) for c in cats]
    if handles:
        fig.legend(handles=handles, loc="upper right", fontsize=7, ncol=min(len(handles), 6))
    fig.supxlabel("milliseconds", fontsize=8)
    if title:
        fig.suptitle(title, fontsize=10, x=0.01, ha="left")
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    fig.savefig(out, format="png", dpi=110)
    pyplot.close(fig)


def _lanes(spans):
    """A lane per span such that spans in one lane do not overlap (first fit, by start)."""
    ends, lane_of = [], {}
    for i in sorted(range(len(spans)), key=lambda i: spans[i][0]):
        start, end, _ = spans[i]
        for lane, last in enumerate(ends):
            if last <= start:
                ends[lane] = end
                break
        else:
            lane = len(ends)
            ends.append(end)
        lane_of[i] = lane
    return [lane_of[i] for i in range(len(spans))]
