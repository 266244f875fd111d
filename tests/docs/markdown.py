"""Reading the repository's markdown: its files, fenced blocks, sections and links."""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: the pages whose examples run against a live service
EXAMPLE_PAGES = ("README.md", "docs")
#: languages of the blocks that run; a block of another language never runs
RUNNABLE = frozenset({"sh", "bash", "python"})
#: the languages of an output block (right after a runnable block: what it printed)
OUTPUT = frozenset({"text"})
#: ``<!-- no-run: reason -->`` on the line before a block keeps it from running
NO_RUN = re.compile(r"<!--\s*no-run:\s*(.+?)\s*-->")

_FENCE = re.compile(r"^(```+)\s*([\w+-]*)\s*$")


@dataclass
class Block:
    path: Path
    line: int  # of the opening fence, 1-based
    lang: str
    code: str
    no_run: str | None  # the reason, when marked
    output: str | None = None  # the output block right after it, if any

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"

    @property
    def runs(self) -> bool:
        return self.lang in RUNNABLE and self.no_run is None


def tracked(pattern: str) -> list[Path]:
    """Files of the repository (tracked, or new and not ignored) matching ``pattern``."""
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "--", pattern],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return sorted({ROOT / line for line in out.splitlines() if (ROOT / line).is_file()})


def example_pages() -> list[Path]:
    pages = [ROOT / "README.md"]
    pages += [p for p in tracked("docs/*.md") if p.parent == ROOT / "docs"]
    return pages


def blocks(path: Path) -> list[Block]:
    """The fenced blocks of a page; an output block is attached to the block before it."""
    lines = path.read_text(encoding="utf-8").splitlines()
    found: list[Block] = []
    i = 0
    last_end = -10  # the line index of the closing fence of the previous block
    while i < len(lines):
        match = _FENCE.match(lines[i])
        if not match:
            i += 1
            continue
        fence, lang = match[1], match[2].lower()
        start = i
        i += 1
        body: list[str] = []
        while i < len(lines) and lines[i].strip() != fence:
            body.append(lines[i])
            i += 1
        if i >= len(lines):
            raise AssertionError(f"{path.relative_to(ROOT)}:{start + 1}: unclosed ``` block")
        before = next((lines[j] for j in range(start - 1, -1, -1) if lines[j].strip()), "")
        marker = NO_RUN.search(before)
        code = "\n".join(body) + "\n"
        between = lines[last_end + 1 : start]
        if lang in OUTPUT and found and not any(s.strip() for s in between):
            found[-1].output = code
        else:
            found.append(Block(path, start + 1, lang, code, marker[1] if marker else None))
        last_end = i
        i += 1
    return found


def sections(text: str) -> list[tuple[str, str]]:
    """``(heading, body)`` of every heading, the body running to the next heading."""
    out: list[tuple[str, str]] = []
    heading, body = "", list[str]()
    in_fence = False
    for line in text.splitlines():
        if line.startswith("```"):
            in_fence = not in_fence
        if not in_fence and re.match(r"#{1,6} ", line):
            out.append((heading, "\n".join(body)))
            heading, body = line.lstrip("#").strip(), []
        else:
            body.append(line)
    out.append((heading, "\n".join(body)))
    return out
