"""Fuse finished samples into a result: extract each answer, then a plain majority vote.

This is the foundation's fusion; the enhancement work replaces extraction with per-type
normalisation and the vote with a confidence-weighted one.
"""

from __future__ import annotations

import re
from collections import Counter

from ponder.types import Result, Sample, SampleStatus

__all__ = ["extract_answer", "fuse_samples"]

_ANSWER_IS = re.compile(r"answer is\s*:?\s*(.+?)\s*$", re.IGNORECASE | re.DOTALL)
_TRAILING = " \t\n.,;:!?)\"'*`"


def extract_answer(text: str) -> str | None:
    """The text after the last "answer is", first line only, trailing punctuation stripped."""
    idx = text.lower().rfind("answer is")
    if idx < 0:
        return None
    match = _ANSWER_IS.match(text, idx)
    if match is None:
        return None
    answer = match[1].splitlines()[0].strip().rstrip(_TRAILING).lstrip(" :*`\"'(")
    return answer or None


def fuse_samples(samples: list[Sample]) -> Result | None:
    """Majority vote over the finished samples; None when none finished.

    Samples without an extractable answer vote for their whole stripped text. Ties go to
    the answer whose first sample finished earliest in index order (deterministic).
    """
    done = [s for s in samples if s.status == SampleStatus.done and s.text is not None]
    if not done:
        return None
    keys = [s.answer if s.answer is not None else (s.text or "").strip() for s in done]
    votes = Counter(keys)
    first_index = {k: i for i, k in reversed(list(enumerate(keys)))}
    winner = max(votes, key=lambda k: (votes[k], -first_index[k]))
    chosen = done[first_index[winner]]
    agreement = votes[winner] / len(done)
    return Result(
        answer=chosen.answer,
        text=chosen.text or "",
        confidence=agreement,
        agreement=agreement,
        votes=dict(votes),
        chosen_sample=chosen.index,
        reasoning=chosen.text,
    )
