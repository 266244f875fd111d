"""Free-text answers: reduced to a short answer, grouped by entailment.

A reply is first reduced to the sentence that states its answer (the last "the answer
is …", else a concluding "So/Therefore/Thus …" sentence, else its first sentence), then
to a short answer:

* a sentence that starts with yes or no is that word ("No, 7 is not prime" → ``No``);
* "X is Y" keeps the side that does not restate the question ("The capital of France is
  Paris" → ``Paris``);
* leading articles, a possessor and a trailing "of …" that only name what the question
  names are dropped ("Elizabeth's daughter-in-law" → ``daughter-in-law``);
* a short answer of two or more words, all of them the question's own, answers nothing:
  None ("Liam to Susan" for "What is Liam to Susan?").

Two short answers are the same when their normalised forms are equal, when one's words
are all in the other and the other's first word is one of them ("Paris" ≡ "Paris,
France", but "France" ≢ "Paris, France"), or when the forms are at least
:data:`TEXT_SIMILARITY_THRESHOLD` similar (difflib) — never when only one of them is
negated or they differ in yes/no. Hyphenated words are one word ("mother" ≢
"mother-in-law").
"""

from __future__ import annotations

import difflib
import functools
import re
import unicodedata
from collections.abc import Sequence

from ponder.enhance.answers.base import (
    ANSWER_ANCHOR,
    TAIL_CHARS,
    AnswerType,
    Question,
    register,
)
from ponder.types import TaskType

__all__ = ["TEXT_SIMILARITY_THRESHOLD", "TextAnswer", "short_answer", "text_words"]

#: short answers at least this similar (difflib ratio of the normalised forms) are one
TEXT_SIMILARITY_THRESHOLD = 0.85
#: similarity is computed on at most this many normalised characters
_COMPARE_CHARS = 2_000
#: a statement longer than this many words is kept whole (it is not a short answer)
_SHORT_WORDS = 12

_STOP_WORDS = (
    "a an the is are was were be been of to in on at for by with and or it its this that "
    "these those there their they he she his her him them i you we my your our what which "
    "who whom whose how so thus therefore hence answer final correct"
)
_STOP = frozenset(_STOP_WORDS.split())
_NEGATIONS = frozenset({"not", "no", "never", "none", "neither", "nor", "cannot", "isnt",
                        "arent", "wasnt", "werent", "dont", "doesnt", "didnt"})  # fmt: skip
_YES_NO = re.compile(r"^\W*(yes|no)\b", re.IGNORECASE)
_CONCLUSION = re.compile(r"^\W*(?:so|therefore|thus|hence|in\s+conclusion)\b[,:]?\s*", re.I)
_COPULA = re.compile(r"\s(?:is|are|was|were|would\s+be|will\s+be)\s", re.IGNORECASE)
_SENTENCE = re.compile(r"(?<=[.!?])\s+|\n+")
_POSSESSIVE = re.compile(r"^([\w-]+)(?:'s|\u2019s|')\s+(?=\S)", re.IGNORECASE)
_TRAILING_OF = re.compile(r"\s(?:of|to|for)\s+(.+)$", re.IGNORECASE)
_ARTICLE = re.compile(r"^(?:the|a|an)\s+", re.IGNORECASE)


def text_words(s: str) -> list[str]:
    """Normalised words: NFKC, case-folded, hyphenated words joined, apostrophes
    dropped, other punctuation as spaces."""
    s = unicodedata.normalize("NFKC", s).casefold()
    s = re.sub(r"(?<=\w)[-\u2010\u2011](?=\w)", "", s)
    s = re.sub(r"(?<=\w)['\u2019](?=\w)", "", s)
    s = "".join(" " if unicodedata.category(c)[0] in "PS" else c for c in s)
    return s.split()


def _content(words: Sequence[str]) -> list[str]:
    return [w for w in words if w not in _STOP]


def _stem(word: str) -> str:
    return word[:-1] if len(word) > 3 and word.endswith("s") and not word.endswith("ss") else word


def _statement(text: str) -> tuple[str, bool]:
    """The sentence that states the answer, and whether an "answer is" anchor gave it."""
    tail = text[-TAIL_CHARS:]
    anchors = list(ANSWER_ANCHOR.finditer(tail))
    for m in reversed(anchors):
        rest = tail[m.end() :].strip()
        first = _SENTENCE.split(rest, maxsplit=1)[0].strip() if rest else ""
        if first:
            return first, True
    sentences = [s.strip() for s in _SENTENCE.split(tail) if s.strip()]
    if not sentences:
        return "", False
    for sentence in reversed(sentences):
        if _CONCLUSION.match(sentence):
            return _CONCLUSION.sub("", sentence, count=1), False
    return sentences[0], False


def _restates(part: str, question: Question) -> float:
    """The share of ``part``'s content words that the question already contains."""
    words = _content(text_words(part))
    if not words:
        return 1.0
    asked = {_stem(w) for w in question.words}
    return sum(_stem(w) in asked for w in words) / len(words)


def _drop_question_words(answer: str, question: Question) -> str:
    """Articles, a possessor and a trailing "of …" naming only what the question names."""
    s = _ARTICLE.sub("", answer.strip())
    m = _POSSESSIVE.match(s)
    if m and _restates(m[1], question) == 1.0 and s[m.end() :].strip():
        s = _ARTICLE.sub("", s[m.end() :])
    m = _TRAILING_OF.search(s)
    if m and _restates(m[1], question) == 1.0 and s[: m.start()].strip():
        s = s[: m.start()]
    return s.strip()


def short_answer(text: str, question: Question) -> tuple[str | None, bool]:
    """The short answer a reply states (see the module docstring) and whether it was
    anchored by "the answer is"; ``(None, False)`` for a reply that states nothing."""
    statement, anchored = _statement(text)
    s = " ".join(statement.split()).strip().strip("*`\"'“”").strip()
    s = s.rstrip(".!").strip().strip("*`\"'“”").strip()
    if not s or not any(c.isalnum() for c in s):
        return None, False
    yes_no = _YES_NO.match(s)
    if yes_no:
        return yes_no[1].capitalize(), anchored
    if len(s.split()) <= _SHORT_WORDS:
        parts = _COPULA.split(f" {s} ", maxsplit=1)
        if len(parts) == 2 and parts[0].strip() and parts[1].strip():
            subject, predicate = parts[0].strip(), parts[1].strip()
            if _restates(subject, question) >= _restates(predicate, question):
                s = predicate
            else:
                s = subject
        if _only_restates(s, question):
            return None, False  # "Liam to Susan" for "What is Liam to Susan?": no answer
        s = _drop_question_words(s, question) or s
    return s.strip(" ,;:") or None, anchored


def _only_restates(s: str, question: Question) -> bool:
    return (
        bool(question.words) and len(_content(text_words(s))) >= 2 and _restates(s, question) == 1.0
    )


@functools.lru_cache(maxsize=4096)
def _short_answer(text: str, prompt: str) -> tuple[str | None, bool]:
    return short_answer(text, TextAnswer().question(prompt) if prompt else Question())


def _key_words(answer: str) -> list[str]:
    return [_stem(w) for w in text_words(answer) if w not in ("the", "a", "an")]


@register
class TextAnswer(AnswerType):
    task_type = TaskType.text

    def extract(self, text: str, question: Question) -> str | None:
        return _short_answer(text, question.prompt)[0]

    def key(self, answer: str) -> str:
        """The normalised words, articles dropped, plural -s removed."""
        return " ".join(_key_words(answer))

    def same(self, a: str, b: str) -> bool:
        if a == b:
            return True
        wa, wb = _key_words(a), _key_words(b)
        if wa == wb:
            return True
        if not wa or not wb:
            return False
        polar = {"yes", "no"}
        if (wa[0] in polar or wb[0] in polar) and wa[0] != wb[0]:
            return False
        if bool(_NEGATIONS & set(wa)) != bool(_NEGATIONS & set(wb)):
            return False
        ca, cb = _content(wa) or wa, _content(wb) or wb
        short, long = sorted((ca, cb), key=lambda w: (len(w), w))
        if set(short) <= set(long) and long[0] in short:
            return True
        na, nb = sorted((" ".join(wa)[:_COMPARE_CHARS], " ".join(wb)[:_COMPARE_CHARS]))
        matcher = difflib.SequenceMatcher(None, na, nb, autojunk=False)
        return (
            matcher.real_quick_ratio() >= TEXT_SIMILARITY_THRESHOLD
            and matcher.quick_ratio() >= TEXT_SIMILARITY_THRESHOLD
            and matcher.ratio() >= TEXT_SIMILARITY_THRESHOLD
        )

    def signals(self, text: str, answer: str | None) -> float:
        """1 when an "answer is" statement gave the answer, 0.5 when the reply's
        sentences did, 0 without one."""
        if answer is None:
            return 0.0
        return 1.0 if _short_answer(text, "")[1] else 0.5

    def claim(self, prompt: str, outputs: Sequence[str]) -> int:
        return 1
