"""Every relative link of README.md, CHANGELOG.md and docs/ names a file
of the repository: a page moved or removed takes its links with it.

A link is the target of a Markdown inline link, ``[text](target)``; its
``#fragment`` is left out. Not checked: a URL (``scheme:``), a bare
fragment (``#section``) and a path under ``dist/`` or ``build/``, which
``scripts/build`` generates.
"""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = sorted(
    [ROOT / "README.md", ROOT / "CHANGELOG.md", *(ROOT / "docs").glob("*.md")]
)
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
GENERATED = ("dist/", "build/")


def _relative_links(page):
    """The relative link targets of ``page`` (a Path), without fragments."""
    for target in LINK.findall(page.read_text(encoding="utf-8")):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue
        path = target.split("#", 1)[0]
        if path and not path.startswith(GENERATED):
            yield path


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_relative_links_name_files(page):
    missing = [
        link
        for link in _relative_links(page)
        if not (page.parent / link).exists()
    ]
    assert not missing, f"{page.relative_to(ROOT)} links to no file: {missing}"
