"""Fenced code blocks in a model's text (Markdown ``` or ~~~ fences).

The code answer type takes a sample's last block as its answer
(:func:`extract_code_block`), and a program-of-thought sample's program is its last
``python`` block (:func:`extract_program_output`), which the sandbox runs. Below both
the answer types and the sandbox: it imports neither.
"""

from __future__ import annotations

import re

__all__ = ["extract_code_block", "extract_program_output", "fenced_blocks"]

_FENCE_OPEN = re.compile(r"^[ \t]*(`{3,}|~{3,})[ \t]*([\w+#.-]*)")


def fenced_blocks(text: str) -> list[tuple[str, str]]:
    """All fenced blocks as (language, body), in order; an unclosed last fence runs to the end.

    A line scanner rather than one regex: linear on any input.
    """
    blocks: list[tuple[str, str]] = []
    fence: str | None = None
    lang = ""
    body: list[str] = []
    for line in text.splitlines():
        if fence is None:
            m = _FENCE_OPEN.match(line)
            if m:
                fence, lang, body = m[1], m[2].lower(), []
        elif line.strip() == fence or (
            line.strip().startswith(fence[:3]) and set(line.strip()) == {fence[0]}
        ):
            blocks.append((lang, "\n".join(body)))
            fence = None
        else:
            body.append(line)
    if fence is not None and body:
        blocks.append((lang, "\n".join(body)))
    return blocks


_PYTHON_LANGS = frozenset({"python", "py", "python3", "py3"})


def extract_code_block(text: str, *, python_only: bool = False) -> str | None:
    """The last fenced code block of ``text`` (its body, without the fences), or None.

    With ``python_only`` the last block tagged python/py/python3 is preferred and an
    untagged block is the fallback; blocks in other languages are skipped.
    """
    blocks = fenced_blocks(text)
    if python_only:
        tagged = [b for lang, b in blocks if lang in _PYTHON_LANGS]
        if tagged:
            return tagged[-1].strip("\n") or None
        blocks = [(lang, b) for lang, b in blocks if not lang]
    for _lang, body in reversed(blocks):
        if body.strip():
            return body.strip("\n")
    return None


def extract_program_output(text: str) -> str | None:
    """The program in a model answer: its last fenced ``python`` block (an untagged block
    if none is tagged), or None."""
    return extract_code_block(text, python_only=True)
