"""The docs: every relative link of the README and docs/ resolves (a file that
exists; a heading that exists where the link names one), the README stays a
few screens, and the site builds with Sphinx and MyST with warnings as errors
(pip install '.[docs]'; CI has it)."""

import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

from helpers import load_script

ROOT = pathlib.Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
README_WORDS_MAX = 1200

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)


def slug(heading):
    """The anchor GitHub and MyST (myst_heading_anchors) give a heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(page):
    text = FENCE.sub("", page.read_text())
    return {slug(m.group(1)) for m in re.finditer(r"^#{1,6} (.+)$", text, re.M)}


def dangling_links(page):
    """The relative links of a Markdown page that lead nowhere, as 'target: why'."""
    bad = []
    for target in LINK.findall(FENCE.sub("", page.read_text())):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):
            continue  # a URL: checking it needs the network
        path, _, anchor = target.partition("#")
        where = (page.parent / path).resolve() if path else page
        if not where.exists():
            bad.append(f"{target}: no such file")
        elif anchor and where.suffix == ".md" and anchor not in anchors(where):
            bad.append(f"{target}: no heading with that anchor")
    return bad


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page):
    assert dangling_links(page) == []


def test_a_dangling_link_is_found(tmp_path):
    (tmp_path / "there.md").write_text("# A heading: here\n")
    page = tmp_path / "page.md"
    page.write_text("[ok](there.md) [ok](there.md#a-heading-here) [web](https://example.org/x)\n"
                    "[gone](missing.md) [bad anchor](there.md#elsewhere)\n"
                    "```\n[in code](nowhere.md)\n```\n")
    assert dangling_links(page) == ["missing.md: no such file", "there.md#elsewhere: no heading with that anchor"]


def test_readme_is_a_few_screens():
    words = len((ROOT / "README.md").read_text().split())
    assert words <= README_WORDS_MAX, f"README.md has {words} words; the rest belongs in docs/"


def test_every_page_is_reachable_from_the_index():
    index = (ROOT / "docs" / "index.md").read_text()
    listed = set(re.findall(r"^([\w-]+)$", index, re.M))
    pages = {p.stem for p in (ROOT / "docs").glob("*.md")} - {"index"}
    assert pages - listed == set()


def test_site_builds_with_warnings_as_errors(tmp_path):
    try:
        import myst_parser  # noqa: F401
        import sphinx  # noqa: F401
    except ImportError:
        if os.environ.get("CI"):
            pytest.fail("CI builds the docs: pip install '.[docs]'")
        pytest.skip("Sphinx and MyST are not installed: pip install '.[docs]'")
    build = subprocess.run([sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html",
                            str(ROOT / "docs"), str(tmp_path / "html")], capture_output=True, text=True)
    assert build.returncode == 0, build.stdout + build.stderr
    assert (tmp_path / "html" / "index.html").exists()
    assert (tmp_path / "html" / "troubleshooting.html").exists()


GPU_RUN = ROOT / "bench" / "results" / "gpu-20261124-nvidia-h100-80gb-hbm3"


def test_the_readmes_first_40_lines_answer_from_the_gpu_run():
    """What pump costs a job that fits, what it gains beyond GPU memory (the good and the bad)
    and how to turn it off, each figure as the real GPU run's results file has it, linked."""
    head = "\n".join((ROOT / "README.md").read_text().splitlines()[:40])
    suite = json.loads((GPU_RUN / "benchmarks.json").read_text())["suite"]
    cases = {case["case"]: case for case in suite["cases"]}
    step = {(c, v): cases[c]["variants"][v]["step_ms"]["median"] for c in "bcd" for v in cases[c]["variants"]}
    launch_c, launch_b = cases["c"]["variants"]["launch"], cases["b"]["variants"]["launch"]
    figures = [f"{(step['d', 'pump'] / step['d', 'ideal'] - 1) * 100:.1f}%", f"{step['d', 'pump']:.2f} ms",
               f"{step['d', 'ideal']:.2f} ms", f"{launch_c['speedup_over_naive']:.2f}x", f"{launch_c['ratio_to_ideal']:.1f}x",
               f"{cases['c']['capacity_bytes'] / 2**30:.2f} GiB", f"{step['c', 'launch']:.1f} ms", f"{step['c', 'naive']:.1f} ms",
               f"{step['c', 'lookahead']:.1f} ms", f"{launch_b['speedup_over_naive']:.2f}x"]
    assert [f for f in figures if f not in head] == [], head
    assert f"](docs/gpu-results.md#{GPU_RUN.name})" in head
    assert all(words in head for words in ("PUMP=off", "--policy off", "--capacity host")), head



def test_the_file_index_names_every_file_as_it_says_what_it_is():
    """docs/files.md is scripts/file-index's output (issue 42: the layout cannot omit a file), and
    the script refuses a file that does not open by saying what it is."""
    made = subprocess.run([sys.executable, str(ROOT / "scripts" / "file-index")], capture_output=True, text=True)
    assert made.returncode == 0, made.stderr
    assert (ROOT / "docs" / "files.md").read_text() == made.stdout, "run scripts/file-index > docs/files.md"
    assert "| `policy/residency_rank.c` |" in made.stdout and "| `lookahead.py` |" in made.stdout


def test_the_file_index_refuses_a_file_that_does_not_say_what_it_is(tmp_path, monkeypatch):
    index = load_script(ROOT / "scripts" / "file-index", "file_index")
    (tmp_path / "shim").mkdir()
    (tmp_path / "shim" / "said.c").write_text("/* said.c: one thing (see said.h). More. */\n")
    (tmp_path / "shim" / "unsaid.c").write_text("#include <stdio.h>\n")
    monkeypatch.setattr(index, "ROOT", tmp_path)
    monkeypatch.setattr(index, "FOLDERS", [("shim", "*.c", "the shim")])
    with pytest.raises(index.Unsaid, match=r"shim/unsaid.c: does not open with /\* unsaid.c: what it is"):
        index.page()
    (tmp_path / "shim" / "unsaid.c").unlink()
    assert "| `said.c` | one thing (see said.h). |" in index.page()


def test_the_gpu_results_page_is_made_from_every_run():
    """docs/gpu-results.md is scripts/gpu-results-page's output: a section per bench/results/gpu-*."""
    made = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu-results-page")], capture_output=True,
                          text=True, check=True).stdout
    assert (ROOT / "docs" / "gpu-results.md").read_text() == made, "run scripts/gpu-results-page > docs/gpu-results.md"
    assert all(f"## {run.name}\n" in made for run in (ROOT / "bench" / "results").glob("gpu-*"))
