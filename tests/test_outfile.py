"""Files pump writes where its user names them (pump/outfile.py): pump-run --stats, the
timelines of `pump trace export`, and the opener itself. In a directory other users can
write, a link planted at the path is never followed and another user's file never
written, whatever fs.protected_symlinks says; a file written in one go appears whole or
not at all."""

import json
import os
import subprocess
import sys

import pytest

from helpers import PUMP_RUN, clean_env
from pump import outfile
from synthetic_trace import training_trace


def run(argv, **kw):
    return subprocess.run(argv, env=clean_env(), capture_output=True, text=True, timeout=60, **kw)


@pytest.fixture
def planted(tmp_path):
    """(a victim's file, a link to it planted where an output is asked for)."""
    victim = tmp_path / "victims-file"
    victim.write_text("keep me")
    link = tmp_path / "out.json"
    link.symlink_to(victim)
    return victim, link


def test_stats_does_not_follow_a_planted_link(planted):
    # Before: open(path, "w") followed the link and emptied the victim's file, then wrote the stats there.
    victim, link = planted
    proc = run([PUMP_RUN, "--daemon", "none", "--stats", str(link), "true"])
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == (f"pump-run: --stats {link}: a symbolic link; pump writes only to a regular file "
                           "(give the link's target)\n")
    assert victim.read_text() == "keep me" and link.is_symlink()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make another user's file")
def test_stats_does_not_replace_another_users_file(tmp_path):
    theirs = tmp_path / "theirs.json"
    theirs.write_text("keep me")
    os.chown(theirs, 65534, 65534)
    proc = run([PUMP_RUN, "--daemon", "none", "--stats", str(theirs), "true"])
    assert proc.returncode == 2 and "belongs to uid 65534" in proc.stderr
    assert theirs.read_text() == "keep me"


def test_stats_replaces_the_callers_own_file_whole(tmp_path):
    out = tmp_path / "stats.json"
    out.write_text("old")
    os.chmod(out, 0o600)
    proc = run([PUMP_RUN, "--daemon", "none", "--stats", str(out), "true"])
    assert proc.returncode == 0, proc.stderr
    assert json.loads(out.read_text())["exit_code"] == 0
    assert os.listdir(tmp_path) == ["stats.json"]  # no temporary file left beside it


@pytest.mark.parametrize("name", ["timeline.json", "timeline.json.gz"])
def test_trace_export_does_not_follow_a_planted_link(tmp_path, planted, name):
    victim, _ = planted
    link = tmp_path / name
    link.symlink_to(victim)
    trace_file = training_trace(steps=1, layers=2)[0].write(str(tmp_path / "t.trace"))
    proc = run([sys.executable, "-m", "pump.cli", "trace", "export", "--perfetto", str(link), trace_file],
               cwd="/")
    assert proc.returncode == 2, proc.stderr
    assert f"cannot write {link}: a symbolic link" in proc.stderr
    assert victim.read_text() == "keep me"


def test_an_output_appears_whole_or_not_at_all(tmp_path):
    path = tmp_path / "out"
    path.write_bytes(b"before")
    with outfile.open_output(str(path)) as f:
        f.write(b"half")
        assert path.read_bytes() == b"before"  # nothing shown until complete
    assert path.read_bytes() == b"half"
    with pytest.raises(RuntimeError):
        with outfile.open_output(str(path)) as f:
            f.write(b"broken")
            raise RuntimeError("the work failed")
    f = outfile.open_output(str(path), compress=True)
    f.write(b"abandoned")
    f.discard()
    assert path.read_bytes() == b"half" and os.listdir(tmp_path) == ["out"]


def test_a_link_planted_after_opening_is_not_replaced_through(tmp_path, planted):
    """Between opening and completing (a long job), a link put at the path is refused at
    the rename, and the work is not written through it."""
    victim, _ = planted
    path = tmp_path / "late"
    f = outfile.open_output(str(path))
    f.write(b"stats")
    path.symlink_to(victim)
    with pytest.raises(outfile.Refused, match="a symbolic link"):
        f.close()
    assert victim.read_text() == "keep me" and path.is_symlink()
    assert sorted(os.listdir(tmp_path)) == ["late", "out.json", "victims-file"]


def test_in_place_refuses_links_and_other_files(tmp_path, planted):
    _, link = planted
    with pytest.raises(OSError):
        outfile.open_in_place(str(link))
    os.mkfifo(tmp_path / "fifo")
    reader = os.open(tmp_path / "fifo", os.O_RDONLY | os.O_NONBLOCK)  # else opening it fails sooner
    try:
        with pytest.raises(outfile.Refused, match="not a regular file"):
            outfile.open_in_place(str(tmp_path / "fifo"))
    finally:
        os.close(reader)
