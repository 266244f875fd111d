"""The webhook outbox on Redis: a sorted set of ids by due time, a hash per delivery."""

from __future__ import annotations

from collections.abc import Sequence

from ponder.store.contract import Outbox
from ponder.store.deliveries import OutboxEntry
from ponder.store.records import HostRoom, Notice
from ponder.store.redis.base import RedisBase, unavailable

__all__ = ["RedisOutbox"]

#: rows looked at per claim of deliveries, beyond the limit (some may be for busy hosts)
_DELIVERY_SCAN = 64
#: a due delivery whose host is at its limit waits this long before it is looked at again
_BUSY_HOST_DEFER_MS = 1000


class RedisOutbox(RedisBase, Outbox):
    """:class:`Outbox` on Redis (due times and leases in the server's clock)."""

    async def enqueue_deliveries(self, entries: Sequence[OutboxEntry]) -> None:
        if not entries:
            return
        args: list[str | int] = [self._delivery_key(""), self._ttl]
        for entry in entries:
            args += [entry.webhook_id, entry.to_storage(), entry.host]
        keys = [self._outbox_key, self._notice_key(Notice.outbox)]
        async with unavailable(self._timeout):
            await self._enqueue(keys=keys, args=args)

    async def claim_deliveries(
        self, consumer: str, limit: int, lease_s: float, room: HostRoom
    ) -> tuple[list[OutboxEntry], float | None]:
        if limit < 1:
            return [], None
        args: list[str | int] = [
            consumer,
            limit,
            round(lease_s * 1000),
            room.per_host,
            self._delivery_key(""),
            limit + _DELIVERY_SCAN,
            _BUSY_HOST_DEFER_MS,
        ]
        for host, left in room.busy.items():
            args += [host, left]
        async with unavailable(self._timeout):
            datas, wait_ms = await self._claim_deliveries(keys=[self._outbox_key], args=args)
        entries = [OutboxEntry.from_storage(d) for d in datas]
        return entries, None if wait_ms is None else int(wait_ms) / 1000

    async def retry_delivery(self, consumer: str, entry: OutboxEntry, delay_s: float) -> bool:
        keys = [self._outbox_key, self._delivery_key(entry.webhook_id)]
        args: list[str | int] = [
            consumer,
            entry.webhook_id,
            entry.to_storage(),
            round(delay_s * 1000),
        ]
        async with unavailable(self._timeout):
            return bool(await self._retry_delivery(keys=keys, args=args))

    async def finish_delivery(self, webhook_id: str) -> None:
        async with unavailable(self._timeout), self._r.pipeline(transaction=True) as pipe:
            pipe.zrem(self._outbox_key, webhook_id)
            pipe.delete(self._delivery_key(webhook_id))
            await pipe.execute()

    async def outbox_depth(self) -> int:
        async with unavailable(self._timeout):
            return int(await self._r.zcard(self._outbox_key))
