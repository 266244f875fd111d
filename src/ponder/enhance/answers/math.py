"""Math answers: numbers and LaTeX expressions.

Extraction, in order: the last ``\\boxed{}``; the last ``####``; the last "the answer
is …"/"Answer: …" that states something mathy; else the last *stated result* — a number
that is not an operand of an arithmetic expression ("2 + 2 is 4, which is the answer to
the equation 2 + 2" gives 4, not 2; "= 8", "leaving 3", "there are 1,500"), nor a
quantity referred back to ("so 42 remain, out of the 60 we started with" gives 42). A
text whose numbers are all operands ("To find 3 + 5, add them together.") states no
answer: None.

Choices (also stated in the tests):

* **Percent** is a unit, dropped like any other: ``50%`` == ``50``, and ``50%`` != ``0.5``
  (counting ``0.5`` as well would make the relation non-transitive: 50 = 50% = 0.5 ≠ 50).
* **Units and trailing words** are dropped (``12 apples`` → ``12``), as are currency
  signs (``$5``, ``\\$5``), degree signs and ``\\text{…}`` units; a number followed by a
  comment ("0.125, which is 12.5%") is that number.
* **Plain rationals** (integers, decimals, ``a/b``, ``\\frac{a}{b}``) compare exactly
  through their key: ``1.2`` != ``12`` and ``0.33`` != ``1/3``. Everything else goes to
  math-verify, in the bounded process pool of :mod:`ponder.enhance.mathverify`; answers
  longer than :data:`MAX_MATH_CHARS` are compared by key only.

Math is the one type whose samples may take the program-of-thought path (``pot``): the
sample writes a Python program, the sandbox runs it, and the answer is the last line it
printed.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from fractions import Fraction
from typing import TYPE_CHECKING

from ponder.enhance.answers.base import (
    ANSWER_ANCHOR,
    PATH_INSTRUCTIONS,
    TAIL_CHARS,
    AnswerType,
    Question,
    all_boxed,
    anchored_statements,
    register,
    statement_signals,
)
from ponder.enhance.mathverify import get_pool
from ponder.enhance.programs import run_program
from ponder.types import ReasoningPath, Sample, Task, TaskType

if TYPE_CHECKING:
    from ponder.config import Settings

__all__ = ["MAX_MATH_CHARS", "MathAnswer", "clean_math", "cut_sentence"]

#: math answers longer than this are compared by canonical key only
MAX_MATH_CHARS = 300

_HASHES = re.compile(r"####\s*([^\n]*)")
_SENTENCE_END = re.compile(r"\.(?:\s|$)|\s[-\u2013\u2014]\s|;|\bI hope\b", re.IGNORECASE)
_NUMBER = re.compile(
    r"(?:(?<=^)|(?<=[\s(\[{$=:]))-?\$?\d{1,3}(?:,\d{3})+(?:\.\d+)?%?"
    r"|(?:(?<=^)|(?<=[\s(\[{$=:]))-\$?\d+(?:\.\d+)?(?:/\d+)?%?"
    r"|\d+(?:\.\d+)?(?:/\d+)?%?"
)
#: an arithmetic operator between numbers ("x" only between spaces: "3 x 4")
_OPERATOR = r"(?:[-+*/\u00d7\u00f7^]|\s[xX]\s|\\times|\\cdot|\\div)"
_OPERAND_AFTER = re.compile(
    rf"^\s*\)?\s*{_OPERATOR}\s*\(?\s*\$?\d|^\s*\)?\s*=|^\s*(?:[-+*/\u00d7\u00f7^]|\s[xX])\s*$"
)
_RESULT_TAIL = (
    r"(?:\s+(?:us|you|me))?\s*(?:\*\*)?\s*"
    r"(?:approximately\s+|about\s+|exactly\s+|only\s+|simply\s+|just\s+)?\(?\s*\$?\s*$"
)
#: a result verb just before a number: "= 8", "is 4", "equals 12", "leaving 3", "gives us 7"
_RESULT_BEFORE = re.compile(
    r"(?:=|\b(?:is|are|was|were|be|equals?|gives?|gave|makes?|made|leaves|leaving|left\s+with|"
    r"total(?:\s+of)?|results?\s+in|comes?\s+to))" + _RESULT_TAIL,
    re.IGNORECASE,
)
#: a number referred back to, not a result: "out of the 60", "of all 60", "from 60", "than 5",
#: "started with 60" ("…so 42 remain, out of the 60 we started with" states 42)
_REFERENCE_BEFORE = re.compile(
    r"\b(?:out\s+of|of\s+(?:the|all|those|these)|from|than|(?:start|started|began)\s+with)"
    r"(?:\s+(?:the|all|those|these))?\s*\$?\s*$",
    re.IGNORECASE,
)
#: a number that enumerates: a list marker ("1. ", "2) ") or a step ("Step 3")
_ENUMERATES = re.compile(r"(?:^|\n)[ \t*#]*$|\bstep\s*$", re.IGNORECASE)
#: an operand: a number (and its unit: "12 pages / 1") before an operator
_OPERAND_BEFORE = re.compile(rf"\d(?:\s*[A-Za-z']+){{0,2}}\s*\)?\s*{_OPERATOR}\s*\(?\s*\$?$")
_FUNCTIONS = r"(?:sin|cos|tan|cot|sec|csc|log|ln|exp|sqrt|mod|arcsin|arccos|arctan)"
_LEADING_FILLER = re.compile(
    r"^(?:approximately|approx\.?|about|around|roughly|exactly|only|just|equal\s+to|equals|"
    r"a\s+total\s+of|total\s+of|of|is|be|\\approx|≈|~)\s*",
    re.IGNORECASE,
)
_TEXT_CMD = re.compile(r"\\(?:text|textbf|textit|mathrm|mathbf|mbox|operatorname)\s*\{([^{}]*)\}")
_DEGREES = re.compile(r"\^\s*\{?\s*\\circ\s*\}?|\\circ|°|\\degree")
_TRAILING_WORDS = re.compile(r"(?<=[\d}).%])\s+[A-Za-z][A-Za-z'\u2019]+(?:\b.*)?$", re.DOTALL)
_VAR_ASSIGN = re.compile(r"^[A-Za-z](?:_\{?\w+\}?)?\s*=\s*(?=\S)")
_CURRENCY = re.compile(r"^(?:\\\$|\$|€|£|¥|USD\s*|US\$)\s*(?=[-\d.])")
_COMMENTED_NUMBER = re.compile(
    r"^(-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?%?)\s*(?:[,;(]\s*|\s)(?:which|that|this|because|"
    r"since|as|so|and|or|i\.e|meaning|or\s+about|approximately)\b",
    re.IGNORECASE,
)
_THOUSANDS = re.compile(r"^[-+]?\d{1,3}(?:,\d{3})+(?:\.\d+)?$")
#: a plain integer (at most 100 digits: a longer one is not converted): :func:`clean_math`
#: leaves it as it is and its key is its value, so both skip their general path (the
#: commonest answer, and the question's numbers, which every sample's extraction keys)
_PLAIN_INT = re.compile(r"-?\d{1,100}")
_DECIMAL = re.compile(r"^[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d{1,3})?$")
_RATIO = re.compile(r"^([-+]?\d+)/(\d+)$")
_FRAC = re.compile(
    r"^([-+]?)\\frac\{([-+]?\d+(?:\.\d+)?)\}\{([-+]?\d+(?:\.\d+)?)\}$|^([-+]?)\\frac(\d)(\d)$"
)
_WORK_STEP = re.compile(r"\d\s*[-+*/\u00d7\u00f7^]\s*\(?\d|=\s*\$?-?\d|\\(?:frac|times|cdot)")
_MATH_PROMPT = re.compile(
    r"\d\s*[-+*/\u00d7\u00f7^=<>]\s*\d|\bhow\s+(?:many|much|long|far|old)\b|\\frac|\\sqrt|\\boxed"
    r"|\b(?:calculate|compute|solve|evaluate|simplify|sum|product|percent(?:age)?|average|"
    r"probability|equation|integer|remainder|digits?|total|cost|price|area|volume|"
    r"perimeter|ratio)\b",
    re.IGNORECASE,
)
_ENDS_NUMERIC = re.compile(r"(?:\\boxed\s*\{|####)|\d[\d,.]*\s*%?\$?\s*[.)*]*\s*$")


def strip_math_delimiters(s: str) -> str:
    s = s.strip()
    for left, right in (("$$", "$$"), ("\\[", "\\]"), ("\\(", "\\)")):
        if s.startswith(left) and right in s[len(left) :]:
            return s[len(left) : s.index(right, len(left))].strip()
    # a $…$ pair anywhere: its content; a lone leading $ is a currency sign
    unescaped = [m.start() for m in re.finditer(r"(?<!\\)\$", s)]
    if len(unescaped) >= 2:
        return s[unescaped[0] + 1 : unescaped[1]].strip()
    return s


def cut_sentence(s: str) -> str:
    """The first sentence of a one-line remainder (decimals such as 12.5 are not cut)."""
    inner = strip_math_delimiters(s) if s.lstrip().startswith(("$", "\\(", "\\[")) else None
    if inner is not None and inner != s.strip():
        return inner
    m = _SENTENCE_END.search(s)
    return s[: m.start()] if m else s


def clean_math(raw: str) -> str:
    """A math answer as displayed: delimiters, markup, units, trailing words removed."""
    if _PLAIN_INT.fullmatch(raw):
        return raw
    s = raw.strip().strip("*`").strip()
    anchors = list(ANSWER_ANCHOR.finditer(s))
    if anchors and s[anchors[-1].end() :].strip():
        s = cut_sentence(s[anchors[-1].end() :].strip())
    boxed = all_boxed(s)
    if boxed:
        s = boxed[-1]
    s = strip_math_delimiters(s)
    s = s.strip().strip("*`").strip()
    # \text{…}: alone it is the answer; after an expression it is a unit
    only_text = _TEXT_CMD.fullmatch(s.strip())
    s = only_text[1] if only_text else _TEXT_CMD.sub(" ", s)
    s = _DEGREES.sub("", s)
    for _ in range(3):
        s = _LEADING_FILLER.sub("", s.strip())
    s = _CURRENCY.sub("", s.strip())
    s = re.sub(r"(?<=[-\s])(?:\\\$|\$)(?=\d)", "", s)
    if "=" in s:
        # "5 + 3 = 8", "3 days * 4 people = 12 people": a worked computation; its result
        # is the answer. An equation with variables on the left ("x^2 + y^2 = 1") is kept.
        lhs, rhs = s.rsplit("=", 1)
        bare = re.sub(r"\\[A-Za-z]+|(?<=\d)\s+[A-Za-z]{2,}[A-Za-z']*", "", lhs)
        if rhs.strip() and not lhs.rstrip().endswith(("<", ">", "!")):
            s = s if re.search(r"[A-Za-z]", bare) else rhs
    s = _TRAILING_WORDS.sub("", s.strip())
    s = s.strip().rstrip(".,;:!?").strip().strip("*`'\"").lstrip("#").strip()
    # "indeed 32", "still 32": a word before a plain number is not part of it
    s = re.sub(rf"^(?!{_FUNCTIONS}\b)[A-Za-z]{{2,}}\s+(?=-?\d[\d,]*(?:\.\d+)?%?$)", "", s)
    commented = _COMMENTED_NUMBER.match(s)
    if commented:
        s = commented[1]
    s = re.sub(r"\s*(?:\\,|\\!|\\;|\\ )\s*", " ", s).strip()
    m = _VAR_ASSIGN.match(s)
    if m and not re.search(r"[=<>]", s[m.end() :]):
        s = s[m.end() :].strip()
    return s


def _looks_mathy(s: str) -> bool:
    """Something a math answer can be: not empty, not cut off after an operator."""
    complete = not re.search(rf"(?:=|{_OPERATOR})\s*$", s)
    return bool(s) and complete and (any(c.isdigit() for c in s) or "\\" in s or len(s) <= 2)


def stated_results(text: str, asked: frozenset[str] = frozenset()) -> list[str]:
    """The numbers ``text`` states as results, in order.

    Operands of an arithmetic expression ("3 + 5", "2 * (4 - 1)", "12 pages / 1") and
    enumerations (a list marker "1. ", "Step 3") are not results. A number after a result
    verb ("= 8", "is 4", "gives us 3") or alone on its line is one; any other number is
    one unless it is among ``asked``, the numbers of the question ("To add 3 and 2, …",
    "Sophia has 32" restate the question, they answer nothing), or a quantity referred
    back to ("out of the 60", "from 60", "than 5", "started with 60").
    """
    out = []
    for m in _NUMBER.finditer(text):
        before, after = text[max(0, m.start() - 24) : m.start()], text[m.end() : m.end() + 12]
        if _OPERAND_AFTER.match(after):
            continue
        if _ENUMERATES.search(before) and re.match(r"[.):][ \t]+\S|[ \t]*:", after):
            continue
        alone = re.search(r"(?:^|\n)[ \t]*$", before) and re.match(r"[ \t.]*(?:\n|$)", after)
        strong = bool(_RESULT_BEFORE.search(before) or alone)
        if _OPERAND_BEFORE.search(before) and not re.search(r"=\s*\(?\s*\$?$", before):
            continue
        if not strong and (_math_key_of(m[0]) in asked or _REFERENCE_BEFORE.search(before)):
            continue
        out.append(m[0])
    return out


@functools.lru_cache(maxsize=256)
def question_numbers(prompt: str) -> frozenset[str]:
    """The canonical keys of the numbers in a question."""
    return frozenset(_math_key_of(n) for n in _NUMBER.findall(prompt[-TAIL_CHARS:]))


@functools.lru_cache(maxsize=4096)
def _math_key(answer: str) -> str:
    """:meth:`MathAnswer.key` (cached, as :func:`_math_normal`)."""
    s = _math_normal(answer)
    value = as_rational(s)
    if value is not None:
        return str(value)
    return re.sub(r"\s+", "", s)


def _math_key_of(number: str) -> str:
    if _PLAIN_INT.fullmatch(number):
        return str(int(number))
    value = as_rational(_math_normal(number))
    return str(value) if value is not None else number


_ZERO_FRACTION = re.compile(r"^-?\d+\.0+$")
_WORDY = re.compile(r"^[A-Za-z]{2,}[A-Za-z]*\s+[A-Za-z]")
_NEGATED = re.compile(r"^\s*(?:not|never|none|unknown|unclear)\b", re.IGNORECASE)


@functools.lru_cache(maxsize=4096)
def extract_math(text: str, asked: frozenset[str] = frozenset()) -> str | None:
    text = text[-TAIL_CHARS:]
    boxed = all_boxed(text)
    if boxed:
        ans = clean_math(boxed[-1])
        if ans:
            return ans
    for cand in reversed(_HASHES.findall(text)):
        ans = clean_math(cand)
        if _looks_mathy(ans):
            return ans
    for stmt in reversed(anchored_statements(text)[-32:]):  # the last statements decide
        if _NEGATED.match(stmt):
            continue  # "the answer is not an integer": no answer stated here
        ans = clean_math(cut_sentence(stmt))
        if _WORDY.match(ans):
            # "the answer is the sum of 2 and 4, which is 6": the result it states
            results = stated_results(stmt, asked)
            if results:
                return clean_math(results[-1]) or None
            continue
        if _looks_mathy(ans):
            return ans
    results = stated_results(text, asked)
    if not results and len(text.split()) <= 4:
        results = stated_results(text)  # a bare "3 days." is the answer it gives
    if results:
        return clean_math(results[-1]) or None
    return None


@functools.lru_cache(maxsize=4096)
def _math_normal(answer: str) -> str:
    """The cleaned answer in the form both the key and math-verify see (cached: a task's
    vote keys each answer at every sample boundary)."""
    s = clean_math(answer)
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    s = re.sub(r"\\left\s*|\\right\s*", "", s)
    s = s.replace("\\%", "").replace("%", "")
    s = s.replace("\\$", "")
    s = s.replace("\u2212", "-")  # the Unicode minus sign
    s = s.strip()
    if _THOUSANDS.match(s):
        s = s.replace(",", "")
    return s


def as_rational(s: str) -> Fraction | None:
    compact = s.replace(" ", "")
    try:
        if _DECIMAL.match(compact):
            return Fraction(compact)
        m = _RATIO.match(compact)
        if m and int(m[2]) != 0:
            return Fraction(int(m[1]), int(m[2]))
        m = _FRAC.match(compact)
        if m:
            sign, num, den = (m[1], m[2], m[3]) if m[2] is not None else (m[4], m[5], m[6])
            d = Fraction(den)
            if d != 0:
                value = Fraction(num) / d
                return -value if sign == "-" else value
    except (ValueError, ZeroDivisionError):
        return None
    return None


@functools.lru_cache(maxsize=4096)
def _verified(a: str, b: str) -> bool:
    return get_pool().same(a, b)


def _final_statements(text: str) -> list[str]:
    tail = text[-TAIL_CHARS:]
    raw = [*all_boxed(tail), *_HASHES.findall(tail)]
    raw += [cut_sentence(s) for s in anchored_statements(tail)]
    return [ans for ans in (clean_math(r) for r in raw) if _looks_mathy(ans)]


@functools.lru_cache(maxsize=4096)
def _math_signals(text: str) -> float:
    work = min(1.0, len(_WORK_STEP.findall(text[-TAIL_CHARS:])) / 3)
    return statement_signals(work, [MathAnswer().key(s) for s in _final_statements(text)])


#: the instruction of a program-of-thought sample
POT_INSTRUCTION = (
    "Write a short Python program that computes the answer and prints only the "
    "answer. Put the whole program in one ```python code block."
)


@register
class MathAnswer(AnswerType):
    task_type = TaskType.math
    paths = frozenset({*PATH_INSTRUCTIONS, ReasoningPath.pot})

    def instruction_for(self, path: ReasoningPath) -> str:
        return POT_INSTRUCTION if path == ReasoningPath.pot else super().instruction_for(path)

    def reminder_for(self, path: ReasoningPath) -> str | None:
        """A program-of-thought sample gets its instruction after the question too: with it
        in the system message alone, Qwen2.5-Coder-0.5B answered a question worded "State
        the final answer ..." in prose (0 programs in 20 such problems of the quality
        benchmark's fit half, 16 with the reminder)."""
        return POT_INSTRUCTION if path == ReasoningPath.pot else None

    def answer_text(self, sample: Sample) -> str:
        """A program-of-thought sample whose program ran: the last line it printed."""
        if sample.path == ReasoningPath.pot and sample.program_output is not None:
            lines = [line for line in sample.program_output.splitlines() if line.strip()]
            return lines[-1] if lines else ""
        return super().answer_text(sample)

    async def prepare(self, sample: Sample, task: Task, settings: Settings) -> None:
        """A program-of-thought sample: run its program in the sandbox (a last bare
        expression printed, as a notebook cell does) and keep the end of what it printed
        (``program_output``) and how it was isolated."""
        pot = sample.path == ReasoningPath.pot
        run = await run_program(sample.text or "", settings) if pot else None
        if run is None:
            return
        sample.program_output = run.stdout[-2000:]
        sample.isolation = run.isolation

    def question(self, prompt: str) -> Question:
        """The prompt alone: math reads its numbers (:func:`question_numbers`), never its
        words."""
        return Question(prompt=prompt)

    def extract(self, text: str, question: Question) -> str | None:
        """The final stated answer; a whole number written with a zero fraction ("12.0")
        is shown as the whole number."""
        asked = question_numbers(question.prompt) if question.prompt else frozenset()
        answer = extract_math(text, asked)
        if answer is not None and _ZERO_FRACTION.match(answer):
            return answer.split(".", 1)[0]
        return answer

    def key(self, answer: str) -> str:
        """A plain rational as ``str(Fraction)`` ("12" for 12, 12.0, 1,234 → "1234",
        \\frac{24}{2}, 12 apples, $12, 12%; "1/2" for 0.5), else the cleaned LaTeX
        without spaces."""
        return _math_key(answer)

    def same(self, a: str, b: str) -> bool:
        if a == b:
            return True
        na, nb = _math_normal(a), _math_normal(b)
        if self.key(na) == self.key(nb):
            return True
        if as_rational(na) is not None and as_rational(nb) is not None:
            return False
        if not na or not nb or len(na) > MAX_MATH_CHARS or len(nb) > MAX_MATH_CHARS:
            return False
        return _verified(*sorted((na, nb)))

    def signals(self, text: str, answer: str | None) -> float:
        """``0.4 * work + 0.4 * consistent + 0.2 * restated`` (0 without an answer).

        work: arithmetic steps shown, ``min(1, steps / 3)``; consistent: 0 when the text
        states two different final answers; restated: 1 for two or more agreeing final
        statements, 0.5 for one, 0.25 when the answer came from a stated result only.
        """
        return 0.0 if answer is None else _math_signals(text)

    def claim(self, prompt: str, outputs: Sequence[str]) -> int:
        if _MATH_PROMPT.search(prompt):
            return 20
        if outputs and sum(1 for o in outputs if _ENDS_NUMERIC.search(o[-200:])) > len(outputs) / 2:
            return 10
        return 0
