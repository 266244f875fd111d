"""Liveness on Redis: the workers' sorted set of expiries, and named leases."""

from __future__ import annotations

import json
from collections.abc import Sequence

from ponder.store.contract import Liveness
from ponder.store.records import ModelState
from ponder.store.redis.base import RedisBase, ms, unavailable

__all__ = ["RedisLiveness"]


class RedisLiveness(RedisBase, Liveness):
    """:class:`Liveness` on Redis (worker expiries in the server's clock)."""

    # --- workers ----------------------------------------------------------------------
    async def register_worker(
        self, worker_id: str, ttl_s: float, models: Sequence[ModelState] = ()
    ) -> None:
        """The expiry in ``{p}:workers``, the model states (a JSON list) in
        ``{p}:workers:models``, in one script."""
        keys = [self._workers_key, self._worker_models_key]
        states = json.dumps([m.to_json() for m in models])
        async with unavailable(self._timeout):
            await self._register(keys=keys, args=[worker_id, ttl_s, states])

    async def served_models(self) -> list[ModelState]:
        keys = [self._workers_key, self._worker_models_key]
        async with unavailable(self._timeout):
            found: list[str] = await self._served(keys=keys)
        return [ModelState(**state) for states in found for state in json.loads(states)]

    async def unregister_worker(self, worker_id: str) -> None:
        async with unavailable(self._timeout), self._r.pipeline(transaction=True) as pipe:
            pipe.zrem(self._workers_key, worker_id)
            pipe.hdel(self._worker_models_key, worker_id)
            await pipe.execute()

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
