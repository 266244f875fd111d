"""The answer-type contract, its registry, and text helpers shared by the types.

An :class:`AnswerType` owns everything that depends on a task type: the reasoning paths
its samples may take and the instruction each gets, extracting the final answer from a
sample (its text, or what its program printed), running a sample's program or the task's
tests, the cheap canonical key, the equivalence test that keys cannot decide, which
groups of answers may win the vote, the reasoning signals used as a confidence feature,
and how strongly a prompt (or a set of outputs) looks like its type. One class per type,
registered with :func:`register`; :data:`ANSWER_TYPES` maps each
:class:`~ponder.types.TaskType` to its instance. :class:`ponder.enhance.strategy.Strategy`
asks the task's answer type and never tests the task type itself.
"""

from __future__ import annotations

import re
import unicodedata
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar, TypeVar

from ponder.types import ReasoningPath, Sample, Task, TaskType

if TYPE_CHECKING:
    from ponder.config import Settings

__all__ = [
    "ANSWER_LINE",
    "ANSWER_TYPES",
    "PATH_INSTRUCTIONS",
    "TAIL_CHARS",
    "AnswerType",
    "Question",
    "all_boxed",
    "anchored_statements",
    "normalise_text",
    "register",
    "statement_signals",
]

#: extraction looks at the end of long texts only (final answers are stated last)
TAIL_CHARS = 20_000
#: "End with the sentence: The answer is <answer>." — every chain-of-thought path asks it
ANSWER_LINE = "End with the sentence: The answer is <answer>."
#: the system instruction of each reasoning path every type allows (``pot`` is math's)
PATH_INSTRUCTIONS = {
    ReasoningPath.cot: f"Think step by step. {ANSWER_LINE}",
    ReasoningPath.decompose: (
        "Break the problem into smaller sub-questions and answer each one in turn, "
        f"then combine them. {ANSWER_LINE}"
    ),
}


@dataclass(frozen=True)
class Question:
    """What the answer types know of the task beyond one sample's text.

    ``options`` maps each option letter of a multiple-choice prompt to its text
    (``{"A": "Venus", "B": "Mars"}``); ``words`` are the prompt's normalised words, used
    to cut restatements of the question out of free-text answers; ``asked`` are the words
    of the sentences that ask (those ending in "?"; all words when none does): an answer
    made of these only restates the question ("Kai to Aria" for "What is Kai to Aria?").
    """

    prompt: str = ""
    options: dict[str, str] = field(default_factory=dict)
    words: frozenset[str] = frozenset()
    asked: frozenset[str] = frozenset()


class AnswerType(ABC):
    """How one task type's answers are extracted, keyed, compared and judged.

    Contract: :meth:`extract` never raises on any string and returns None when the text
    states no answer (such a sample does not vote); :meth:`same` is reflexive and
    symmetric; equal :meth:`key` values imply :meth:`same`. Everything is CPU work that
    is safe from any thread (an event loop calls it through ``asyncio.to_thread``).
    """

    task_type: ClassVar[TaskType]
    #: the system instruction of a chain-of-thought sample of this type
    instruction: ClassVar[str] = PATH_INSTRUCTIONS[ReasoningPath.cot]
    #: the reasoning paths a sample of this type may take (a mode's ``paths``); a path
    #: not listed runs as ``cot``
    paths: ClassVar[frozenset[ReasoningPath]] = frozenset(PATH_INSTRUCTIONS)

    def instruction_for(self, path: ReasoningPath) -> str:
        """The system instruction of a sample on ``path`` (one of :attr:`paths`): the
        path's own for ``decompose``, else :attr:`instruction`."""
        if path == ReasoningPath.decompose:
            return PATH_INSTRUCTIONS[ReasoningPath.decompose]
        return self.instruction

    def reminder_for(self, path: ReasoningPath) -> str | None:
        """Text appended to the user's last message on ``path`` (the instruction again,
        after the question, where a small model follows the question's own wording over
        the system message); None by default."""
        return None

    def answer_text(self, sample: Sample) -> str:
        """The text a sample's answer is extracted from: its text."""
        return sample.text or ""

    async def prepare(self, sample: Sample, task: Task, settings: Settings) -> None:
        """Before the answer is extracted from a finished sample (math: run the program
        of a program-of-thought sample). Nothing by default."""
        return None

    async def check(self, sample: Sample, task: Task, settings: Settings) -> None:
        """After the answer is extracted (code: run the task's tests on it and record
        the counts on the sample). Nothing by default."""
        return None

    def contenders(self, groups: list[list[Sample]]) -> list[list[Sample]]:
        """The groups of same-answer samples that may win the vote: all of them by
        default (code: those that pass the most tests)."""
        return groups

    def question(self, prompt: str) -> Question:
        """What this type needs to know of the prompt (see :class:`Question`)."""
        words = frozenset(normalise_text(prompt).split())
        sentences = re.split(r"(?<=[.!?])\s+|\n", prompt[-TAIL_CHARS:])
        asks = " ".join(s for s in sentences if s.rstrip().endswith("?"))
        asked = frozenset(normalise_text(asks).split()) if asks else words
        return Question(prompt=prompt, words=words, asked=asked)

    @abstractmethod
    def extract(self, text: str, question: Question) -> str | None:
        """The final answer stated in ``text`` (a short display string), or None."""

    @abstractmethod
    def key(self, answer: str) -> str:
        """A canonical string: answers with equal keys are the same answer."""

    def same(self, a: str, b: str) -> bool:
        """Whether two extracted answers are the same (keys decide unless overridden)."""
        return a == b or self.key(a) == self.key(b)

    def signals(self, text: str, answer: str | None) -> float:
        """A heuristic in [0, 1] for how well the text supports its answer (0 without one)."""
        return 0.0 if answer is None else 1.0

    def claim(self, prompt: str, outputs: Sequence[str]) -> int:
        """How strongly ``prompt`` (or most ``outputs``) looks like this type; 0: not at all.

        :func:`ponder.enhance.answers.infer_task_type` picks the strongest claim.
        """
        return 0


_A = TypeVar("_A", bound=AnswerType)

#: the answer type of each task type (``auto`` has none: it is resolved first)
ANSWER_TYPES: dict[TaskType, AnswerType] = {}


def register(cls: type[_A]) -> type[_A]:
    """Class decorator: add an instance of ``cls`` to :data:`ANSWER_TYPES`."""
    if cls.task_type in ANSWER_TYPES:
        raise ValueError(f"answer type {cls.task_type.value!r} is registered twice")
    ANSWER_TYPES[cls.task_type] = cls()
    return cls


# ---------------------------------------------------------------------------------------
# Helpers shared by several types
# ---------------------------------------------------------------------------------------

_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")


def _brace_pairs(text: str) -> dict[int, int]:
    """Index of each '{' mapped to its matching '}' (unbalanced ones left out); linear."""
    pairs: dict[int, int] = {}
    stack: list[int] = []
    for i, c in enumerate(text):
        if c == "{":
            stack.append(i)
        elif c == "}" and stack:
            pairs[stack.pop()] = i
    return pairs


def all_boxed(text: str) -> list[str]:
    """The contents of every balanced ``\\boxed{…}``/``\\fbox{…}``, in order."""
    if "\\boxed" not in text and "\\fbox" not in text:
        return []
    pairs = _brace_pairs(text)
    found = []
    for m in _BOXED.finditer(text):
        close = pairs.get(m.end() - 1)
        if close is not None and text[m.end() : close].strip():
            found.append(text[m.end() : close].strip())
    return found


#: "the answer is", "Answer:", "the final answer to this question is", "answer = "
ANSWER_ANCHOR = re.compile(
    r"(?:final\s+answer|\banswer)(?:\s+to\s+(?:the|this|that|your)(?:\s+[A-Za-z-]+){1,3}?)?"
    r"\s*(?:\*\*\s*)?(?:is|would\s+be|will\s+be|should\s+be|=|:)\s*(?:\*\*\s*)?:?",
    re.IGNORECASE,
)


def anchored_statements(text: str) -> list[str]:
    """Raw remainders after each "answer is"/"Answer:" anchor, in order (first line)."""
    out = []
    for m in ANSWER_ANCHOR.finditer(text):
        rest = text[m.end() :]
        line = rest.split("\n", 1)[0].strip()
        if not line:
            nxt = [ln for ln in rest.split("\n")[:4] if ln.strip()]
            line = nxt[0].strip() if nxt else ""
        out.append(line)
    return out


def statement_signals(work: float, stated: Sequence[str]) -> float:
    """``0.4 * work + 0.4 * consistent + 0.2 * restated`` from the keys of a text's final
    statements: consistent is 0 when they differ; restated is 1 for two or more that
    agree, 0.5 for one, 0.25 for none (the answer came from a fallback)."""
    consistent = 0.0 if len(set(stated)) > 1 else 1.0
    if len(stated) >= 2 and len(set(stated)) == 1:
        restated = 1.0
    elif stated:
        restated = 0.5
    else:
        restated = 0.25
    return max(0.0, min(1.0, 0.4 * work + 0.4 * consistent + 0.2 * restated))


class _PunctuationAsSpace(dict[int, int]):
    """``str.translate``'s table: punctuation and symbols (Unicode categories P*, S*) to a
    space, every other character to itself. Filled as characters are met, below U+3000
    only (Latin, Greek, Cyrillic, general punctuation, math symbols: a bounded table);
    above, each is looked up again. Per character in C, where a generator over the
    characters cost ~0.1 µs each (42 µs for a 470-character prompt, 5 µs this way)."""

    def __missing__(self, code: int) -> int:
        mapped = 32 if unicodedata.category(chr(code))[0] in "PS" else code
        if code < 0x3000:
            self[code] = mapped
        return mapped


_PUNCTUATION_AS_SPACE = _PunctuationAsSpace()


def normalise_text(s: str) -> str:
    """NFKC, case-folded, punctuation and symbols as spaces, whitespace collapsed."""
    s = unicodedata.normalize("NFKC", s).casefold().translate(_PUNCTUATION_AS_SPACE)
    return " ".join(s.split())


def connected_groups(
    keys: Sequence[str | None], same: Callable[[int, int], bool], budget: Callable[[], bool]
) -> list[list[int]]:
    """Indices partitioned into the connected components of "equal key or ``same``".

    ``keys[i]`` None (no answer) is a group of its own. Components of a symmetric
    relation do not depend on the order of the items, so neither do the groups.
    ``same(i, j)`` is asked for one representative per key only, while ``budget()``
    is true. Groups are sorted, and ordered by their first index.
    """
    parent = list(range(len(keys)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    def union(i: int, j: int) -> None:
        ri, rj = find(i), find(j)
        if ri != rj:
            parent[max(ri, rj)] = min(ri, rj)

    first: dict[str, int] = {}
    for i, key in enumerate(keys):
        if key is None:
            continue
        if key in first:
            union(first[key], i)
        else:
            first[key] = i
    reps = list(first.values())
    for x, i in enumerate(reps):
        for j in reps[x + 1 :]:
            if find(i) != find(j) and budget() and same(i, j):
                union(i, j)
    groups: dict[int, list[int]] = {}
    for i in range(len(keys)):
        groups.setdefault(find(i), []).append(i)
    return sorted(groups.values(), key=lambda g: g[0])
