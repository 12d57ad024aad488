"""Timelines (pump/timeline.py): `pump trace export --perfetto` of a real fakecuda job and
`pump simulate --timeline` of a simulated step, checked by a validator of what Perfetto's and
chrome://tracing's JSON importers rely on, which real PyTorch profiler (Kineto) traces are
checked by too; the size cap; the PNG; bad inputs.

Perfetto's Python package downloads its trace processor at first use and its UI needs the
network, so neither can open the files here: problems() below checks the format instead."""

import collections
import glob
import json
import math
import os
import pathlib
import re
import subprocess
import sys

import pytest

from helpers import PUMP_RUN, clean_env
from pump import timeline
from synthetic_trace import training_trace

ROOT = pathlib.Path(__file__).resolve().parent.parent
PUMP = str(pathlib.Path(sys.executable).parent / "pump")
# Real PyTorch profiler traces beside the checkout (shared/data/kineto/README.md), where there are.
KINETO = next((found for up in (ROOT.parent, ROOT.parent.parent)
               if (found := sorted(glob.glob(str(up / "shared" / "data" / "kineto" / "*.json.gz"))))), [])
MIB = 1 << 20

# ---- the validator ----------------------------------------------------------------------

PHASES = set("BEXiIbneCMsftPONDRc")   # the Trace Event Format's phases


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _ns(us) -> int:
    return round(us * 1000)   # Perfetto keeps integer nanoseconds


def problems(doc) -> list:
    """[(rule, event index, message)] for each way `doc` breaks what the viewers rely on:
    format    a JSON object with a "traceEvents" list (displayTimeUnit "ms" or "ns" if given)
    phase     every event's "ph" is one of the format's phases
    int-ids   integer pid and tid (a global instant, "s": "g", belongs to no track: exempt)
    ts        "ts" a number of microseconds on every event but metadata
    dur       complete slices ("X") carry a number "dur" >= 0
    nesting   complete slices on one (pid, tid) track nest: none overlaps another in part;
              B/E balance per track
    async     "b"/"e" carry an id and pair up by (pid, cat, id, name), each end after its begin
    counter   "C" args: a non-empty object of numbers
    flow      "s"/"t"/"f" carry an id
    metadata  process_name/thread_name carry args.name
    process-name, thread-name: every pid with timed events is named, and every (pid, tid)
              with thread-scoped events (X, B/E, thread instants)."""
    out = []

    def bad(rule, i, e, what):
        out.append((rule, i, f"{rule}: event {i} ({e.get('ph')} {e.get('name')!r}): {what}"))

    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        return [("format", -1, "format: not an object with a traceEvents list")]
    if doc.get("displayTimeUnit", "ms") not in ("ms", "ns"):
        out.append(("format", -1, f"format: displayTimeUnit {doc['displayTimeUnit']!r}"))
    events = doc["traceEvents"]
    slices, begin_end, b_e = (collections.defaultdict(list) for _ in range(3))
    process_names, thread_names, pids_used, tracks_used = set(), set(), {}, {}
    for i, e in enumerate(events):
        if not isinstance(e, dict) or e.get("ph") not in PHASES:
            bad("phase", i, e if isinstance(e, dict) else {}, "not an event of a known phase")
            continue
        ph = e["ph"]
        is_global = ph in "iI" and e.get("s") == "g"
        if not is_global and not all(isinstance(e.get(k), int) and not isinstance(e.get(k), bool)
                                     for k in ("pid", "tid")):
            bad("int-ids", i, e, f"pid {e.get('pid')!r}, tid {e.get('tid')!r}")
            continue
        if ph == "M":
            args = e.get("args")
            if e.get("name") in ("process_name", "thread_name"):
                if not (isinstance(args, dict) and isinstance(args.get("name"), str)):
                    bad("metadata", i, e, "no args.name")
                elif e["name"] == "process_name":
                    process_names.add(e["pid"])
                else:
                    thread_names.add((e["pid"], e["tid"]))
            continue
        if not _number(e.get("ts")):
            bad("ts", i, e, f"ts {e.get('ts')!r} is not a number of microseconds")
            continue
        if is_global:
            continue
        track = (e["pid"], e["tid"])
        pids_used.setdefault(e["pid"], i)
        if ph in "BEX" or (ph in "iI" and e.get("s", "t") == "t"):
            tracks_used.setdefault(track, i)
        if ph == "X":
            if not _number(e.get("dur")) or e["dur"] < 0:
                bad("dur", i, e, f"dur {e.get('dur')!r}")
            else:
                slices[track].append((_ns(e["ts"]), _ns(e["ts"] + e["dur"]), i))
        elif ph in "BE":
            begin_end[track].append((_ns(e["ts"]), ph == "E", i))
        elif ph in "be":
            if "id" not in e and "id2" not in e:
                bad("async", i, e, "no id")
            else:
                key = (e["pid"], e.get("cat"), json.dumps(e.get("id", e.get("id2"))), e.get("name"))
                b_e[key].append((_ns(e["ts"]), ph == "e", i))
        elif ph == "C":
            args = e.get("args")
            if not isinstance(args, dict) or not args or not all(_number(v) for v in args.values()):
                bad("counter", i, e, f"args {args!r}: not numbers")
        elif ph in "stf" and "id" not in e:
            bad("flow", i, e, "no id")
    for track, items in slices.items():
        stack = []   # (end, index) of the slices enclosing the one looked at
        for start, end, i in sorted(items, key=lambda s: (s[0], -s[1])):
            while stack and stack[-1][0] <= start:
                stack.pop()
            if stack and end > stack[-1][0]:
                bad("nesting", i, events[i], f"overlaps event {stack[-1][1]} in part on track {track}")
            stack.append((end, i))
    for rule, groups in (("nesting", begin_end), ("async", b_e)):
        for key, items in groups.items():
            depth = 0
            for _ts, is_end, i in sorted(items):
                depth += -1 if is_end else 1
                if depth < 0:
                    bad(rule, i, events[i], f"an end without a begin ({key})")
                    depth = 0
            if depth:
                bad(rule, items[0][2], events[items[0][2]], f"{depth} begins without an end ({key})")
    for pid, i in pids_used.items():
        if pid not in process_names:
            bad("process-name", i, events[i], f"pid {pid} has no process_name")
    for track, i in tracks_used.items():
        if track not in thread_names:
            bad("thread-name", i, events[i], f"track {track} has no thread_name")
    return out


def assert_valid(doc):
    found = problems(doc)
    assert not found, "\n".join(m for *_, m in found[:20])


def _named():
    return [{"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "args": {"name": "p"}},
            {"ph": "M", "name": "thread_name", "pid": 1, "tid": 2, "args": {"name": "t"}}]


def _x(ts, dur, tid=2):
    return {"ph": "X", "name": "k", "cat": "c", "pid": 1, "tid": tid, "ts": ts, "dur": dur}


@pytest.mark.parametrize("rule, events", [
    ("nesting", [_x(0, 10), _x(5, 10)]),                                  # overlap in part
    ("int-ids", [dict(_x(0, 1), pid="1")]),
    ("int-ids", [dict(_x(0, 1), tid=2.0)]),
    ("ts", [dict(_x(0, 1), ts="0")]),
    ("dur", [{"ph": "X", "name": "k", "pid": 1, "tid": 2, "ts": 0}]),
    ("async", [{"ph": "b", "cat": "c", "name": "s", "id": 1, "pid": 1, "tid": 2, "ts": 0}]),
    ("async", [{"ph": "b", "cat": "c", "name": "s", "id": 1, "pid": 1, "tid": 2, "ts": 0},
               {"ph": "e", "cat": "c", "name": "s", "id": 2, "pid": 1, "tid": 2, "ts": 1}]),
    ("async", [{"ph": "e", "cat": "c", "name": "s", "id": 1, "pid": 1, "tid": 2, "ts": 0},
               {"ph": "b", "cat": "c", "name": "s", "id": 1, "pid": 1, "tid": 2, "ts": 1}]),
    ("counter", [{"ph": "C", "name": "n", "pid": 1, "tid": 0, "ts": 0, "args": {"bytes": "12"}}]),
    ("counter", [{"ph": "C", "name": "n", "pid": 1, "tid": 0, "ts": 0, "args": {}}]),
    ("thread-name", [_x(0, 1, tid=3)]),
    ("process-name", [dict(_x(0, 1), pid=9)]),
    ("phase", [dict(_x(0, 1), ph="Q")]),
])
def test_the_validator_finds_each_kind_of_problem(rule, events):
    doc = {"displayTimeUnit": "ms", "traceEvents": _named() + events}
    assert rule in {r for r, *_ in problems(doc)}, problems(doc)


def test_the_validator_accepts_nesting_touching_and_overlapping_async():
    events = _named() + [_x(0, 10), _x(2, 3), _x(5, 5), _x(10, 1), _x(10, 0),
                         {"ph": "b", "cat": "c", "name": "s", "id": 1, "pid": 1, "tid": 2, "ts": 0},
                         {"ph": "b", "cat": "c", "name": "s", "id": 2, "pid": 1, "tid": 2, "ts": 1},
                         {"ph": "e", "cat": "c", "name": "s", "id": 1, "pid": 1, "tid": 2, "ts": 5},
                         {"ph": "e", "cat": "c", "name": "s", "id": 2, "pid": 1, "tid": 2, "ts": 6},
                         {"ph": "C", "name": "n", "pid": 1, "tid": 0, "ts": 0.5, "args": {"bytes": 3}}]
    assert_valid({"displayTimeUnit": "ms", "traceEvents": events})


# ---- real PyTorch profiler traces -----------------------------------------------------------

@pytest.mark.skipif(not KINETO, reason="no Kineto traces in shared/data/kineto")
@pytest.mark.parametrize("path", KINETO, ids=lambda p: os.path.basename(p)[:30])
def test_real_pytorch_profiler_traces_meet_the_same_rules(path):
    """The validator holds Kineto's traces (as PyTorch writes them on real GPUs) to the same
    rules, and they meet them but for three conventions of Kineto's own, each asserted here to
    be all there is, and each one Perfetto's importer accepts:
    - int-ids: Kineto's row of profiler spans is a process named by a string pid, "Spans"
      (its X "PyTorch Profiler (0)" and its process_sort_index); Perfetto makes a string pid
      a process of that name. (Its global instants, "s": "g", have string ids too; a global
      instant belongs to no track, and the rules exempt it.)
    - nesting: on a GPU stream's track, Kineto draws a "Stream Sync" (cat cuda_sync) from
      when the host began to wait, which may start before the memcpy it waits for ends; and
      one trace (HolisticTraceAnalysis's test of negative queue lengths, made for such
      anomalies) has a memcpy starting 2 us before the kernel before it on the stream ends.
      Perfetto keeps such slices and counts them in its import stats.
    - thread-name: CUDA runtime calls from threads Kineto did not name; Perfetto shows them
      as "Thread N".
    pump's timelines meet every rule with no exception."""
    doc = timeline.load(path)
    events = doc["traceEvents"]
    assert len(events) > 1000 and any(e.get("cat") == "kernel" for e in events)
    for rule, i, message in problems(doc):
        e = events[i]
        if rule == "int-ids":
            assert e["pid"] == "Spans", message
        elif rule == "nesting":
            other = events[int(re.search(r"overlaps event (\d+)", message).group(1))]
            pair = {e["cat"], other["cat"]}
            assert isinstance(e["pid"], int) and e["pid"] < 64, message   # a GPU's rows, not the host's
            assert "cuda_sync" in pair or ("negative_queue_length" in path and pair == {"kernel", "gpu_memcpy"}), message
        else:
            assert rule == "thread-name" and e["cat"] == "cuda_runtime", message


# ---- pump trace export ----------------------------------------------------------------------

def _run(*args, env=None, timeout=120):
    return subprocess.run([PUMP, *map(str, args)], capture_output=True, text=True, timeout=timeout, env=env)


@pytest.fixture(scope="module")
def saxpy_trace(c_build, tmp_path_factory):
    """examples/managed_saxpy.py under pump-run --trace on fakecuda (as tests/test_example.py runs it)."""
    path = tmp_path_factory.mktemp("saxpy") / "saxpy.trace"
    proc = subprocess.run([PUMP_RUN, "--trace", str(path), "--budget", "12MiB", sys.executable,
                           str(ROOT / "examples" / "managed_saxpy.py"), "--mib", "4", "--steps", "4"],
                          env=clean_env("LD_LIBRARY_PATH"), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "trace written" in proc.stderr, proc.stderr
    return path


def test_export_of_a_real_fakecuda_job(saxpy_trace, tmp_path):
    out, png = tmp_path / "saxpy.json", tmp_path / "saxpy.png"
    proc = _run("trace", "export", "--perfetto", out, "--png", png, "--budget", "12MiB", saxpy_trace)
    assert proc.returncode == 0, proc.stderr
    doc = timeline.load(out)
    assert_valid(doc)
    events = doc["traceEvents"]
    n = sum(e["ph"] != "M" for e in events)
    assert proc.stdout.startswith(f"timeline written: {out} ({n} events)\n"), proc.stdout
    stats = json.loads(_run("trace", "stats", "--json", saxpy_trace).stdout)
    launches = [e for e in events if e.get("cat") == "launch"]
    assert len(launches) == stats["launches"] == 8
    assert {e["name"] for e in launches} == {"saxpy", "scale"} and {e["ph"] for e in launches} == {"i"}
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["name"] == "thread_name"}
    assert all(names[(e["pid"], e["tid"])].endswith(": launch calls") for e in launches)
    assert sum(e.get("cat") == "sync" for e in events) == stats["kinds"]["sync"] > 0
    memory = [e["name"].split()[0] for e in events if e.get("cat") == "memory"]
    assert collections.Counter(memory) == {"cuMemAllocManaged": 4, "cuMemFree": 4}
    counters = collections.defaultdict(list)
    for e in events:
        if e["ph"] == "C":
            counters[e["name"]].append(e["args"])
    assert max(a["bytes"] for a in counters["managed memory allocated"]) == stats["managed_bytes_peak"] == 16 * MIB
    assert max(a["bytes"] for a in counters["GPU-resident (the shim's belief)"]) <= 12 * MIB  # the budget held
    assert max(a["bytes"] for a in counters["prefetched so far"]) > 0
    assert max(a["bytes"] for a in counters["evicted so far"]) > 0      # 16 MiB through a 12 MiB budget
    assert {a["bytes"] for a in counters["budget (given to export)"]} == {12 * MIB}
    assert "host-side times only" in doc["otherData"]["note"] and "no CUPTI" in doc["otherData"]["note"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


def _synthetic(tmp_path, steps=4, layers=6):
    t, *_ = training_trace(steps=steps, layers=layers)
    return t.write(str(tmp_path / "train.trace"))


def test_export_cap_and_gzip(tmp_path):
    path = _synthetic(tmp_path)
    whole = tmp_path / "whole.json.gz"
    assert _run("trace", "export", "--perfetto", whole, path).returncode == 0
    total = sum(e["ph"] != "M" for e in timeline.load(whole)["traceEvents"])
    assert total > 50
    cut = tmp_path / "cut.json"
    proc = _run("trace", "export", "--perfetto", cut, "--max-events", 50, path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == (f"pump: warning: {cut}: truncated at 50 events: {total - 50} events from "
                           f"{proc.stderr.split(' from ')[1].split(' ms')[0]} ms on were left out (--max-events)\n")
    doc = timeline.load(cut)
    assert_valid(doc)
    assert sum(e["ph"] != "M" for e in doc["traceEvents"]) == 50
    assert doc["otherData"]["truncated"].startswith("truncated at 50 events")


def test_export_bad_inputs(tmp_path):
    path = _synthetic(tmp_path)
    out = tmp_path / "out.json"
    cases = [
        (tmp_path / "none.trace", "cannot read: No such file or directory"),
        (tmp_path / "junk.trace", r"not a pump trace \(magic 0x6b6e756a\)"),
    ]
    data = pathlib.Path(path).read_bytes()
    (tmp_path / "junk.trace").write_bytes(b"junk" * 100)
    for trace, message in cases:   # a bad trace: one line, exit status 1 (as pump trace show|stats)
        proc = _run("trace", "export", "--perfetto", out, trace)
        assert (proc.returncode, proc.stdout) == (1, ""), proc.stderr
        assert re.fullmatch(f"pump: {re.escape(str(trace))}: {message}\n", proc.stderr), proc.stderr
        assert not out.exists()   # nothing half-written is left behind
    (tmp_path / "cut.trace").write_bytes(data[:len(data) // 2])   # a trace cut short: its whole records
    proc = _run("trace", "export", "--perfetto", out, tmp_path / "cut.trace")
    assert proc.returncode == 0 and proc.stdout.startswith(f"timeline written: {out}"), proc.stderr
    assert re.fullmatch(f"pump: warning: {re.escape(str(tmp_path / 'cut.trace'))}: cut short: the last whole record "
                        r"ends at byte [\d,]+ of [\d,]+ \(.*\); exported up to there\n", proc.stderr), proc.stderr
    out.unlink()
    for where, why in ((tmp_path / "no" / "dir.json", "No such file or directory"), (tmp_path, "Is a directory")):
        proc = _run("trace", "export", "--perfetto", where, path)
        assert (proc.returncode, proc.stderr) == (2, f"pump: trace export: cannot write {where}: {why}\n")
    proc = _run("trace", "export", "--perfetto", out, "--png", tmp_path / "no" / "x.png", path)
    assert proc.returncode == 2 and proc.stderr.startswith("pump: trace export: cannot write ") and not out.exists()
    proc = _run("trace", "export", "--perfetto", out, "--max-events", "0", path)
    assert proc.returncode == 2 and "a whole number of events >= 1" in proc.stderr


def test_png_is_skipped_without_matplotlib(tmp_path):
    path = _synthetic(tmp_path)
    out, png = tmp_path / "t.json", tmp_path / "t.png"
    hide = ("import sys; sys.modules['matplotlib'] = None; from pump.cli import main; "
            f"sys.exit(main(['trace', 'export', '--perfetto', {str(out)!r}, '--png', {str(png)!r}, {path!r}]))")
    proc = subprocess.run([sys.executable, "-c", hide], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.startswith("pump: trace export: no PNG drawn: matplotlib is not installed"), proc.stderr
    assert "pip install 'pump[plot]'" in proc.stderr
    assert_valid(timeline.load(out))
    assert not png.exists()


def test_no_png_of_more_events_than_it_can_show(tmp_path, monkeypatch, capsys):
    from pump import cli, timeline_cli
    monkeypatch.setattr(timeline_cli, "PNG_MAX_EVENTS", 20)
    out, png = tmp_path / "t.json", tmp_path / "t.png"
    assert cli.main(["trace", "export", "--perfetto", str(out), "--png", str(png), _synthetic(tmp_path)]) == 0
    err = capsys.readouterr().err
    assert re.fullmatch(r"pump: trace export: no PNG drawn: \d+ events, more than the 20 a PNG is drawn from "
                        r"\(--max-events N cuts the timeline\)\n", err), err
    assert not png.exists()
    assert cli.main(["trace", "export", "--perfetto", str(out), "--png", str(png), "--max-events", "20",
                     _synthetic(tmp_path)]) == 0
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_the_png_draws_a_kineto_trace_too(tmp_path):
    if not KINETO:
        pytest.skip("no Kineto traces in shared/data/kineto")
    from pump import timeline_png
    smallest = min(KINETO, key=os.path.getsize)
    png = tmp_path / "k.png"
    timeline_png.render(timeline.load(smallest), str(png), "kineto")
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_counter_lines_on_top_of_each_other_all_show(tmp_path, monkeypatch):
    """Two memory counters with the same values (believed resident and resident): each line
    drawn with its own dash and width, the later thinner, so that neither hides the other."""
    from matplotlib import axes
    from pump import timeline_png
    drawn = []
    original = axes.Axes.step
    monkeypatch.setattr(axes.Axes, "step", lambda ax, *a, **k: drawn.append(k) or original(ax, *a, **k))
    same = [{"ph": "C", "name": name, "pid": 1, "tid": 0, "ts": ts, "args": {"bytes": v}}
            for name in ("believed", "resident", "evicted") for ts, v in ((0, 0), (10, 1 << 20), (20, 3 << 20))]
    timeline_png.render({"traceEvents": same}, str(tmp_path / "m.png"))
    styles = [(str(k["linestyle"]), k["linewidth"]) for k in drawn]
    assert len(styles) == 3 and len(set(styles)) == 3, styles
    assert [k["linewidth"] for k in drawn] == sorted((k["linewidth"] for k in drawn), reverse=True)


# ---- pump simulate --timeline ---------------------------------------------------------------

def test_simulated_step_per_policy(tmp_path):
    path = _synthetic(tmp_path)
    out, png = tmp_path / "sim.json", tmp_path / "sim.png"
    proc = _run("simulate", path, "--capacity", "50%", "--json", "--timeline", out, "--timeline-png", png)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)   # stdout stays one JSON document
    # beside the timeline's lines, what simulate says it will run and its progress
    said = "".join(line + "\n" for line in proc.stderr.splitlines() if not line.startswith("simulate: "))
    assert said == f"timeline written: {out} ({said.split('(')[1].split(' ')[0]} events)\n" \
                   f"timeline drawn: {png}\n"
    doc = timeline.load(out)
    assert_valid(doc)
    events = doc["traceEvents"]
    pids = {e["args"]["name"]: e["pid"] for e in events if e["name"] == "process_name"}
    assert set(pids) == {f"{p} (simulated)" for p in ("naive", "launch", "lookahead", "ideal")}
    threads = {(e["pid"], e["args"]["name"]): e["tid"] for e in events if e["name"] == "thread_name"}
    step = doc["otherData"]["step"]
    assert step == report["steady_steps"][0]
    for policy, pid in pids.items():
        policy = policy.split()[0]
        mine = [e for e in events if e.get("pid") == pid and e["ph"] != "M"]

        def on(track, ph="X"):
            return [e for e in mine if e["ph"] == ph and e["tid"] == threads[(pid, track)]]
        kernels = on("GPU compute stream: kernels")
        assert len(kernels) == report["launches"] // 4 == 12   # one step of 4
        assert len(on("host: launch calls", "i")) == 12
        # The drawn step is the one the report measures: its kernels end one step time after the
        # step's first launch call (within the host's launch time), and its bytes are the step's.
        end_ms = max(e["ts"] + e["dur"] for e in kernels) / 1e3
        assert end_ms == pytest.approx(report["policies"][policy]["step_seconds"] * 1e3, abs=0.01)
        per_step = report["policies"][policy]["per_step"]
        h2d = sum(e["args"]["bytes"] for e in on("copy host->GPU: prefetches")) + \
            sum(e["args"].get("bytes_host_to_gpu", 0) for e in on("fault path: migrations on faults, the driver's evictions"))
        d2h = sum(e["args"]["bytes"] for e in on("copy GPU->host: evictions")) + \
            sum(e["args"].get("bytes_gpu_to_host", 0) for e in on("fault path: migrations on faults, the driver's evictions"))
        assert (h2d, d2h) == (per_step["bytes_h2d"], per_step["bytes_d2h"])
        faults = sum(e["args"]["faults"] for e in kernels)
        assert faults == per_step["faults"]
        spans = [e for e in mine if e["ph"] == "b"]
        assert len(spans) == len(on("copy host->GPU: prefetches")) + len(on("copy GPU->host: evictions"))
        counters = {e["name"] for e in mine if e["ph"] == "C"}
        if policy == "ideal":
            assert (h2d, d2h, faults, counters) == (0, 0, 0, set())
        else:
            assert counters == {"GPU-resident", "believed resident by the shim", "capacity"}
            assert max(e["args"]["bytes"] for e in mine if e.get("name") == "GPU-resident") <= report["capacity_bytes"]
    assert report["policies"]["naive"]["per_step"]["faults"] > 0                 # so the checks above saw faults
    assert any(e.get("cat") == "prefetch" for e in events if e.get("pid") == pids["lookahead (simulated)"])
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_simulate_timeline_cap_keeps_pairs_whole(tmp_path):
    path = _synthetic(tmp_path)
    out = tmp_path / "sim.json"
    proc = _run("simulate", path, "--capacity", "50%", "--policy", "lookahead", "--timeline", out, "--max-events", 41)
    assert proc.returncode == 0 and "truncated at 41 events" in proc.stderr, proc.stderr
    doc = timeline.load(out)
    assert_valid(doc)   # a begin is never written without its end
    assert sum(e["ph"] != "M" for e in doc["traceEvents"]) <= 41


def test_simulate_checks_its_timeline_paths_before_the_work(tmp_path):
    path = _synthetic(tmp_path)
    for flags, where in ((["--timeline", tmp_path / "no" / "t.json"], tmp_path / "no" / "t.json"),
                         (["--timeline", tmp_path / "t.json", "--timeline-png", tmp_path], tmp_path)):
        proc = _run("simulate", path, "--capacity", "50%", *flags)
        what = "No such file or directory" if "no" in where.parts else "Is a directory"
        assert (proc.returncode, proc.stdout, proc.stderr) == (2, "", f"pump: simulate: cannot write {where}: {what}\n")
    assert not (tmp_path / "t.json").exists()
    proc = _run("simulate", path, "--capacity", "50%", "--timeline-png", tmp_path / "t.png")
    assert (proc.returncode, proc.stdout) == (2, "") and "give both" in proc.stderr
    proc = _run("simulate", tmp_path / "none.trace", "--capacity", "50%", "--timeline", tmp_path / "t.json")
    assert proc.returncode == 1 and "cannot read" in proc.stderr and not (tmp_path / "t.json").exists()


def test_the_committed_examples_are_valid_and_small():
    """docs/timeline/: what docs/timeline.md shows, each beside its PNG."""
    examples = sorted((ROOT / "docs" / "timeline").glob("*.json*"))
    assert [p.name for p in examples] == ["resnet50-step.json.gz", "saxpy.json"]
    for path in examples:
        assert path.stat().st_size < 1 << 20
        assert_valid(timeline.load(path))
        png = path.parent / (path.name.split(".")[0] + ".png")
        assert png.read_bytes()[:4] == b"\x89PNG"
