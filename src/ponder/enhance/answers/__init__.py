"""Answer extraction and equivalence per task type, for the vote.

One :class:`~ponder.enhance.answers.base.AnswerType` per task type, each in its own
module of this package (``math``, ``choice``, ``code``, ``text``) and registered in
:data:`ANSWER_TYPES`; every module of the package is imported here, so adding a type is
adding one module (and its :class:`~ponder.types.TaskType` value). The functions below
resolve a task type (``auto`` included) and delegate to its answer type:

1. :func:`extract_answer` pulls the final answer out of a sample's text as a short
   display string ("12", "B", a code block, "Paris"), or None when none is stated.
2. :func:`canonical_key` maps an answer to a cheap canonical string; equal keys are the
   same answer.
3. :func:`same_answer` decides whether two answers (None: no answer) fall in one group
   of :func:`group_answers`; the types decide what keys cannot (math through
   math-verify, text by entailment of the short answers).
4. :func:`group_answers` partitions answers into the connected components of "same
   key or same answer": the groups do not depend on the order of the answers.
"""

from __future__ import annotations

import importlib
import pkgutil
import time
from collections.abc import Sequence

from ponder.enhance.answers.base import (
    ANSWER_TYPES,
    AnswerType,
    Question,
    connected_groups,
)
from ponder.enhance.answers.text import TEXT_SIMILARITY_THRESHOLD
from ponder.enhance.fences import extract_code_block
from ponder.types import TaskType

for _module in pkgutil.iter_modules(__path__):
    if not _module.name.startswith("_") and _module.name != "base":
        importlib.import_module(f"{__name__}.{_module.name}")

__all__ = [
    "ANSWER_TYPES",
    "GROUP_BUDGET_S",
    "TEXT_SIMILARITY_THRESHOLD",
    "AnswerType",
    "Question",
    "answer_type",
    "canonical_key",
    "extract_answer",
    "extract_code_block",
    "group_answers",
    "infer_task_type",
    "reasoning_signals",
    "same_answer",
]

#: group_answers stops pairwise (math-verify / entailment) checks after this long
GROUP_BUDGET_S = 15.0


def _task_type(task_type: TaskType | str) -> TaskType:
    try:
        return TaskType(task_type)
    except ValueError:
        allowed = ", ".join(t.value for t in TaskType)
        raise ValueError(f"Unknown task type: {task_type!r}; expected one of {allowed}") from None


def infer_task_type(prompt: str, outputs: Sequence[str] = ()) -> TaskType:
    """Resolve ``auto``: the type whose claim on the prompt (or most outputs) is strongest.

    In order of strength: the prompt asks for a function/program (or is Python source) →
    code; the prompt lists options ("A) … B) …", "(A) … (B) …", "A. …" lines) → choice;
    most outputs contain fenced code → code; the prompt looks like arithmetic or a word
    problem → math; most outputs end in a number or state it with ``\\boxed``/``####`` →
    math; else text.
    """
    prompt = prompt[-20_000:]
    outs = [o[-20_000:] for o in outputs if o]
    best, strength = TaskType.text, 0
    for task_type, kind in ANSWER_TYPES.items():
        claim = kind.claim(prompt, outs)
        if claim > strength:
            best, strength = task_type, claim
    return best


def answer_type(task_type: TaskType | str, texts: Sequence[str | None] = ()) -> AnswerType:
    """The answer type of ``task_type``; ``auto`` is inferred from ``texts``."""
    t = _task_type(task_type)
    if t is TaskType.auto:
        t = infer_task_type("", [x for x in texts if x])
    return ANSWER_TYPES[t]


def extract_answer(
    text: str, task_type: TaskType | str, question: Question | None = None
) -> str | None:
    """The final answer stated in a sample's ``text``; None if it states none.

    ``question`` (from ``answer_type(t).question(prompt)``) gives what the prompt says:
    the options of a multiple-choice question, the words a free-text answer may restate.
    ``auto`` is inferred from the text alone. Never raises on any string input.
    """
    kind = answer_type(task_type, [text])
    if not text or not text.strip():
        return None
    return kind.extract(text, question or Question())


def canonical_key(answer: str, task_type: TaskType | str) -> str:
    """A canonical form of an extracted answer: equal keys mean the same answer."""
    return answer_type(task_type, [answer]).key(answer)


def same_answer(a: str | None, b: str | None, task_type: TaskType | str) -> bool:
    """Whether two answers are the same answer: whether :func:`group_answers` puts them in
    one group (symmetric; reflexive on answers; None, no answer, is never the same)."""
    return group_answers([a, b], task_type) == [[0, 1]]


def reasoning_signals(text: str, answer: str | None, task_type: TaskType | str) -> float:
    """A heuristic in [0, 1] for how well a sample supports its answer (0 without one)."""
    return answer_type(task_type, [text]).signals(text, answer)


def group_answers(answers: Sequence[str | None], task_type: TaskType | str) -> list[list[int]]:
    """Indices of ``answers`` partitioned into groups of the same answer, by first index.

    None (no answer) is never grouped with anything. The groups are the connected
    components of "equal key, or :func:`same_answer`" and so do not depend on the order
    of ``answers``; pairwise checks stop after ``GROUP_BUDGET_S`` (keys alone then
    decide), so the call is bounded. CPU work: call it off the event loop.
    """
    kind = answer_type(task_type, answers)
    keys = [None if a is None else kind.key(a) for a in answers]
    deadline = time.monotonic() + GROUP_BUDGET_S

    def same(i: int, j: int) -> bool:
        a, b = answers[i], answers[j]
        return a is not None and b is not None and kind.same(a, b)

    return connected_groups(keys, same, lambda: time.monotonic() < deadline)
