"""Free-text answers: reduced to a short answer, grouped by entailment.

A reply states its answer in its "the answer is …" statements (the last one that states
something; one inside quotes does not count) — a reply with such a statement answers
nothing else. Without one, a concluding "So/Therefore/Thus …" sentence (the last first),
else its first sentence states it; list markers ("1. Pink: …" is ``Pink``) and a sentence
that ends in ":" ("Here are some colours:") are not it. A sentence cut off at the end of
the reply (no closing punctuation) states nothing unless what it gives is a bare answer of
at most three words that neither opens a reasoning step ("To determine if 91") nor is left
open ("son of"). A yes/no question ("Is 91 prime?": an auxiliary verb, no alternatives)
is answered ``Yes``, ``No`` or None: the first statement, else the last sentence, that
opens with yes or no or has it open a clause ("…, so no, it is not"). The statement is
reduced to a short answer (an entity, yes/no, a relation word):

* a quoted answer is the quote ('The answer is "Sarah" to …' → ``Sarah``); fillers and
  a leading source phrase go ("indeed", "simply", "From the tree, …"); only the first
  clause counts ("Kai, which is …" → ``Kai``, "a sibling of Rain, not a parent" →
  ``sibling``, "a boy who …" → ``boy``);
* a reply that abstains ("I am not sure", "cannot be determined") or is negated ("not a
  person") states nothing: None; one that starts with yes or no is that word ("No, 7 is
  not prime" → ``No``);
* "X is Y" keeps the side that restates less of the question once both are reduced
  ("The capital of France is Paris" → ``Paris``, "Aria is the mother of David" →
  ``mother``; without the question the predicate, less its possessor: "Maria is Paul's
  aunt" → ``aunt``); outside an "answer is" statement, one about nothing the question asks
  about states nothing ("Dave is married to Owen" for "What is Nova to Ryder?");
* leading articles, a possessor and a trailing "of/to …" that only name what the prompt
  names are dropped ("Elizabeth's daughter-in-law" → ``daughter-in-law``, "married to
  Lisa" → ``married``);
* a short answer of two or more words, all of them the asking sentence's own, answers
  nothing: None ("Liam to Susan" for "What is Liam to Susan?").

Two short answers are the same when their normalised forms are equal; when one is
contained in the other: its words all in the other, or in what the other's "X is Y"
states (Y), and that starts with one of them ("Paris" ≡ "Paris, France", "K2" ≡ "The
tallest mountain is K2", but "France" ≢ "Paris, France"), for an answer with a content
word that is a number or longer than one letter (never "a", "x", "is", "the"); when they
are spelt apart ("mother in law" ≡ "mother-in-law"); or when phrasings of at least four
words each are at least :data:`TEXT_SIMILARITY_THRESHOLD` similar (difflib) — never when
only one of them is negated or they differ in yes/no. Hyphenated words are one word
("mother" ≢ "mother-in-law"). That follows the family-relationships scorer, which
accepts one word in any case and no synonym: "wife" ≢ "spouse", and no two of its
relation words are one.
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
#: similarity groups answers of at least this many words (a phrasing, not one word)
_SIMILAR_WORDS = 4
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
#: a list item ("1. Pink: a soft colour", "- Pink"): its marker goes, a "head:" is the item
_LIST_ITEM = re.compile(
    r"^[ \t]*(?:\d{1,2}[.)]|[-*\u2022])[ \t]+(?:\*\*)?(?:([^:\n]{1,40}?)(?:\*\*)?:[ \t].*)?", re.M
)
#: where a short answer's first clause ends: "Kai, which is …", "a boy who …", "…, not a parent"
_CLAUSE = re.compile(r"[,;]\s|\s(?:which|who|whom|whose|that|because|since|but|where)\s", re.I)
_FILLER = re.compile(r"^(?:indeed|simply|just|actually|clearly|certainly|obviously)\s+", re.I)
_QUOTED = re.compile(r"^[\"\u201c]([^\"\u201d\n]+?)[.!]?[\"\u201d]")
_NEGATED = re.compile(r"^(?:not|never|none|unknown|unclear)\b", re.IGNORECASE)
#: a reply that says it has no answer: "I am not sure", "I don't know", "cannot tell"
_ABSTAINS = re.compile(
    r"\b(?:not\s+sure|(?:don't|do\s+not|doesn't|does\s+not)\s+know|(?:cannot|can't|can\s+not)\s+"
    r"(?:be\s+)?(?:determined?|tell|say|know|answer))\b",
    re.IGNORECASE,
)
_POSSESSIVE = re.compile(r"^([\w-]+)(?:'s|\u2019s|')\s+(?=\S)", re.IGNORECASE)
_TRAILING_OF = re.compile(r"\s(?:of|to|for)\s+(.+)$", re.IGNORECASE)
_ARTICLE = re.compile(r"^(?:the|a|an)\s+", re.IGNORECASE)
#: a leading phrase that says where the answer comes from: "From the tree, …"
_PREAMBLE = re.compile(
    r"^(?:from|based\s+on|according\s+to|given|looking\s+at|in|considering|using)\b"
    r"[^,;:.!?]{0,60},\s*(?=\S)",
    re.IGNORECASE,
)
#: a question answered yes or no: a sentence ending in "?" that starts with an auxiliary
#: verb and offers no alternatives ("Is 91 prime?", "Is it prime or not?"; not "Is it red
#: or blue?")
_POLAR_QUESTION = re.compile(
    r"(?:^|(?<=[.!?:\n])\s*)(?:is|are|was|were|do|does|did|can|could|will|would|should|has|"
    r"have|had|may|might|must)\s(?:(?!\bor\s+(?!not\b))[^.!?\n])*\?",
    re.IGNORECASE,
)
#: yes or no opening a sentence ("No, 91 = 7 * 13"), or a clause ("…, so no, it is not")
_POLAR = re.compile(
    r"^\W*(yes|no)\b|[,;:]\s*(?:(?:so|thus|therefore|hence|then)\s+)?(yes|no)(?=\s*(?:[,.!;:]|$))",
    re.IGNORECASE,
)
#: how a reply ends when it was not cut off: closing punctuation, maybe quoted or marked up
_FINISHED = re.compile(r"[.!?][\"'\u201d)\]*`]*\s*$")
#: words that open a reasoning step, not an answer ("To determine if 91", "Let's see")
_OPENERS = frozenset(
    ["to", "if", "since", "because", "when", "while", "let", "lets", "first", "we", "i"]
)


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


def _statements(text: str) -> tuple[list[str], bool]:
    """The candidate answer statements, best first, and whether "answer is" anchors gave
    them: the first sentence after each anchor, the last first (an anchor inside quotes
    does not count); without anchors, concluding "So/Therefore …" sentences, the last
    first, then the first sentence."""
    tail = text[-TAIL_CHARS:]
    anchored = []
    for m in reversed(list(ANSWER_ANCHOR.finditer(tail))):
        if tail.count('"', tail.rfind("\n", 0, m.start()) + 1, m.start()) % 2:
            continue  # quoted: 'the answer is "Sarah" to the sentence "The answer is Zion."'
        rest = tail[m.end() :].strip()
        first = _SENTENCE.split(rest, maxsplit=1)[0].strip() if rest else ""
        if first:
            anchored.append(first)
    if anchored:
        return anchored, True
    listed = _LIST_ITEM.sub(lambda m: m[1] or "", tail)
    # a sentence that ends in ":" introduces what follows ("Here are some colours:")
    sentences = [s.strip() for s in _SENTENCE.split(listed) if s.strip() and s[-1] != ":"]
    concluding = [_CONCLUSION.sub("", s, count=1) for s in sentences if _CONCLUSION.match(s)]
    return [*reversed(concluding), *sentences[:1]], False


def _restates(part: str, words: frozenset[str]) -> float:
    """The share of ``part``'s content words that ``words`` (the question's) contain."""
    content = _content(text_words(part))
    if not content:
        return 1.0
    asked = {_stem(w) for w in words}
    return sum(_stem(w) in asked for w in content) / len(content)


def _drop_question_words(answer: str, question: Question) -> str:
    """Articles, a possessor and a trailing "of/to/for …" naming only what the prompt
    names ("the mother of David", "married to Lisa")."""
    s = _ARTICLE.sub("", answer.strip())
    m = _POSSESSIVE.match(s)
    if m and _restates(m[1], question.words) == 1.0 and s[m.end() :].strip():
        s = _ARTICLE.sub("", s[m.end() :])
    m = _TRAILING_OF.search(s)
    if m and _restates(m[1], question.words) == 1.0 and s[: m.start()].strip():
        s = s[: m.start()]
    return s.strip() or answer.strip()


def _reduce(statement: str, question: Question, anchored: bool) -> str | None:
    """The short answer one statement gives (see the module docstring), or None."""
    s = " ".join(statement.split()).strip().strip("*`").strip()
    s = _PREAMBLE.sub("", _FILLER.sub("", s), count=1)
    quoted = _QUOTED.match(s)
    if quoted:
        s = quoted[1]
    s = s.strip().strip("*`\"'“”").rstrip(".!").strip().strip("*`\"'“”").strip()
    if not any(c.isalnum() for c in s):
        return None
    if _ABSTAINS.search(s):
        return None  # "I am not sure", "No, I cannot tell": no answer stated
    yes_no = _YES_NO.match(s)
    if yes_no:
        return yes_no[1].capitalize()
    if _NEGATED.match(s):
        return None  # "the answer is not a person": no answer stated here
    s = _CLAUSE.split(s, maxsplit=1)[0].strip() or s
    if len(s.split()) > _SHORT_WORDS:
        return s
    parts = _COPULA.split(f" {s} ", maxsplit=1)
    if len(parts) == 2 and parts[0].strip() and parts[1].strip():
        about = _content(text_words(parts[0])) and _content(list(question.asked))
        if not anchored and about and not _restates(s, question.asked):
            return None  # "Dave is married to Owen" for "What is Nova to Ryder?"
        # "X is Y": the side that restates less of the question, once reduced
        subject, predicate = (_drop_question_words(p, question) for p in parts)
        keep_subject = _restates(subject, question.asked) < _restates(predicate, question.asked)
        s = parts[0] if keep_subject else parts[1]
        if not question.words and not keep_subject:
            s = _POSSESSIVE.sub("", _ARTICLE.sub("", s.strip()))  # "X is Y's Z": Z
    if question.asked and len(_content(text_words(s))) >= 2 and _restates(s, question.asked) == 1:
        return None  # "Liam to Susan" for "What is Liam to Susan?": no answer
    return _drop_question_words(s, question).strip(" ,;:") or None


def _is_fragment(answer: str) -> bool:
    """Whether the answer a sentence cut off at the end of a reply gives is a fragment:
    more than three words, a reasoning step's opening ("To determine if 91"), or a phrase
    left open ("son of")."""
    words = text_words(answer)
    return len(words) > 3 or (bool(words) and (words[0] in _OPENERS or words[-1] in _STOP))


def short_answer(text: str, question: Question) -> tuple[str | None, bool]:
    """The short answer a reply states (see the module docstring) and whether it was
    anchored by "the answer is"; ``(None, False)`` for a reply that states nothing."""
    statements, anchored = _statements(text)
    if _POLAR_QUESTION.search(question.prompt[-TAIL_CHARS:]):
        # a yes/no question is answered yes or no: the first statement that says it,
        # else the last sentence that does
        said = [*statements, *reversed(_SENTENCE.split(text[-TAIL_CHARS:]))]
        polar = next((m[1] or m[2] for s in said if (m := _POLAR.search(s))), None)
        return (polar.capitalize(), anchored) if polar else (None, False)
    tail = text[-TAIL_CHARS:].rstrip()
    cut = "" if anchored or _FINISHED.search(tail) else _SENTENCE.split(tail)[-1]
    for statement in statements:
        answer = _reduce(statement, question, anchored)
        if answer is not None and cut.endswith(statement) and _is_fragment(answer):
            continue  # "To determine if 91": a sentence cut off, not an answer
        if answer is not None:
            return answer, anchored
    return None, False


@functools.lru_cache(maxsize=4096)
def _short_answer(text: str, prompt: str) -> tuple[str | None, bool]:
    return short_answer(text, TextAnswer().question(prompt) if prompt else Question())


def _key_words(answer: str) -> list[str]:
    return [_stem(w) for w in text_words(answer) if w not in ("the", "a", "an")]


def _substantive(words: Sequence[str]) -> bool:
    """Whether an answer may be found inside another: it has a content word that is not
    a single letter ("K2", "7", "Paris"; not "a", "x", "is", "the")."""
    return any(len(w) > 1 or w.isdigit() for w in _content(words))


def _heads(short: Sequence[str], long: Sequence[str]) -> bool:
    """Whether ``long`` says ``short``: all of its words, and it starts with one of them."""
    return bool(long) and set(short) <= set(long) and long[0] in short


def _predicate(answer: str) -> list[str]:
    """The content words after the copula of an "X is Y" answer ([] without one)."""
    parts = _COPULA.split(f" {answer} ", maxsplit=1)
    return _content(_key_words(parts[1])) if len(parts) == 2 else []


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
        if wa == wb or "".join(wa) == "".join(wb):
            return True  # "mother in law" is "mother-in-law" spelt apart
        if not wa or not wb:
            return False
        polar = {"yes", "no"}
        if (wa[0] in polar or wb[0] in polar) and wa[0] != wb[0]:
            return False
        if bool(_NEGATIONS & set(wa)) != bool(_NEGATIONS & set(wb)):
            return False
        (short, _), (long, long_text) = sorted(
            ((_content(wa) or wa, a), (_content(wb) or wb, b)), key=lambda p: (len(p[0]), p)
        )
        if _substantive(short) and (_heads(short, long) or _heads(short, _predicate(long_text))):
            return True
        if min(len(wa), len(wb)) < _SIMILAR_WORDS:
            return False  # "mother-in-law" is not "brother-in-law", though 87 % similar
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
