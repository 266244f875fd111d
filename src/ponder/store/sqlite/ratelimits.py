"""Rate limits of the embedded store: the buckets live in this process's memory (the
store's single process; nothing of them is written to the file)."""

from __future__ import annotations

import time
from collections import OrderedDict

from ponder.config import Settings
from ponder.store.contract import RateLimits
from ponder.store.sqlite.base import SqliteBase

__all__ = ["MemoryBuckets", "SqliteRateLimits"]


class MemoryBuckets:
    """Token buckets in memory, at most ``max_buckets`` of them: full ones go first, then
    the least recently used."""

    def __init__(self, *, max_buckets: int = 100_000) -> None:
        self.max_buckets = max_buckets
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._buckets)

    def take_at(self, caller: str, now: float, rate: float, burst: int) -> float:
        """:meth:`~ponder.store.contract.RateLimits.take_token` at the monotonic time
        ``now`` (tests drive the clock)."""
        tokens, ts = self._buckets.pop(caller, (float(burst), now))
        tokens = min(float(burst), tokens + max(0.0, now - ts) * rate)
        wait = 0.0
        if tokens >= 1:
            tokens -= 1
        else:
            wait = (1 - tokens) / rate
        self._buckets[caller] = (tokens, now)  # most recently used last
        if len(self._buckets) > self.max_buckets:
            self._evict(now, burst / rate)
        return wait

    def _evict(self, now: float, refill_s: float) -> None:
        for caller, (_, ts) in list(self._buckets.items()):
            if now - ts >= refill_s:  # full again: the same as no bucket
                del self._buckets[caller]
        while len(self._buckets) > self.max_buckets:
            self._buckets.popitem(last=False)


class SqliteRateLimits(SqliteBase, RateLimits):
    """:class:`RateLimits` in :class:`MemoryBuckets` (they work while the file is closed)."""

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings)
        self.buckets = MemoryBuckets()

    async def take_token(self, caller: str, rate: float, burst: int) -> float:
        return self.buckets.take_at(caller, time.monotonic(), rate, burst)
