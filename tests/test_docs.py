"""The documentation's links and size: every relative link of every Markdown page of the repository
names a file of it, and an anchor names a heading of its page (a page renamed, split or never
committed, or a section moved, leaves its readers at a dead end); every page of docs/ is reached
from the README by links (the README is the entry point); and no page of docs/ is over 30 KB."""
from __future__ import annotations

import os
import re

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LINK = re.compile(r"\]\(([^)\s]+)\)")
# Folders that hold no page of ours: the environment, run outputs, the shared data, build metadata.
SKIP = {".venv", "venv", "node_modules", "runs", "shared", "build", "dist", "__pycache__"}
MAX_PAGE_BYTES = 30 * 1024


def pages() -> list[str]:
    """Every Markdown file of the repository (hidden folders and those in ``SKIP`` left out), so a
    page added anywhere is checked without this list being told of it."""
    found = []
    for root, dirs, files in os.walk(REPO):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in SKIP and not d.endswith(".egg-info"))
        found += [os.path.join(root, f) for f in sorted(files) if f.endswith(".md")]
    return found


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped but ``-`` and ``_``, spaces to
    hyphens (``## The time model`` -> ``the-time-model``)."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: str) -> set[str]:
    """The anchors of ``page``'s headings (outside code fences), a repeated one numbered as GitHub
    numbers it (``-1``, ``-2``)."""
    found: set[str] = set()
    seen: dict[str, int] = {}
    fenced = False
    with open(page) as f:
        for line in f:
            if line.startswith("```"):
                fenced = not fenced
            if fenced or not (m := re.match(r"#{1,6} (.+)", line)):
                continue
            s = slug(m.group(1))
            found.add(f"{s}-{seen[s]}" if s in seen else s)
            seen[s] = seen.get(s, 0) + 1
    return found


def relative_links(page: str) -> list[tuple[str, str, str]]:
    """(link, file it names, anchor) for every relative link of ``page`` (URLs skipped); an in-page
    anchor names ``page`` itself."""
    with open(page) as f:
        text = f.read()
    links = []
    for target in LINK.findall(text):
        path, _, anchor = target.partition("#")
        if re.match(r"[a-z][a-z0-9+.-]*:", path):
            continue
        links.append((target, os.path.normpath(os.path.join(os.path.dirname(page), path)) if path else page, anchor))
    return links


def dead_links(page: str) -> list[str]:
    """The relative links of ``page`` whose file does not exist, relative to the page's folder, or
    whose anchor names no heading of the Markdown page it points into."""
    dead = []
    for target, file, anchor in relative_links(page):
        if not os.path.exists(file):
            dead.append(target)
        elif anchor and file.endswith(".md") and anchor not in anchors(file):
            dead.append(target)
    return dead


def test_the_check_covers_every_page():
    """Every page a reader opens: the README, docs/, jobscripts/ and data/ among them."""
    found = {os.path.relpath(p, REPO) for p in pages()}
    expected = {"README.md", "jobscripts/README.md", "data/README.md"}
    expected |= {f"docs/{f}" for f in os.listdir(os.path.join(REPO, "docs")) if f.endswith(".md")}
    assert expected <= found, f"pages the check misses: {sorted(expected - found)}"
    assert len(found) > 10


def test_every_relative_link_names_a_file_and_heading():
    dead = {os.path.relpath(page, REPO): links for page in pages() if (links := dead_links(page))}
    assert not dead, f"links to no file or no heading: {dead}"


def test_the_check_finds_a_dead_link(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# Top part\n\n## The `time` model (here)\n\n"
                    "[here](page.md) [gone](missing.md#part) [web](https://example.org/x.md) [anchor](#top-part)\n"
                    "[section](page.md#the-time-model-here) [moved](page.md#old-section) [lost](#nowhere)\n")
    assert dead_links(str(page)) == ["missing.md#part", "page.md#old-section", "#nowhere"]


def test_every_docs_page_is_reached_from_the_readme():
    """The README is the entry point: following links from it reaches every page of docs/, so a
    page split off another (a results page, say) is not left where no reader finds it."""
    reached, todo = set(), [os.path.join(REPO, "README.md")]
    while todo:
        page = todo.pop()
        if page in reached:
            continue
        reached.add(page)
        todo += [file for _, file, _ in relative_links(page) if file.endswith(".md") and os.path.isfile(file)]
    docs = {os.path.join(REPO, "docs", f) for f in os.listdir(os.path.join(REPO, "docs")) if f.endswith(".md")}
    unreached = sorted(os.path.relpath(p, REPO) for p in docs - reached)
    assert not unreached, f"pages no link from the README leads to: {unreached}"


def test_no_docs_page_is_over_30_kb():
    """A page over 30 KB (30,720 bytes) reads as a lab notebook: its first screen no longer says
    what it is for, what to run and what to expect, and a reader has to dig for it. Measurements
    and the history of how a figure was reached belong on results pages, split by topic or date
    when one grows past this size (docs/results-agent.md, docs/results-simulator.md)."""
    sizes = {f: os.path.getsize(os.path.join(REPO, "docs", f)) for f in sorted(os.listdir(os.path.join(REPO, "docs")))
             if f.endswith(".md")}
    over = {f: n for f, n in sizes.items() if n > MAX_PAGE_BYTES}
    assert not over, f"docs pages over {MAX_PAGE_BYTES} bytes: {over}"
