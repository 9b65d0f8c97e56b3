"""The documentation's links: every relative link in the README and the pages beside it names a
file of the repository (a page renamed or never committed leaves its readers at a dead end)."""
from __future__ import annotations

import glob
import os
import re

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LINK = re.compile(r"\]\(([^)\s]+)\)")


def pages() -> list[str]:
    return [os.path.join(REPO, "README.md"),
            *sorted(p for folder in ("docs", "jobscripts", "data") for p in glob.glob(os.path.join(REPO, folder, "*.md")))]


def dead_links(page: str) -> list[str]:
    """The relative links of ``page`` (anchors dropped; URLs and in-page anchors skipped) whose
    file does not exist, relative to the page's folder."""
    with open(page) as f:
        text = f.read()
    dead = []
    for target in LINK.findall(text):
        path = target.split("#", 1)[0]
        if path and not re.match(r"[a-z][a-z0-9+.-]*:", path) \
                and not os.path.exists(os.path.normpath(os.path.join(os.path.dirname(page), path))):
            dead.append(target)
    return dead


def test_every_relative_link_names_a_file():
    assert len(pages()) > 10  # the README, docs/, jobscripts/ and data/ pages
    dead = {os.path.relpath(page, REPO): links for page in pages() if (links := dead_links(page))}
    assert not dead, f"links to no file: {dead}"


def test_the_check_finds_a_dead_link(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("[here](page.md) [gone](missing.md#part) [web](https://example.org/x.md) [anchor](#top)\n")
    assert dead_links(str(page)) == ["missing.md#part"]
