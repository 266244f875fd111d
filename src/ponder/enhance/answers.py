"""Answer extraction and equivalence per task type, for the self-consistency vote.

The vote works in three steps, all here:

1. :func:`extract_answer` pulls the final answer out of a sample's text as a display string
   ("12", "B", a code block, a short text).
2. :func:`canonical_key` maps an extracted answer to a cheap canonical string; answers with
   the same key are the same answer (``12``, ``12.0``, ``12.00``, ``\\frac{24}{2}`` and
   ``1,234 apples`` vs ``1234`` share keys).
3. :func:`same_answer` decides the cases keys cannot: math through ``math-verify``
   (``\\sqrt{4}`` and ``2``), text through a similarity threshold.
   :func:`group_answers` runs 2 over all answers and 3 between class representatives.

Choices (also stated in the tests):

* **Percent** is a unit, dropped like any other: ``50%`` == ``50``, and ``50%`` != ``0.5``.
  GSM8K/MATH-style questions that ask "what percent" are answered with ``50`` or ``50%``;
  counting ``0.5`` as well would make the relation non-transitive (50 = 50% = 0.5 ≠ 50).
* **Units and trailing words** are dropped from math answers (``12 apples`` → ``12``), as
  are currency signs (``$5``, ``\\$5``), degree signs and ``\\text{…}`` units.
* **Plain rationals** (integers, decimals, ``a/b``, ``\\frac{a}{b}``) compare exactly through
  their key: ``1.2`` != ``12`` and ``0.33`` != ``1/3``. Everything else goes to math-verify.
* **Text** answers are equal when their normalised forms (NFKC, case-folded, punctuation
  and extra whitespace removed) are equal or have a :class:`difflib.SequenceMatcher` ratio
  of at least :data:`TEXT_SIMILARITY_THRESHOLD` (0.85).
* **Code** answers are equal when their ASTs are equal; comments, formatting and
  docstrings are ignored.

Bounds: math-verify's own timeouts use ``signal.alarm``, which works only in the main
thread and would also cancel other SIGALRM users (pytest-timeout). They are switched off;
instead answers longer than :data:`MAX_MATH_CHARS` are compared by key only, parsed
expressions with huge exponents or factorials are never simplified (they hang sympy in C),
and each math-verify comparison runs in a helper thread with a deadline, after which it is
abandoned (and asked to stop) and counts as "not the same". Everything here is safe to call
from any thread; it is CPU work, so an event loop should call it through
``asyncio.to_thread``.
"""

from __future__ import annotations

import ast
import ctypes
import difflib
import functools
import logging
import re
import threading
import time
import unicodedata
import warnings
from collections.abc import Callable, Sequence
from fractions import Fraction
from typing import Any, TypeVar

from ponder.types import TaskType

__all__ = [
    "GROUP_BUDGET_S",
    "MATH_VERIFY_TIMEOUT_S",
    "MAX_MATH_CHARS",
    "TEXT_SIMILARITY_THRESHOLD",
    "canonical_key",
    "extract_answer",
    "extract_code_block",
    "group_answers",
    "infer_task_type",
    "reasoning_signals",
    "same_answer",
]

#: text answers at least this similar (difflib ratio of the normalised forms) are one answer
TEXT_SIMILARITY_THRESHOLD = 0.85
#: math answers longer than this are compared by canonical key only
MAX_MATH_CHARS = 300
#: one math-verify comparison (parse both + verify) is abandoned after this long
MATH_VERIFY_TIMEOUT_S = 5.0
#: extraction looks at the end of long texts only (final answers are stated last)
_TAIL_CHARS = 20_000
#: text similarity is computed on at most this many normalised characters
_TEXT_COMPARE_CHARS = 2_000

_T = TypeVar("_T")


def _task_type(task_type: TaskType | str) -> TaskType:
    try:
        return TaskType(task_type)
    except ValueError:
        allowed = ", ".join(t.value for t in TaskType)
        raise ValueError(f"Unknown task type: {task_type!r}; expected one of {allowed}") from None


# ---------------------------------------------------------------------------------------
# Fenced code blocks
# ---------------------------------------------------------------------------------------

_FENCE_OPEN = re.compile(r"^[ \t]*(`{3,}|~{3,})[ \t]*([\w+#.-]*)")


def _fenced_blocks(text: str) -> list[tuple[str, str]]:
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
    blocks = _fenced_blocks(text)
    if python_only:
        tagged = [b for lang, b in blocks if lang in _PYTHON_LANGS]
        if tagged:
            return tagged[-1].strip("\n") or None
        blocks = [(lang, b) for lang, b in blocks if not lang]
    for _lang, body in reversed(blocks):
        if body.strip():
            return body.strip("\n")
    return None


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


# ---------------------------------------------------------------------------------------
# Math: extraction and cleaning
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


def _all_boxed(text: str) -> list[str]:
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


_ANSWER_ANCHOR = re.compile(
    r"(?:final\s+answer|\banswer)\s*(?:\*\*\s*)?"
    r"(?:is|would\s+be|will\s+be|should\s+be|=|:)\s*(?:\*\*\s*)?:?",
    re.IGNORECASE,
)
_HASHES = re.compile(r"####\s*([^\n]*)")
_SENTENCE_END = re.compile(r"\.(?:\s|$)|\s[-\u2013\u2014]\s|;|\bI hope\b", re.IGNORECASE)


def _anchored_statements(text: str) -> list[str]:
    """Raw remainders after each "answer is"/"Answer:" anchor, in order (first line, sentence)."""
    out = []
    for m in _ANSWER_ANCHOR.finditer(text):
        rest = text[m.end() :]
        line = rest.split("\n", 1)[0].strip()
        if not line:
            nxt = [ln for ln in rest.split("\n")[:4] if ln.strip()]
            line = nxt[0].strip() if nxt else ""
        out.append(line)
    return out


_NUMBER = re.compile(
    r"(?:(?<=^)|(?<=[\s(\[{$=:]))-?\$?\d{1,3}(?:,\d{3})+(?:\.\d+)?%?"
    r"|(?:(?<=^)|(?<=[\s(\[{$=:]))-\$?\d+(?:\.\d+)?(?:/\d+)?%?"
    r"|\d+(?:\.\d+)?(?:/\d+)?%?"
)
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


def _strip_math_delimiters(s: str) -> str:
    s = s.strip()
    for left, right in (("$$", "$$"), ("\\[", "\\]"), ("\\(", "\\)")):
        if s.startswith(left) and right in s[len(left) :]:
            return s[len(left) : s.index(right, len(left))].strip()
    # a $…$ pair anywhere: its content; a lone leading $ is a currency sign
    unescaped = [m.start() for m in re.finditer(r"(?<!\\)\$", s)]
    if len(unescaped) >= 2:
        return s[unescaped[0] + 1 : unescaped[1]].strip()
    return s


def _clean_math(raw: str) -> str:
    """A math answer as displayed: delimiters, markup, units, trailing words removed."""
    s = raw.strip().strip("*`").strip()
    anchors = list(_ANSWER_ANCHOR.finditer(s))
    if anchors and s[anchors[-1].end() :].strip():
        s = _cut_sentence(s[anchors[-1].end() :].strip())
    boxed = _all_boxed(s)
    if boxed:
        s = boxed[-1]
    s = _strip_math_delimiters(s)
    s = s.strip().strip("*`").strip()
    # \text{…}: alone it is the answer; after an expression it is a unit
    only_text = _TEXT_CMD.fullmatch(s.strip())
    s = only_text[1] if only_text else _TEXT_CMD.sub(" ", s)
    s = _DEGREES.sub("", s)
    for _ in range(3):
        s = _LEADING_FILLER.sub("", s.strip())
    s = _CURRENCY.sub("", s.strip())
    s = re.sub(r"(?<=[-\s])(?:\\\$|\$)(?=\d)", "", s)
    s = _TRAILING_WORDS.sub("", s.strip())
    s = s.strip().rstrip(".,;:!?").strip().strip("*`'\"").lstrip("#").strip()
    # "0.125, which is 12.5%": a number followed by a comment is that number
    commented = _COMMENTED_NUMBER.match(s)
    if commented:
        s = commented[1]
    s = re.sub(r"\s*(?:\\,|\\!|\\;|\\ )\s*", " ", s).strip()
    m = _VAR_ASSIGN.match(s)
    if m and not re.search(r"[=<>]", s[m.end() :]):
        s = s[m.end() :].strip()
    elif "=" in s:
        # "5 + 3 = 8": a worked computation; its result is the answer. An equation with
        # variables on the left ("x^2 + y^2 = 1") is kept whole.
        lhs, rhs = s.rsplit("=", 1)
        if (
            rhs.strip()
            and not lhs.rstrip().endswith(("<", ">", "!"))
            and not re.search(r"[A-Za-z]", re.sub(r"\\[A-Za-z]+", "", lhs))
        ):
            s = rhs.strip()
    return s


_COMMENTED_NUMBER = re.compile(
    r"^(-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?%?)\s*(?:[,;(]\s*|\s)(?:which|that|this|because|since|as|so|"
    r"and|or|i\.e|meaning|or\s+about|approximately)\b",
    re.IGNORECASE,
)


def _looks_mathy(s: str) -> bool:
    return bool(s) and (any(c.isdigit() for c in s) or "\\" in s or len(s) <= 2)


def _extract_math(text: str) -> str | None:
    text = text[-_TAIL_CHARS:]
    boxed = _all_boxed(text)
    if boxed:
        ans = _clean_math(boxed[-1])
        if ans:
            return ans
    hashes = _HASHES.findall(text)
    for cand in reversed(hashes):
        ans = _clean_math(cand)
        if _looks_mathy(ans):
            return ans
    for stmt in reversed(_anchored_statements(text)):
        ans = _clean_math(_cut_sentence(stmt))
        if _looks_mathy(ans):
            return ans
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if lines and "=" in lines[-1]:
        rhs = lines[-1].rsplit("=", 1)[1]
        ans = _clean_math(_cut_sentence(rhs))
        if ans and any(c.isdigit() for c in ans):
            return ans
    numbers = _NUMBER.findall(text)
    if numbers:
        return _clean_math(numbers[-1]) or None
    return None


def _cut_sentence(s: str) -> str:
    """The first sentence of a one-line remainder (decimals such as 12.5 are not cut)."""
    inner = _strip_math_delimiters(s) if s.lstrip().startswith(("$", "\\(", "\\[")) else None
    if inner is not None and inner != s.strip():
        return inner
    m = _SENTENCE_END.search(s)
    return s[: m.start()] if m else s


# ---------------------------------------------------------------------------------------
# Math: keys and equivalence
# ---------------------------------------------------------------------------------------

_THOUSANDS = re.compile(r"^[-+]?\d{1,3}(?:,\d{3})+(?:\.\d+)?$")
_DECIMAL = re.compile(r"^[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d{1,3})?$")
_RATIO = re.compile(r"^([-+]?\d+)/(\d+)$")
_FRAC = re.compile(
    r"^([-+]?)\\frac\{([-+]?\d+(?:\.\d+)?)\}\{([-+]?\d+(?:\.\d+)?)\}$|^([-+]?)\\frac(\d)(\d)$"
)


def _math_normal(answer: str) -> str:
    """The cleaned answer in the form both the key and math-verify see."""
    s = _clean_math(answer)
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    s = re.sub(r"\\left\s*|\\right\s*", "", s)
    s = s.replace("\\%", "").replace("%", "")
    s = s.replace("\\$", "")
    s = s.replace("\u2212", "-")  # the Unicode minus sign
    s = s.strip()
    if _THOUSANDS.match(s):
        s = s.replace(",", "")
    return s


def _as_rational(s: str) -> Fraction | None:
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


def _math_key(answer: str) -> str:
    s = _math_normal(answer)
    value = _as_rational(s)
    if value is not None:
        return str(value)
    return re.sub(r"\s+", "", s)


class _Deadline(BaseException):
    """Raised inside an abandoned math-verify thread to stop it (never seen by callers)."""


def _call_with_deadline(fn: Callable[[], _T], timeout_s: float, default: _T) -> _T:
    """``fn()`` in a daemon thread; ``default`` if it has not returned within ``timeout_s``.

    A late thread is asked to stop with an asynchronous exception (effective at its next
    Python bytecode; a single long C call cannot be interrupted, which is why huge powers
    are refused before sympy sees them).
    """
    box: list[_T] = []
    lock = threading.Lock()

    def target() -> None:
        try:
            result = fn()
            with lock:
                box.append(result)
        except _Deadline:
            pass

    thread = threading.Thread(target=target, name="ponder-math-verify", daemon=True)
    thread.start()
    thread.join(timeout_s)
    with lock:
        # Only a thread that has not stored its result is stopped: the exception then
        # lands inside target's try block, never in the threading machinery.
        if not box and thread.is_alive() and thread.ident is not None:
            ctypes.pythonapi.PyThreadState_SetAsyncExc(
                ctypes.c_ulong(thread.ident), ctypes.py_object(_Deadline)
            )
            return default
    return box[0] if box else default


class _DropTimeoutNotice(logging.Filter):
    """math-verify logs once that its timeout is off; bounding is done here instead."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Timeout is disabled")


@functools.cache
def _math_verify() -> Any:
    import math_verify  # type: ignore[import-untyped]

    for name in ("math_verify.parser", "math_verify.grader"):
        logging.getLogger(name).addFilter(_DropTimeoutNotice())
    # Warm-up (imports sympy's parsers, builds the LaTeX grammar) outside any deadline.
    math_verify.parse("$1$", parsing_timeout=None)
    return math_verify


@functools.lru_cache(maxsize=2048)
def _mv_parse(s: str) -> tuple[Any, ...]:
    mv = _math_verify()
    parsed = mv.parse(
        f"${s}$",
        extraction_config=[mv.LatexExtractionConfig(), mv.ExprExtractionConfig()],
        parsing_timeout=None,
    )
    return tuple(parsed)


_HUGE = 1000


def _safe_to_verify(parsed: tuple[Any, ...]) -> bool:
    """False when sympy could spend unbounded time in C (huge powers, factorials)."""
    import sympy  # type: ignore[import-untyped]

    for expr in parsed:
        if not isinstance(expr, sympy.Basic):
            continue
        for count, node in enumerate(sympy.preorder_traversal(expr)):
            if count > 400:
                return False
            if isinstance(node, sympy.Pow):
                exp = node.exp
                if exp.free_symbols:
                    continue
                try:
                    value = complex(exp.evalf(15))
                except (TypeError, ValueError, ArithmeticError):
                    return False
                if not abs(value) <= _HUGE:
                    return False
            elif isinstance(node, sympy.Function) or getattr(node, "is_Function", False):
                for arg in getattr(node, "args", ()):
                    if isinstance(arg, sympy.Basic) and not arg.free_symbols:
                        try:
                            value = complex(arg.evalf(15))
                        except (TypeError, ValueError, ArithmeticError):
                            return False
                        if not abs(value) <= 100 * _HUGE:
                            return False
    return True


def _verify_math(a: str, b: str) -> bool:
    mv = _math_verify()
    pa, pb = _mv_parse(a), _mv_parse(b)
    if not pa or not pb or not _safe_to_verify(pa) or not _safe_to_verify(pb):
        return False
    return bool(
        mv.verify(list(pa), list(pb), timeout_seconds=None)
        or mv.verify(list(pb), list(pa), timeout_seconds=None)
    )


def _same_math(a: str, b: str) -> bool:
    na, nb = _math_normal(a), _math_normal(b)
    if _math_key(na) == _math_key(nb):
        return True
    if _as_rational(na) is not None and _as_rational(nb) is not None:
        return False
    if not na or not nb or len(na) > MAX_MATH_CHARS or len(nb) > MAX_MATH_CHARS:
        return False
    _math_verify()  # the first call imports sympy: seconds, not to be charged to a deadline
    return _call_with_deadline(lambda: _verify_math(na, nb), MATH_VERIFY_TIMEOUT_S, False)


# ---------------------------------------------------------------------------------------
# Choice
# ---------------------------------------------------------------------------------------

_LETTERS = "A-J"
_CHOICE_ANCHOR_WORDS = (
    r"(?i:answer|option|choice)\s*(?i:is|would\s+be|should\s+be|=|:)?\s*(?:\*\*)?\s*"
    r"(?i:option\s+|choice\s+)?[(\[]?"
)
#: an upper-case letter after an anchor; a lower-case one only before punctuation or the
#: end of the line ("answer: b"), so that "the answer is a bit…" does not vote for A
_CHOICE_ANCHOR = re.compile(
    _CHOICE_ANCHOR_WORDS + rf"(?:([{_LETTERS}])\b(?![-'\u2019])|([a-j])(?=[ \t]*(?:[).,:;\]*]|$)))",
    re.MULTILINE,
)
_CHOICE_PAREN = re.compile(rf"\(([{_LETTERS}])\)")
_CHOICE_RPAREN = re.compile(rf"(?:^|(?<=\s))([{_LETTERS}])\)", re.MULTILINE)
_CHOICE_ALONE = re.compile(rf"^[ \t*(\[]*([{_LETTERS}])[ \t*)\].:]*$", re.MULTILINE)


def _choice_letter(text: str) -> str | None:
    text = text[-_TAIL_CHARS:]
    for boxed in reversed(_all_boxed(text)):
        m = re.fullmatch(rf"\s*(?:\\text\{{)?\(?([{_LETTERS}a-j])\)?\}}?\s*", boxed)
        if m:
            return m[1].upper()
    for m in reversed(list(_CHOICE_ANCHOR.finditer(text))):
        letter = m[1] or m[2]
        # "the answer is I think…": the pronoun, not option I
        if letter == "I" and re.match(r"\s+[a-z]", text[m.end() :]):
            continue
        return letter.upper()
    for pattern in (_CHOICE_ALONE, _CHOICE_PAREN, _CHOICE_RPAREN):
        found = pattern.findall(text)
        if found:
            return str(found[-1]).upper()
    return None


# ---------------------------------------------------------------------------------------
# Text
# ---------------------------------------------------------------------------------------


def _normalise_text(s: str) -> str:
    s = unicodedata.normalize("NFKC", s).casefold()
    s = "".join(" " if unicodedata.category(c)[0] in "PS" else c for c in s)
    return " ".join(s.split())


def _extract_text(text: str) -> str | None:
    tail = text[-_TAIL_CHARS:]
    statements = [s for s in _anchored_statements(tail) if s.strip()]
    answer = statements[-1] if statements else tail
    answer = " ".join(answer.split()).strip().strip("*`\"'“”").strip()
    answer = answer.rstrip(".").strip()
    return answer or None


def _same_text(a: str, b: str) -> bool:
    # sorted: SequenceMatcher's ratio can depend on argument order; the relation must not
    na, nb = sorted(
        (_normalise_text(a)[:_TEXT_COMPARE_CHARS], _normalise_text(b)[:_TEXT_COMPARE_CHARS])
    )
    if na == nb:
        return True
    if not na or not nb:
        return False
    matcher = difflib.SequenceMatcher(None, na, nb, autojunk=False)
    if matcher.real_quick_ratio() < TEXT_SIMILARITY_THRESHOLD:
        return False
    if matcher.quick_ratio() < TEXT_SIMILARITY_THRESHOLD:
        return False
    return matcher.ratio() >= TEXT_SIMILARITY_THRESHOLD


# ---------------------------------------------------------------------------------------
# Task type inference
# ---------------------------------------------------------------------------------------

_CODE_REQUEST = re.compile(
    r"\b(?:write|implement|complete|create|define|code|fix|refactor|generate)\b[^.?!\n]{0,80}?"
    r"\b(?:function|program|script|class|method|code|snippet|algorithm)\b"
    r"|^[ \t]*(?:def\s+\w+\s*\(|class\s+\w+|import\s+\w+|from\s+[\w.]+\s+import\b)"
    r"|\bin\s+python\b",
    re.IGNORECASE | re.MULTILINE,
)
_OPTION_LINE = re.compile(rf"^[ \t]*\(?([{_LETTERS}])[).:]\s+\S", re.MULTILINE)
_OPTION_INLINE = re.compile(rf"\(([{_LETTERS}])\)\s*\S")
_MATH_PROMPT = re.compile(
    r"\d\s*[-+*/\u00d7\u00f7^=<>]\s*\d|\bhow\s+(?:many|much|long|far|old)\b|\\frac|\\sqrt|\\boxed"
    r"|\b(?:calculate|compute|solve|evaluate|simplify|sum|product|percent(?:age)?|average|"
    r"probability|equation|integer|remainder|digits?|total|cost|price|area|volume|"
    r"perimeter|ratio)\b",
    re.IGNORECASE,
)
_ENDS_NUMERIC = re.compile(r"(?:\\boxed\s*\{|####)|\d[\d,.]*\s*%?\$?\s*[.)*]*\s*$")


def _has_options(prompt: str) -> bool:
    for pattern in (_OPTION_LINE, _OPTION_INLINE):
        letters = set(pattern.findall(prompt))
        if {"A", "B"} <= letters:
            return True
    return False


def infer_task_type(prompt: str, outputs: Sequence[str] = ()) -> TaskType:
    """Resolve ``auto``: code, choice, math or text, from the prompt and sample outputs.

    In order: the prompt asks for a function/program (or is Python source) → code; the
    prompt lists options "(A) … (B) …" or lines "A) …", "B. …" → choice; most outputs
    contain fenced code → code; the prompt looks like arithmetic/a word problem, or most
    outputs end in a number or state it with ``\\boxed``/``####`` → math; else text.
    """
    prompt = prompt[-_TAIL_CHARS:]
    if _CODE_REQUEST.search(prompt):
        return TaskType.code
    if _has_options(prompt):
        return TaskType.choice
    outs = [o[-_TAIL_CHARS:] for o in outputs if o]
    half = len(outs) / 2
    if outs and sum(1 for o in outs if _fenced_blocks(o)) > half:
        return TaskType.code
    if _MATH_PROMPT.search(prompt):
        return TaskType.math
    if outs and sum(1 for o in outs if _ENDS_NUMERIC.search(o[-200:])) > half:
        return TaskType.math
    return TaskType.text


def _resolve(task_type: TaskType | str, texts: Sequence[str | None]) -> TaskType:
    t = _task_type(task_type)
    if t is TaskType.auto:
        return infer_task_type("", [x for x in texts if x])
    return t


# ---------------------------------------------------------------------------------------
# Public API
# ---------------------------------------------------------------------------------------


def extract_answer(text: str, task_type: TaskType | str) -> str | None:
    """The final answer stated in a sample's ``text``, as a display string; None if none.

    * math: the last ``\\boxed{}``, else the last ``####``, else the last "answer is"/
      "Answer:", else a final "= x" on the last line, else the last number; cleaned of
      ``$…$``, currency, units and trailing words, and a leading ``x =`` (``"12"``,
      ``"\\frac{1}{2}"``, ``"1,234"``).
    * choice: the option letter, upper case (``"B"``), from ``\\boxed{B}``, "answer: b",
      "The answer is (B).", else the last "(B)" / "B)" / a line that is only a letter.
    * code: the last fenced code block (an unclosed last fence runs to the end); without
      fences, the whole text when it is Python that defines a function or class.
    * text: the remainder of the last "answer is"/"Answer:" line, else the whole text,
      with whitespace collapsed and a trailing period removed.
    * auto: the type is inferred from the text alone (see :func:`infer_task_type`);
      callers that know the prompt should resolve ``auto`` first.

    Never raises on any string input.
    """
    t = _resolve(task_type, [text])
    if not text or not text.strip():
        return None
    if t is TaskType.math:
        return _extract_math(text)
    if t is TaskType.choice:
        return _choice_letter(text)
    if t is TaskType.code:
        return _extract_code(text)
    return _extract_text(text)


def canonical_key(answer: str, task_type: TaskType | str) -> str:
    """A canonical form of an extracted answer: equal keys mean the same answer.

    math: a plain rational as ``str(Fraction)`` ("12" for 12, 12.0, 12.00, 1,234 → "1234",
    \\frac{24}{2}, 12 apples, $12, 12%; "1/2" for 0.5 and \\dfrac{1}{2}), else the cleaned
    LaTeX without spaces; choice: the upper-case letter; code: ``ast.dump`` of the tree
    without docstrings (the stripped text if it does not parse); text: the normalised text.
    Different keys may still be the same answer; :func:`same_answer` decides.
    """
    t = _resolve(task_type, [answer])
    if t is TaskType.math:
        return _math_key(answer)
    if t is TaskType.choice:
        bare = answer.strip().strip("()[]*.: \t")
        if len(bare) == 1 and bare.upper() in "ABCDEFGHIJ":
            return bare.upper()
        return _choice_letter(answer) or _normalise_text(answer)
    if t is TaskType.code:
        return _code_key(answer)
    return _normalise_text(answer)


def same_answer(a: str, b: str, task_type: TaskType | str) -> bool:
    """Whether two extracted answers are the same answer (symmetric; reflexive).

    math: equal keys, else (unless both are plain rationals, which compare exactly)
    math-verify in both directions, bounded as described in the module docstring; code:
    equal ASTs; choice: equal letters; text: normalised forms with a difflib ratio of at
    least :data:`TEXT_SIMILARITY_THRESHOLD`.
    """
    t = _resolve(task_type, [a, b])
    if a == b:
        return True
    if t is TaskType.math:
        return _same_math(a, b)
    if t is TaskType.text:
        return _same_text(a, b)
    return canonical_key(a, t) == canonical_key(b, t)


#: group_answers stops pairwise (math-verify / similarity) checks after this long
GROUP_BUDGET_S = 15.0


def group_answers(answers: Sequence[str | None], task_type: TaskType | str) -> list[list[int]]:
    """Indices of ``answers`` partitioned into equivalence classes, ordered by first index.

    Answers are first grouped by :func:`canonical_key`; then each class is merged into the
    first earlier class whose representative (first member) is :func:`same_answer` with its
    own. None (no answer) is never grouped with anything: each None is a class of its own.
    Pairwise checks stop after ``GROUP_BUDGET_S`` seconds (keys alone then decide), so the
    call is bounded; it is CPU work, to be called off the event loop.
    """
    t = _resolve(task_type, answers)
    by_key: dict[str, list[int]] = {}
    classes: list[list[int]] = []
    for i, ans in enumerate(answers):
        if ans is None:
            classes.append([i])
            continue
        key = canonical_key(ans, t)
        if key in by_key:
            by_key[key].append(i)
        else:
            by_key[key] = [i]
            classes.append(by_key[key])
    deadline = time.monotonic() + GROUP_BUDGET_S
    merged: list[list[int]] = []
    for cls in classes:
        rep = answers[cls[0]]
        target = None
        if rep is not None and time.monotonic() < deadline:
            for group in merged:
                other = answers[group[0]]
                if other is not None and same_answer(other, rep, t):
                    target = group
                    break
                if time.monotonic() >= deadline:
                    break
        if target is None:
            merged.append(list(cls))
        else:
            target.extend(cls)
    return [sorted(g) for g in merged]


_WORK_STEP = re.compile(r"\d\s*[-+*/\u00d7\u00f7^]\s*\(?\d|=\s*\$?-?\d|\\(?:frac|times|cdot)")


def _final_statements(text: str, t: TaskType) -> list[str]:
    tail = text[-_TAIL_CHARS:]
    raw = list(_all_boxed(tail))
    raw += [s for s in _HASHES.findall(tail)]
    raw += [_cut_sentence(s) for s in _anchored_statements(tail)]
    out = []
    for r in raw:
        if t is TaskType.math:
            ans = _clean_math(r)
            if _looks_mathy(ans):
                out.append(ans)
        elif t is TaskType.choice:
            letter = _choice_letter(r)
            if letter:
                out.append(letter)
    return out


def reasoning_signals(text: str, answer: str | None, task_type: TaskType | str) -> float:
    """A heuristic in [0, 1] for how well a sample supports its answer (for confidence).

    ``0.4 * work + 0.4 * consistent + 0.2 * restated``, and 0.0 when ``answer`` is None:

    * work — the computation is shown. math: arithmetic steps ("3 * 4", "= 12",
      ``\\frac``), ``min(1, steps / 3)``; choice: reasoning length,
      ``min(1, words / 40)``; code: 1 when the answer parses as Python, else 0; text: 1.
    * consistent — no self-contradiction: 0 when the text states two different final
      answers ("answer is 5 … answer is 7", two different ``\\boxed{}``), else 1. Checked
      for math and choice; 1 for code and text.
    * restated — the answer is stated consistently more than once: 1 for two or more final
      statements that agree, 0.5 for one, 0.25 when the answer came from a fallback (last
      number, bare letter). 1 for code and text.
    """
    t = _resolve(task_type, [text])
    if answer is None:
        return 0.0
    if t is TaskType.code:
        return 1.0 if _parse_python(answer) is not None else 0.6
    if t is TaskType.text:
        return 1.0
    if t is TaskType.math:
        work = min(1.0, len(_WORK_STEP.findall(text[-_TAIL_CHARS:])) / 3)
    else:
        work = min(1.0, len(text.split()) / 40)
    statements = _final_statements(text, t)
    keys = {canonical_key(s, t) for s in statements}
    consistent = 0.0 if len(keys) > 1 else 1.0
    if len(statements) >= 2 and len(keys) == 1:
        restated = 1.0
    elif statements:
        restated = 0.5
    else:
        restated = 0.25
    return max(0.0, min(1.0, 0.4 * work + 0.4 * consistent + 0.2 * restated))
