"""No page of the repository points outside it, and every relative link resolves.

Scans every markdown file of the repository (tracked, or new and not ignored) and the
source files under src/: no path into the workspace around the checkout (``../shared``,
``/work/``), and every relative markdown link (``[text](path)``, images too) names a
file or folder that exists inside the repository.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.docs.markdown import ROOT, tracked

OUTSIDE = re.compile(r"\.\./shared\b|/work/|\.\./\.\./")
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")


def _pages() -> list[Path]:
    return tracked("*.md")


def _sources() -> list[Path]:
    return [
        p for p in tracked("src/*") if p.suffix in (".py", ".md", ".html", ".js", ".css", ".txt")
    ]


def test_the_scan_sees_the_pages() -> None:
    pages = _pages()
    assert ROOT / "README.md" in pages and ROOT / "docs" / "API.md" in pages
    assert len(_sources()) > 20


@pytest.mark.parametrize("path", _pages() + _sources(), ids=lambda p: str(p.relative_to(ROOT)))
def test_nothing_points_outside_the_repository(path: Path) -> None:
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        assert not OUTSIDE.search(line), f"{path.relative_to(ROOT)}:{number}: {line.strip()}"


@pytest.mark.parametrize("path", _pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve_inside_the_repository(path: Path) -> None:
    text = re.sub(r"```.*?```", "", path.read_text(encoding="utf-8"), flags=re.S)
    for target in LINK.findall(text):
        if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue  # a URL, or an anchor of this page
        file = (path.parent / target.split("#", 1)[0]).resolve()
        where = f"{path.relative_to(ROOT)}: ({target})"
        assert file.is_relative_to(ROOT), f"{where} points outside the repository"
        assert file.exists(), f"{where} does not exist"
