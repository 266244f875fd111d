"""Rate limits: a token bucket per caller, kept by the store."""

from __future__ import annotations

from abc import abstractmethod
from typing import Protocol

__all__ = ["RateLimits"]


class RateLimits(Protocol):
    """Token buckets (:mod:`ponder.ratelimit` holds the policy: which caller, what rate).

    A bucket holds up to ``burst`` tokens and refills at ``rate`` tokens a second; a bucket
    not seen before is full. On Redis the buckets are shared by every process; the
    embedded store keeps them in its own process's memory.
    """

    @abstractmethod
    async def take_token(self, caller: str, rate: float, burst: int) -> float:
        """Take one token of ``caller``'s bucket: 0.0 if there was one, else the seconds
        until there is (nothing is taken then)."""
