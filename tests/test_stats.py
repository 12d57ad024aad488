"""pump.stats: records built with the same cffi layout the module parses from pump_stats.h."""

import logging
import pathlib
import re

import pytest

from pump import stats

REPO = pathlib.Path(__file__).resolve().parent.parent
GiB = 1 << 30


def make_record(**fields) -> bytes:
    ffi = stats.get_ffi()
    rec = ffi.new("struct pump_stats *")
    rec.magic = stats.magic()
    rec.version = stats.version()
    for name, value in fields.items():
        setattr(rec, name, value.encode() if isinstance(value, str) else value)
    return bytes(ffi.buffer(rec))


def write_record(dirpath, pid, **fields) -> pathlib.Path:
    path = pathlib.Path(dirpath) / f"pump-{pid}.stats"
    path.write_bytes(make_record(pid=pid, **fields))
    return path


def test_layout_comes_from_the_header():
    text = (REPO / "shim" / "base" / "pump_stats.h").read_text()
    declared = re.findall(r"^\s*(?:u?int\d+_t|char)\s+(\w+)", text, re.M)
    assert stats.fields() == declared
    assert stats.magic() == 0x504D5053
    assert stats.record_size() == stats.get_ffi().sizeof("struct pump_stats")


def test_read_record_round_trip(tmp_path):
    path = write_record(tmp_path, 42, parent_pid=7, exited=1, passthrough=1,
                        passthrough_reason="forked after cuInit", launches=10,
                        launches_managed=4, prefetch_bytes=3 * GiB, errors=2)
    rec = stats.read_record(path)
    assert set(rec) == set(stats.fields())
    assert rec["pid"] == 42 and rec["parent_pid"] == 7
    assert rec["passthrough_reason"] == "forked after cuInit"
    assert (rec["launches"], rec["launches_managed"]) == (10, 4)
    assert rec["prefetch_bytes"] == 3 * GiB
    assert rec["errors"] == 2
    assert rec["prefetch_calls"] == 0


def test_trailing_bytes_are_ignored(tmp_path):
    path = tmp_path / "pump-1.stats"
    path.write_bytes(make_record(pid=1, launches=5).ljust(4096, b"\0"))
    assert stats.read_record(path)["launches"] == 5


@pytest.mark.parametrize(
    "mangle, words",
    [
        (lambda b: b"", "too short"),
        (lambda b: b[:6], "too short"),
        (lambda b: b[: len(b) // 2], "too short"),
        (lambda b: b"XXXX" + b[4:], "bad magic"),
        (lambda b: bytes(4) + b[4:], "never initialised"),
        (lambda b: b[:4] + (99).to_bytes(4, "little") + b[8:], "unsupported version 99"),
    ],
    ids=["empty", "six-bytes", "truncated", "bad-magic", "zero-magic", "bad-version"],
)
def test_corrupt_record_is_a_clear_error(tmp_path, mangle, words):
    path = tmp_path / "pump-9.stats"
    path.write_bytes(mangle(make_record(pid=9)))
    with pytest.raises(ValueError) as err:
        stats.read_record(path)
    assert str(path) in str(err.value)
    assert words in str(err.value)


def test_read_dir_skips_and_reports_bad_files(tmp_path, caplog):
    write_record(tmp_path, 300, launches=1)
    write_record(tmp_path, 20, launches=2)
    (tmp_path / "pump-5.stats").write_bytes(b"junk")
    (tmp_path / "other.txt").write_bytes(b"not a record")
    errors = []
    records = stats.read_dir(tmp_path, errors=errors)
    assert [r["pid"] for r in records] == [20, 300]
    assert len(errors) == 1 and "pump-5.stats" in errors[0] and "too short" in errors[0]

    with caplog.at_level(logging.WARNING, logger="pump.stats"):
        assert len(stats.read_dir(tmp_path)) == 2
    assert "pump-5.stats" in caplog.text


def test_read_dir_empty(tmp_path):
    assert stats.read_dir(tmp_path) == []


def test_aggregate():
    a = stats.parse_record(make_record(pid=1, exited=1, launches=10, launches_managed=6,
                                       prefetch_calls=3, prefetch_bytes=100,
                                       managed_bytes=50, managed_bytes_peak=500,
                                       capacity_bytes=1000, errors=1))
    b = stats.parse_record(make_record(pid=2, passthrough=1, launches=5, launches_managed=1,
                                       prefetch_calls=4, prefetch_bytes=20,
                                       managed_bytes=7, managed_bytes_peak=300,
                                       capacity_bytes=2000, capacity_refusals=2))
    t = stats.aggregate([a, b])
    assert t["processes"] == 2
    assert t["passthrough_processes"] == 1
    assert t["exited_processes"] == 1
    assert t["launches"] == 15 and t["launches_managed"] == 7
    assert t["prefetch_calls"] == 7 and t["prefetch_bytes"] == 120
    assert t["managed_bytes"] == 57
    assert t["managed_bytes_peak"] == 500  # max over processes, not a sum
    assert t["capacity_bytes"] == 2000
    assert t["errors"] == 1 and t["capacity_refusals"] == 2
    for name in ("pid", "parent_pid", "magic", "version", "passthrough_reason"):
        assert name not in t


def test_aggregate_nothing():
    t = stats.aggregate([])
    assert t["processes"] == 0 and t["launches"] == 0 and t["managed_bytes_peak"] == 0


@pytest.mark.parametrize(
    "n, text",
    [(0, "0 B"), (1023, "1023 B"), (1024, "1.0 KiB"), (1536, "1.5 KiB"),
     (int(1.2 * GiB), "1.2 GiB"), (5 << 40, "5.0 TiB")],
)
def test_human_bytes(n, text):
    assert stats.human_bytes(n) == text


def totals(**over):
    t = stats.aggregate([])
    t.update(over)
    return t


def test_summary_line():
    t = totals(launches=1234, launches_managed=1000, prefetch_calls=57,
               prefetch_bytes=int(1.2 * GiB), bytes_evicted=512, events_dropped=7, processes=3)
    assert stats.summary_line(t) == (
        "pump: 1234 launches (1000 on managed memory), 57 prefetch calls, "
        "1.2 GiB prefetched, 512 B evicted, 7 events dropped, 3 processes"
    )


def test_summary_line_says_how_many_launches_a_plan_placed():
    """Under pumpd's plans, the launches they placed every block of (issue 41's launches_planned)."""
    base = dict(launches=1234, launches_managed=1000, prefetch_calls=57, processes=1)
    assert "planned" not in stats.summary_line(totals(**base))  # no plan: nothing to say
    assert stats.summary_line(totals(**base, plan_triggers=40, launches_planned=950)).startswith(
        "pump: 1234 launches (1000 on managed memory, 950 planned), 57 prefetch calls")


def test_summary_line_shows_hook_coverage():
    """The lookups answered with pump's hooks, and those pump could not match (issue 27)."""
    base = dict(launches=5, launches_managed=5, prefetch_calls=1, processes=1)
    assert "hooks" not in stats.summary_line(totals(**base))  # a program linked to libcuda: nothing looked up
    assert stats.summary_line(totals(**base, procaddr_hooks=139, dlsym_hooks=2)).endswith(
        ", 0 events dropped, hooks 139 via cuGetProcAddress + 2 via dlsym, 1 process")
    assert stats.summary_line(totals(**base, procaddr_hooks=139, procaddr_unmatched=3)).endswith(
        ", hooks 139 via cuGetProcAddress + 0 via dlsym (3 unmatched), 1 process")


def test_summary_line_shows_problems_only_when_nonzero():
    line = stats.summary_line(totals(launches=1, prefetch_calls=1, processes=1,
                                     errors=2, capacity_refusals=1,
                                     passthrough_processes=1))
    assert line == (
        "pump: 1 launch (0 on managed memory), 1 prefetch call, 0 B prefetched, "
        "0 B evicted, 0 events dropped, 1 capacity refusal, 2 errors, 1 process (1 passed through)"
    )
    assert "error" not in stats.summary_line(totals(processes=1))
    assert "refusal" not in stats.summary_line(totals(processes=1))
    assert "would not prefetch" not in stats.summary_line(totals(processes=1))


def test_summary_line_names_allocations_the_driver_would_not_prefetch():
    line = stats.summary_line(totals(launches=2, prefetch_calls=1, processes=1, prefetch_refusals=1))
    assert line == (
        "pump: 2 launches (0 on managed memory), 1 prefetch call, 0 B prefetched, 0 B evicted, "
        "0 events dropped, 1 allocation the driver would not prefetch, 1 process"
    )
