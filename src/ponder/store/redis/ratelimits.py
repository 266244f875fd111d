"""Rate limits on Redis: a hash per caller's bucket, read and updated by one script."""

from __future__ import annotations

from ponder.store.contract import RateLimits
from ponder.store.redis.base import RedisBase, unavailable

__all__ = ["RedisRateLimits"]


class RedisRateLimits(RedisBase, RateLimits):
    """:class:`RateLimits` on Redis: ``{p}:rl:{caller}``, a hash ``tokens`` + ``ts``, read
    and updated by one Lua script on the server's clock, so any number of API processes
    share one limit per caller and clocks never disagree. The key expires once the bucket
    would be full again, so idle callers cost nothing."""

    async def take_token(self, caller: str, rate: float, burst: int) -> float:
        async with unavailable(self._timeout):
            wait = await self._take_token(keys=[self._bucket_key(caller)], args=[rate, burst, 1])
        return float(wait)

    def _bucket_key(self, caller: str) -> str:
        return f"{self._prefix}:rl:{caller}"
