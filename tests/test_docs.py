"""The docs: every relative link of the README and docs/ resolves (a file that
exists; a heading that exists where the link names one), the README stays a
few screens, and the site builds with Sphinx and MyST with warnings as errors
(pip install '.[docs]'; CI has it)."""

import os
import pathlib
import re
import subprocess
import sys

import pytest

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
