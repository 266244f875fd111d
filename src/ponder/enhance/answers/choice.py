"""Multiple-choice answers: an option letter.

A prompt is multiple choice when it lists options with consecutive letters from A, on
their own lines or inline: ``A) … B) …``, ``A. … B. …``, ``(A) … (B) …``. A reply is
reduced to the letter it states (``\\boxed{B}``, "The answer is (B)", "answer: b", a line
that is only a letter, "(B)", "B)"), or else to the letter of the option whose text it
states ("The answer is Mars." → ``B`` when option B is Mars). A reply that copies the
options out chooses what it states after them ("Options: A) 3 B) 5 C) 7. The right one is
C) 7" → ``C``), else what it stated before them, else none: None. An answer that starts
with an option marker keys as its letter ("b) 12" ≡ ``B``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from ponder.enhance.answers.base import (
    ANSWER_ANCHOR,
    ANSWER_LINE,
    TAIL_CHARS,
    AnswerType,
    Question,
    all_boxed,
    anchored_statements,
    normalise_text,
    register,
    statement_signals,
)
from ponder.types import ReasoningPath, TaskType

__all__ = ["ChoiceAnswer", "parse_options"]

_LETTERS = "A-J"
_ANCHOR_WORDS = (
    r"(?i:answer|option|choice)\s*(?i:is|would\s+be|should\s+be|=|:)?\s*(?:\*\*)?\s*"
    r"(?i:option\s+|choice\s+)?[(\[]?"
)
#: an upper-case letter after an anchor; a lower-case one only before punctuation or the
#: end of the line ("answer: b"), so that "the answer is a bit…" does not vote for A
_ANCHOR = re.compile(
    _ANCHOR_WORDS + rf"(?:([{_LETTERS}])\b(?![-'\u2019])|([a-j])(?=[ \t]*(?:[).,:;\]*]|$)))",
    re.MULTILINE,
)
_PAREN = re.compile(rf"\(([{_LETTERS}])\)")
_RPAREN = re.compile(rf"(?:^|(?<=\s))([{_LETTERS}])\)", re.MULTILINE)
_ALONE = re.compile(rf"^[ \t*(\[]*([{_LETTERS}])[ \t*)\].:]*$", re.MULTILINE)
#: a line that starts with an option marker ("A) 8", "(B) 16", "C. 4")
_LISTED = re.compile(rf"^[ \t*]*\(?([{_LETTERS}])[).:]", re.MULTILINE)
#: an option marker in a prompt: "(A) ", "A) ", "A. ", "A: " at a line start or after a space
_MARK = re.compile(rf"(?:^|(?<=\s))(?:\(([{_LETTERS}])\)|([{_LETTERS}])[).:])[ \t]+(?=\S)", re.M)
#: where an option's text ends in a reply that copies the options out: its sentence or line
_OPTION_END = re.compile(r"[.!?](?=\s)|\n")
#: an answer that starts with an option marker, in either case ("b) 12", "(c) 7", "D. 4")
_MARKED = re.compile(rf"^\s*[(\[]?([{_LETTERS}a-j])[)\].:](?:\s|$)")


def _option_run(text: str) -> list[tuple[int, int, str]]:
    """(start, end, letter) of each marker of the last longest run of markers with
    consecutive letters from A (at least A and B); empty when there is none."""
    marks = [(m.start(), m.end(), m[1] or m[2]) for m in _MARK.finditer(text)]
    best: list[tuple[int, int, str]] = []
    run: list[tuple[int, int, str]] = []
    for mark in marks:
        if mark[2] == "A":
            run = [mark]
        elif run and ord(mark[2]) == ord(run[-1][2]) + 1:
            run.append(mark)
        else:
            continue
        if len(run) >= 2 and len(run) >= len(best):
            best = list(run)
    return best


def parse_options(prompt: str) -> dict[str, str]:
    """The options of a multiple-choice prompt, letter → text; empty when there are none.

    The options are the last run of markers with consecutive letters from A (at least
    A and B); each option's text runs to the next marker or the end of its line.
    """
    text = prompt[-TAIL_CHARS:]
    best = _option_run(text)
    options = {}
    for i, (_start, end, letter) in enumerate(best):
        stop = best[i + 1][0] if i + 1 < len(best) else len(text)
        body = text[end:stop].split("\n", 1)[0].strip().rstrip(",;")
        options[letter] = body.strip()
    return options


def _letter(text: str) -> tuple[int, str] | None:
    """The last stated letter and where it was stated."""
    for boxed in reversed(all_boxed(text)):
        m = re.fullmatch(rf"\s*(?:\\text\{{)?\(?([{_LETTERS}a-j])\)?\}}?\s*", boxed)
        if m:
            return (len(text), m[1].upper())
    for m in reversed(list(_ANCHOR.finditer(text))):
        letter = m[1] or m[2]
        # "the answer is I think…": the pronoun, not option I
        if letter == "I" and re.match(r"\s+[a-z]", text[m.end() :]):
            continue
        return (m.start(), letter.upper())
    return None


def _fallback_letter(text: str) -> str | None:
    for pattern in (_ALONE, _PAREN, _RPAREN):
        found = pattern.findall(text)
        if found:
            return str(found[-1]).upper()
    return None


def _option_in(statement: str, options: dict[str, str]) -> str | None:
    """The letter of the option whose text the statement states (the longest match)."""
    said = f" {normalise_text(statement)} "
    found = [
        (len(norm), letter)
        for letter, body in options.items()
        if (norm := normalise_text(body)) and f" {norm} " in said
    ]
    return max(found)[1] if found else None


@register
class ChoiceAnswer(AnswerType):
    task_type = TaskType.choice
    instruction = f"Answer with the letter of the correct option. {ANSWER_LINE}"

    def instruction_for(self, path: ReasoningPath) -> str:
        """:attr:`instruction` on every path."""
        return self.instruction

    def question(self, prompt: str) -> Question:
        base = super().question(prompt)
        return Question(prompt, parse_options(prompt), base.words, base.asked)

    def extract(self, text: str, question: Question) -> str | None:
        text = text[-TAIL_CHARS:]
        run = _option_run(text)
        if run:
            # the options copied out ("A) 3 B) 5 C) 7."): the choice is what follows them
            end = _OPTION_END.search(text, run[-1][1])
            after = self.extract(text[end.end() :], question) if end else None
            if after is not None:
                return after
        stated = _letter(text)
        if question.options:
            # "The answer is Mars": the option text after the last anchor, if that anchor
            # comes after the last stated letter
            for m, statement in reversed(list(_statements(text))):
                letter = _option_in(statement, question.options)
                if letter is not None and (stated is None or m > stated[0]):
                    return letter
        if stated is not None:
            return stated[1]
        if run or len(set(_LISTED.findall(text))) >= 2:
            return None  # the options copied out ("A) 8", "B) 16", …): no answer chosen
        letter = _fallback_letter(text)
        if letter is not None or not question.options:
            return letter
        sentences = [s for s in re.split(r"(?<=[.!?])\s+|\n", text) if s.strip()]
        return _option_in(sentences[-1], question.options) if sentences else None

    def key(self, answer: str) -> str:
        bare = answer.strip().strip("()[]*.: \t")
        if len(bare) == 1 and bare.upper() in "ABCDEFGHIJ":
            return bare.upper()
        marked = _MARKED.match(answer)
        if marked:
            return marked[1].upper()  # "b) 12": the letter, with its option's text
        stated = _letter(answer)
        return stated[1] if stated else (_fallback_letter(answer) or normalise_text(answer))

    def signals(self, text: str, answer: str | None) -> float:
        """``0.4 * work + 0.4 * consistent + 0.2 * restated``: work is the reasoning's
        length (``min(1, words / 40)``), consistent is 0 when two different letters are
        stated as the answer, restated as for math."""
        if answer is None:
            return 0.0
        work = min(1.0, len(text.split()) / 40)
        tail = text[-TAIL_CHARS:]
        letters = [
            stated[1] for s in anchored_statements(tail) if (stated := _letter(f"answer: {s}"))
        ]
        letters += [m[1].upper() for m in (_ALONE.match(b.strip()) for b in all_boxed(tail)) if m]
        return statement_signals(work, letters)

    def claim(self, prompt: str, outputs: Sequence[str]) -> int:
        return 40 if parse_options(prompt) else 0


def _statements(text: str) -> list[tuple[int, str]]:
    """(position, first sentence) after each "answer is"/"Answer:" anchor."""
    out = []
    for m in ANSWER_ANCHOR.finditer(text):
        rest = text[m.end() :].strip().split("\n", 1)[0]
        out.append((m.start(), re.split(r"(?<=[.!?])\s", rest, maxsplit=1)[0]))
    return out
