"""Per-caller rate limits: a token bucket per API key (or client address without auth).

A bucket holds up to ``burst`` tokens and refills at ``rate`` tokens a second; each
request takes one token, and a request that finds less than one is refused with the
time until one is there (the ``Retry-After`` of the API's 429).

- :class:`RedisRateLimiter`: the bucket lives in Redis (``{prefix}:rl:{caller}``, a hash
  ``tokens`` + ``ts``) and is read and updated by one Lua script on the server's clock, so
  any number of API processes share one limit per caller and clocks never disagree.
  The key expires once the bucket would be full again, so idle callers cost nothing.
- :class:`MemoryRateLimiter`: the same bucket in this process's memory, for the embedded
  SQLite store (one process by design). It keeps at most ``max_buckets`` buckets:
  full ones go first, then the least recently used.
"""

from __future__ import annotations

import asyncio
import math
import time
from abc import ABC, abstractmethod
from collections import OrderedDict
from typing import Any

from redis import exceptions as rexc

from ponder.config import Settings
from ponder.errors import StoreUnavailable
from ponder.store.base import TaskStore

__all__ = [
    "MemoryRateLimiter",
    "RateLimiter",
    "RedisRateLimiter",
    "create_rate_limiter",
    "retry_after_s",
]

# KEYS: bucket; ARGV: rate (tokens/s), burst, cost. Returns the seconds to wait, as a
# string (Lua numbers become integers in a reply): "0" when the request is admitted.
_TAKE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
local rate, burst, cost = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local b = redis.call('HMGET', KEYS[1], 'tokens', 'ts')
local tokens, ts = tonumber(b[1]), tonumber(b[2])
if tokens == nil or ts == nil then
  tokens, ts = burst, now
end
tokens = math.min(burst, tokens + math.max(0, now - ts) * rate)
local wait = 0
if tokens >= cost then
  tokens = tokens - cost
else
  wait = (cost - tokens) / rate
end
redis.call('HSET', KEYS[1], 'tokens', string.format('%.6f', tokens),
           'ts', string.format('%.6f', now))
redis.call('PEXPIRE', KEYS[1], math.ceil((burst - tokens) / rate * 1000) + 1000)
return string.format('%.6f', wait)
"""

_UNAVAILABLE = (rexc.ConnectionError, rexc.TimeoutError, rexc.ReadOnlyError, TimeoutError)


def retry_after_s(wait_s: float) -> int:
    """The ``Retry-After`` header for a wait: whole seconds, rounded up, at least 1."""
    return max(1, math.ceil(wait_s))


class RateLimiter(ABC):
    """A token bucket per caller."""

    def __init__(self, rate: float, burst: int) -> None:
        if rate <= 0 or burst < 1:
            raise ValueError("a rate limit needs rate > 0 and burst >= 1")
        self.rate = rate
        self.burst = burst

    @abstractmethod
    async def take(self, caller: str) -> float:
        """Take one token of ``caller``'s bucket: 0.0 if there was one, else the seconds
        until there is (nothing is taken then). Raises StoreUnavailable (Redis)."""


class MemoryRateLimiter(RateLimiter):
    """Buckets in this process (the embedded store's single process)."""

    def __init__(self, rate: float, burst: int, *, max_buckets: int = 100_000) -> None:
        super().__init__(rate, burst)
        self.max_buckets = max_buckets
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._buckets)

    async def take(self, caller: str) -> float:
        return self.take_at(caller, time.monotonic())

    def take_at(self, caller: str, now: float) -> float:
        """:meth:`take` at the monotonic time ``now`` (tests drive the clock)."""
        tokens, ts = self._buckets.pop(caller, (float(self.burst), now))
        tokens = min(float(self.burst), tokens + max(0.0, now - ts) * self.rate)
        wait = 0.0
        if tokens >= 1:
            tokens -= 1
        else:
            wait = (1 - tokens) / self.rate
        self._buckets[caller] = (tokens, now)  # most recently used last
        if len(self._buckets) > self.max_buckets:
            self._evict(now)
        return wait

    def _evict(self, now: float) -> None:
        refill_s = self.burst / self.rate
        for caller, (_, ts) in list(self._buckets.items()):
            if now - ts >= refill_s:  # full again: the same as no bucket
                del self._buckets[caller]
        while len(self._buckets) > self.max_buckets:
            self._buckets.popitem(last=False)


class RedisRateLimiter(RateLimiter):
    """Buckets in Redis, shared by every API process (see the module docstring)."""

    def __init__(
        self, client: Any, key_prefix: str, rate: float, burst: int, *, timeout_s: float
    ) -> None:
        super().__init__(rate, burst)
        self._prefix = key_prefix
        self._timeout_s = timeout_s  # the store's pool has no socket timeout
        self._take = client.register_script(_TAKE)

    def key(self, caller: str) -> str:
        return f"{self._prefix}:rl:{caller}"

    async def take(self, caller: str) -> float:
        try:
            async with asyncio.timeout(self._timeout_s):
                wait = await self._take(keys=[self.key(caller)], args=[self.rate, self.burst, 1])
        except _UNAVAILABLE as e:
            raise StoreUnavailable(f"Redis is unavailable: {e}") from e
        return float(wait)


def create_rate_limiter(settings: Settings, store: TaskStore) -> RateLimiter | None:
    """The limiter for ``settings`` over ``store``; None when rate limits are off."""
    if settings.rate_limit_per_s <= 0:
        return None
    burst = settings.rate_limit_burst or max(1, math.ceil(2 * settings.rate_limit_per_s))
    from ponder.store.redis import RedisStore

    if isinstance(store, RedisStore):
        return RedisRateLimiter(
            store.client,
            settings.key_prefix,
            settings.rate_limit_per_s,
            burst,
            timeout_s=settings.store_timeout_s,
        )
    return MemoryRateLimiter(settings.rate_limit_per_s, burst)
