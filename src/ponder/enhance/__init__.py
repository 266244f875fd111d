"""Inference-time enhancement: answer extraction and equivalence, the vote, strategies."""

from __future__ import annotations

from ponder.enhance import structured_strategy  # noqa: F401  (registers the structured strategy)
from ponder.enhance.answers import extract_answer, same_answer

__all__ = ["extract_answer", "same_answer"]
