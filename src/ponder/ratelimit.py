"""Per-caller rate limits: a token bucket per API key (or client address without auth).

A bucket holds up to ``burst`` tokens and refills at ``rate`` tokens a second; each
request takes one token, and a request that finds less than one is refused with the
time until one is there (the ``Retry-After`` of the API's 429).

The buckets are the store's (:class:`~ponder.store.contract.RateLimits`): in Redis, read
and updated by one script on the server's clock, so every API process shares one limit
per caller; in the embedded store, in its process's memory. This module holds the
policy: the rate and burst the settings give, and the ``Retry-After`` of a wait.
"""

from __future__ import annotations

import math

from ponder.config import Settings
from ponder.store.contract import RateLimits

__all__ = ["RateLimiter", "create_rate_limiter", "retry_after_s"]


def retry_after_s(wait_s: float) -> int:
    """The ``Retry-After`` header for a wait: whole seconds, rounded up, at least 1."""
    return max(1, math.ceil(wait_s))


class RateLimiter:
    """A token bucket per caller, ``rate`` tokens a second up to ``burst``, in ``buckets``."""

    def __init__(self, buckets: RateLimits, rate: float, burst: int) -> None:
        if rate <= 0 or burst < 1:
            raise ValueError("a rate limit needs rate > 0 and burst >= 1")
        self._buckets = buckets
        self.rate = rate
        self.burst = burst

    async def take(self, caller: str) -> float:
        """Take one token of ``caller``'s bucket: 0.0 if there was one, else the seconds
        until there is (nothing is taken then). Raises StoreUnavailable (Redis)."""
        return await self._buckets.take_token(caller, self.rate, self.burst)


def create_rate_limiter(settings: Settings, buckets: RateLimits) -> RateLimiter | None:
    """The limiter for ``settings`` over the store's ``buckets``; None when rate limits are
    off."""
    if settings.rate_limit_per_s <= 0:
        return None
    burst = settings.rate_limit_burst or max(1, math.ceil(2 * settings.rate_limit_per_s))
    return RateLimiter(buckets, settings.rate_limit_per_s, burst)
