"""What the docs quote a command printing is what it prints today.

A page marks a quoted output with the command that makes it, in an HTML comment (invisible on
GitHub and in the site) just before the block that shows the output:

    <!-- output-of: pump simulate bench/traces/resnet50.trace --capacity 50% -->

or ``<!-- output-of slow: ... -->`` for a command of more than a minute or so on a 2-core
machine, run only with PUMP_DOC_SLOW=1 (CI keeps its time small; run them before changing such
a figure).  The block (fenced, or indented four spaces) lists lines the command must print, in
order, among its stdout then its stderr lines; ``…`` in a line stands for any text (a path, a
checksum).  The command must also appear on the page outside the comment (as the reader's
command, ``\\``-continued lines joined; each of ``A && B`` on its own), so the two cannot drift
apart.  A page's commands run in order in one scratch directory, with the repository's examples/
and bench/ linked into it and docs/'s folders made empty there (so the docs' relative paths
work, and what a command writes stays out of the checkout), this Python's scripts first on PATH,
and $KINETO naming ../shared/data/kineto, the real profiles (a command that uses it is skipped
where they are not; one that runs an example on fakecuda, where there is a GPU).  Only
deterministic outputs belong here (the simulator, trace generation, fakecuda's counts); a
measured figure is shown with the command that made it.  A command writes only under the
scratch directory (examples/ and bench/ are the checkout's own).
"""

import os
import pathlib
import re
import subprocess
import sys

import pytest

from helpers import has_gpu

ROOT = pathlib.Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
MARKER = re.compile(r"^<!-- output-of( slow)?: (.+?) -->\n", re.M)
FENCED = re.compile(r"\A\n*(```|~~~)[^\n]*\n(.*?)^\1", re.M | re.S)
INDENTED = re.compile(r"\A\n*((?:(?: {4}[^\n]*)?\n)+)")
SLOW = os.environ.get("PUMP_DOC_SLOW") == "1"
KINETO = next((d for d in (ROOT.parent / "shared" / "data" / "kineto", pathlib.Path("/work/shared/data/kineto"))
               if d.is_dir()), None)
TIMEOUT_S = 900


def _joined(text: str) -> str:
    return " ".join(re.sub(r"\\\n\s*", " ", text).split())


def checks(text: str):
    """[(command, slow, [expected lines])] of a page, in order; ValueError for a marker without
    its block, or whose command is not on the page."""
    found = []
    visible = _joined(re.sub(r"<!--.*?-->", "", text, flags=re.S))
    for m in MARKER.finditer(text):
        rest = text[m.end():]
        block = FENCED.match(rest)
        lines = block.group(2).splitlines() if block else None
        if lines is None and INDENTED.match(rest):
            lines = [line[4:] for line in INDENTED.match(rest).group(1).splitlines()]
        lines = [line.rstrip() for line in lines or () if line.strip()]
        if not lines:
            raise ValueError(f"output-of: {m.group(2)}: no output block follows the marker")
        if any(_joined(part) not in visible for part in m.group(2).split(" && ")):
            raise ValueError(f"output-of: {m.group(2)}: the page does not show this command outside the marker")
        found.append((m.group(2), bool(m.group(1)), lines))
    return found


def missing(expected, printed):
    """The first expected line not found, in order, among the printed ones (None: all were)."""
    printed = iter(printed)
    for line in expected:
        pattern = re.compile(".*".join(re.escape(part) for part in line.split("…")))
        if not any(pattern.fullmatch(p.rstrip()) for p in printed):
            return line
    return None


def _id(page):
    return str(page.relative_to(ROOT))


# Commands that run on fakecuda where there is no GPU: the test build of this checkout must be
# current first; where there is a GPU they run on it, and print other lines.
ON_FAKECUDA = re.compile(r"examples/(managed_saxpy|train_gpt|no_gpu_demo)\.py")


@pytest.mark.parametrize("page", [p for p in PAGES if MARKER.search(p.read_text())], ids=_id)
def test_quoted_outputs_are_what_the_commands_print(page, tmp_path, request):
    for name in ("examples", "bench"):
        (tmp_path / name).symlink_to(ROOT / name)
    for folder in (ROOT / "docs").iterdir():     # empty: what a command writes there stays out of docs/
        if folder.is_dir() and not folder.name.startswith(("_", ".")):
            (tmp_path / "docs" / folder.name).mkdir(parents=True)
    env = dict(os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""),
               KINETO=str(KINETO or ""))
    skipped, ran = [], 0
    for command, slow, expected in checks(page.read_text()):
        if slow and not SLOW or "$KINETO" in command and KINETO is None or ON_FAKECUDA.search(command) and has_gpu():
            skipped.append(command)
            continue
        if ON_FAKECUDA.search(command):
            request.getfixturevalue("c_build")
        ran += 1
        proc = subprocess.run(["bash", "-c", command], cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=TIMEOUT_S)
        line = missing(expected, proc.stdout.splitlines() + proc.stderr.splitlines())
        assert line is None, (f"{_id(page)}: `{command}` (exit {proc.returncode}) no longer prints\n  {line}\n"
                              f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr[-3000:]}")
    if skipped:
        pytest.skip(f"{ran} checked; skipped, slow (run with PUMP_DOC_SLOW=1), without ../shared/data/kineto or "
                    "on fakecuda where there is a GPU: "
                    f"{'; '.join(skipped)}")


def test_markers_are_read_and_lines_compared():
    page = ("Run\n\n    pump x --y \\\n        --z\n\n<!-- output-of: pump x --y --z -->\n\n"
            "    a 1.5 ms\n    b … end\n\n<!-- output-of slow: pump x --y -->\n```\nc\n```\n")
    assert checks(page) == [("pump x --y --z", False, ["a 1.5 ms", "b … end"]), ("pump x --y", True, ["c"])]
    assert missing(["a 1.5 ms", "b … end"], ["noise", "a 1.5 ms", "b the middle end"]) is None
    assert missing(["a 1.5 ms", "b … end"], ["a 1.6 ms", "b x end"]) == "a 1.5 ms"
    assert missing(["b … end", "a 1.5 ms"], ["a 1.5 ms", "b x end"]) == "a 1.5 ms"   # in order
    with pytest.raises(ValueError, match="does not show this command"):
        checks("<!-- output-of: pump other -->\n    a\n")
    with pytest.raises(ValueError, match="no output block follows"):
        checks("pump x\n<!-- output-of: pump x -->\nprose\n")


@pytest.mark.parametrize("page", PAGES, ids=_id)
def test_every_marker_has_its_block_and_command(page):
    checks(page.read_text())


def test_pump_run_usage_in_the_docs_names_every_option():
    """docs/pump-run.md's usage lines lacked --group and --no-group; they follow the parser now."""
    from pump import run
    usage = (ROOT / "docs" / "pump-run.md").read_text().split("\n\n")[1]
    options = {o for a in run.build_parser()._actions for o in a.option_strings if o.startswith("--")}
    assert options - {"--help"} - set(re.findall(r"--[a-z-]+", usage)) == set()
