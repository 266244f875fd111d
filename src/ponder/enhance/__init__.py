"""Answer extraction, voting and fusion of a task's samples into one result."""

from __future__ import annotations

from ponder.enhance.voting import extract_answer, fuse_samples

__all__ = ["extract_answer", "fuse_samples"]
