"""Code answers: the last fenced code block (Python compared by its syntax tree).

Two candidates are the same when their ASTs are equal (comments, formatting and
docstrings ignored); a candidate that does not parse is compared by its stripped text.
With task tests, the sandbox runs each candidate (see :mod:`ponder.enhance.sandbox`) and
only the groups whose best candidate passes the most tests may win the vote.
"""

from __future__ import annotations

import ast
import re
import threading
import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ponder.enhance.answers.base import AnswerType, Question, register
from ponder.enhance.fences import extract_code_block, fenced_blocks
from ponder.enhance.sandbox import run_tests_async
from ponder.types import ReasoningPath, Sample, Task, TaskType

if TYPE_CHECKING:
    from ponder.config import Settings

__all__ = ["CodeAnswer"]

_warnings_lock = threading.Lock()


def _parse_python(code: str) -> ast.Module | None:
    """``ast.parse`` that returns None instead of raising (and ignores escape warnings)."""
    try:
        return ast.parse(code)
    except SyntaxError as e:
        # '\d' in a string is a DeprecationWarning at parse time; under "warnings are
        # errors" it surfaces as a SyntaxError. Retry with warnings ignored (the lock only
        # serialises our own use of the process-global warning filters).
        if "escape sequence" not in str(e):
            return None
    except (ValueError, RecursionError, MemoryError):
        return None
    with _warnings_lock, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return ast.parse(code)
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            return None


def _strip_docstrings(tree: ast.Module) -> ast.Module:
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if (
                body
                and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)
            ):
                node.body = body[1:] or [ast.Pass()]
    return tree


def _code_key(code: str) -> str:
    tree = _parse_python(code)
    if tree is None:
        return code.strip()
    try:
        return "ast:" + ast.dump(_strip_docstrings(tree))
    except (RecursionError, ValueError):
        return code.strip()


def _extract_code(text: str) -> str | None:
    block = extract_code_block(text)
    if block is not None:
        return block
    # No fence: the whole text counts when it is Python defining something.
    tree = _parse_python(text) if "\n" in text.strip() or "def " in text else None
    if tree is not None and any(
        isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) for n in tree.body
    ):
        return text.strip("\n")
    return None


def _pass_rate(group: Sequence[Sample]) -> float:
    """The best share of tests passed among the group's samples."""
    rates = [
        (s.tests_passed or 0) / max(1, (s.tests_passed or 0) + (s.tests_failed or 0)) for s in group
    ]
    return max(rates)


_CODE_REQUEST = re.compile(
    r"\b(?:write|implement|complete|create|define|code|fix|refactor|generate)\b[^.?!\n]{0,80}?"
    r"\b(?:function|program|script|class|method|code|snippet|algorithm)\b"
    r"|^[ \t]*(?:def\s+\w+\s*\(|class\s+\w+|import\s+\w+|from\s+[\w.]+\s+import\b)"
    r"|\bin\s+python\b",
    re.IGNORECASE | re.MULTILINE,
)


@register
class CodeAnswer(AnswerType):
    task_type = TaskType.code
    instruction = "Give the complete solution as one ```python code block."

    def instruction_for(self, path: ReasoningPath) -> str:
        """:attr:`instruction` on every path."""
        return self.instruction

    def extract(self, text: str, question: Question) -> str | None:
        return _extract_code(text)

    async def check(self, sample: Sample, task: Task, settings: Settings) -> None:
        """With task tests: run them on the sample's answer in the sandbox and count the
        tests passed and failed (a run that timed out is one more failure)."""
        if not task.tests or sample.answer is None:
            return
        report = await run_tests_async(
            sample.answer,
            task.tests,
            timeout_s=settings.sandbox_timeout_s * 2,
            memory_mb=settings.sandbox_memory_mb,
            isolation=settings.sandbox_isolation,
        )
        sample.isolation = report.isolation
        sample.tests_passed = report.passed
        sample.tests_failed = report.failed + (1 if report.timed_out else 0)

    def contenders(self, groups: list[list[Sample]]) -> list[list[Sample]]:
        """When tests ran: the groups whose best pass rate is the highest."""
        if not any(s.tests_passed is not None for g in groups for s in g):
            return groups
        best = max(_pass_rate(g) for g in groups)
        return [g for g in groups if _pass_rate(g) == best]

    def key(self, answer: str) -> str:
        """``ast.dump`` of the tree without docstrings (the stripped text if it does not
        parse)."""
        return _code_key(answer)

    def signals(self, text: str, answer: str | None) -> float:
        """1 when the answer parses as Python, 0.6 when it does not, 0 without one."""
        if answer is None:
            return 0.0
        return 1.0 if _parse_python(answer) is not None else 0.6

    def claim(self, prompt: str, outputs: Sequence[str]) -> int:
        if _CODE_REQUEST.search(prompt):
            return 50
        if outputs and sum(1 for o in outputs if fenced_blocks(o)) > len(outputs) / 2:
            return 30
        return 0
