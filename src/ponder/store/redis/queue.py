"""The work queue on Redis: one stream per model and priority level, each read by one
consumer group (made on a model's first read)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from redis import exceptions as rexc

from ponder.config.models import DEFAULT_MODEL
from ponder.store.contract import WorkQueue
from ponder.store.records import Claim, check_priorities
from ponder.store.redis.base import GROUP, GROUP_LOST, RedisBase, unavailable

__all__ = ["RedisWorkQueue"]


class RedisWorkQueue(RedisBase, WorkQueue):
    """:class:`WorkQueue` on Redis Streams: an entry's id is the claim's receipt."""

    async def claim(
        self, consumer: str, priorities: Sequence[int], block_ms: int, *, model: str = DEFAULT_MODEL
    ) -> Claim | None:
        """Tries the levels in order, then one XREADGROUP BLOCK over them all.

        That blocking read can return entries of several levels at once (when they arrive
        between the two calls); the first in ``priorities`` order is kept and the others
        are released, which puts them at the end of their queues.
        """
        check_priorities(priorities)
        keys = [self._queue_key(p, model) for p in priorities]
        async with unavailable(self._timeout):
            hit = await self._grouped(
                keys, lambda: self._claim(keys=keys, args=[GROUP, consumer, self._task_key("")])
            )
        if hit:
            return Claim(hit[2], priorities[hit[0] - 1], hit[1], hit[3] or None, model)
        if block_ms <= 0:  # BLOCK 0 would wait forever
            return None
        read = ("XREADGROUP", "GROUP", GROUP, consumer, "COUNT", 1, "BLOCK", block_ms)
        lane = self._claim_lane(consumer)
        async with unavailable(self._blocking(block_ms)):
            try:
                reply: Any = await self._grouped(
                    keys,
                    lambda: lane.call(*read, "STREAMS", *keys, *[">"] * len(keys)),
                    again=False,
                )
            except rexc.ResponseError as e:
                if not str(e).startswith(GROUP_LOST):
                    raise
                return None  # the groups are back: the next claim reads them
        got: dict[int, Claim] = {}
        for key, entries in reply or ():
            for entry_id, flat in entries:
                fields = dict(zip(flat[::2], flat[1::2], strict=True))
                level = keys.index(key)
                got[level] = Claim(
                    fields["task"], priorities[level], entry_id, fields.get("data"), model
                )
        if not got:
            return None
        first, *rest = (got[i] for i in sorted(got))
        for extra in rest:
            await self.release(extra)
        return first

    async def reclaim(
        self, consumer: str, min_idle_s: float, limit: int = 10, *, model: str = DEFAULT_MODEL
    ) -> list[Claim]:
        """Looks at ``model``'s streams only: a dead consumer's entries in another model's
        are left to that model's workers."""
        if limit < 1:
            return []
        queues = self._queue_keys(model)
        keys = [*queues, self._workers_key]
        args: list[str | int] = [GROUP, consumer, int(min_idle_s * 1000), limit]
        async with unavailable(self._timeout):
            taken = await self._grouped(queues, lambda: self._reclaim(keys=keys, args=args))
        return [Claim(task_id, int(p), entry_id, None, model) for p, entry_id, task_id in taken]

    async def renew(self, consumer: str, claims: Sequence[Claim]) -> None:
        """Resets the idle time of the claims ``consumer`` still holds; others are skipped."""
        if not claims:
            return
        keys = [self._queue_key(c.priority, c.model) for c in claims]
        async with unavailable(self._timeout):
            args = [GROUP, consumer, *(c.receipt for c in claims)]
            await self._grouped(keys, lambda: self._renew(keys=keys, args=args))

    async def ack(self, claim: Claim) -> None:
        key = self._queue_key(claim.priority, claim.model)
        async with unavailable(self._timeout), self._r.pipeline(transaction=True) as pipe:
            pipe.xack(key, GROUP, claim.receipt)
            pipe.xdel(key, claim.receipt)
            await pipe.execute()

    async def release(self, claim: Claim) -> None:
        keys = [self._queue_key(claim.priority, claim.model)]
        async with unavailable(self._timeout):
            await self._release(keys=keys, args=[GROUP, claim.receipt, claim.task_id])
