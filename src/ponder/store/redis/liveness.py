"""Liveness on Redis: the workers' sorted set of expiries, and named leases."""

from __future__ import annotations

from ponder.store.contract import Liveness
from ponder.store.redis.base import RedisBase, ms, unavailable

__all__ = ["RedisLiveness"]


class RedisLiveness(RedisBase, Liveness):
    """:class:`Liveness` on Redis (worker expiries in the server's clock)."""

    # --- workers ----------------------------------------------------------------------
    async def register_worker(self, worker_id: str, ttl_s: float) -> None:
        async with unavailable(self._timeout):
            await self._register(keys=[self._workers_key], args=[worker_id, ttl_s])

    async def unregister_worker(self, worker_id: str) -> None:
        async with unavailable(self._timeout):
            await self._r.zrem(self._workers_key, worker_id)

    async def live_workers(self) -> int:
        async with unavailable(self._timeout):
            return int(await self._live(keys=[self._workers_key]))

    # --- named leases -----------------------------------------------------------------
    async def acquire_lease(self, name: str, holder: str, ttl_s: float) -> bool:
        keys = [f"{self._prefix}:lease:{name}"]
        async with unavailable(self._timeout):
            return bool(await self._acquire_lease(keys=keys, args=[holder, ms(ttl_s)]))

    async def release_lease(self, name: str, holder: str) -> None:
        keys = [f"{self._prefix}:lease:{name}"]
        async with unavailable(self._timeout):
            await self._release_lease(keys=keys, args=[holder])
