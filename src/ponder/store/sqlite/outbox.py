"""The webhook outbox in SQLite: one row per delivery, ``outbox_once`` for ids added."""

from __future__ import annotations

import time
from collections.abc import Sequence

import aiosqlite

from ponder.store.contract import Outbox
from ponder.store.deliveries import OutboxEntry
from ponder.store.records import HostRoom, Notice
from ponder.store.sqlite.base import SqliteBase, first

__all__ = ["SqliteOutbox", "add_deliveries"]

#: rows looked at per claim of deliveries, beyond the limit (some may be for busy hosts)
_DELIVERY_SCAN = 64
#: a due delivery whose host is at its limit waits this long before it is looked at again
_BUSY_HOST_DEFER_S = 1.0


async def add_deliveries(
    db: aiosqlite.Connection, entries: Sequence[OutboxEntry], now: float, ttl_s: float
) -> int:
    """Add each entry whose id was never added (within the ttl); how many were."""
    added = 0
    for entry in entries:
        once = await db.execute(
            "INSERT OR IGNORE INTO outbox_once VALUES (?, ?)",
            (entry.webhook_id, now + ttl_s),
        )
        if once.rowcount != 1:
            continue
        await db.execute(
            "INSERT OR REPLACE INTO outbox (id, host, due_at, data, expires_at)"
            " VALUES (?, ?, ?, ?, ?)",
            (entry.webhook_id, entry.host, now, entry.to_storage(), now + ttl_s),
        )
        added += 1
    return added


class SqliteOutbox(SqliteBase, Outbox):
    """:class:`Outbox` in SQLite (a claimed row's ``due_at`` is the end of its lease)."""

    async def enqueue_deliveries(self, entries: Sequence[OutboxEntry]) -> None:
        if not entries:
            return
        async with self._tx() as db:
            added = await add_deliveries(db, entries, time.time(), self._ttl)
        if added:
            self._notices[Notice.outbox].post(str(added))

    async def claim_deliveries(
        self, consumer: str, limit: int, lease_s: float, room: HostRoom
    ) -> tuple[list[OutboxEntry], float | None]:
        if limit < 1:
            return [], None
        now = time.time()
        busy = dict(room.busy)
        taken: list[OutboxEntry] = []
        async with self._tx() as db:
            due = await db.execute_fetchall(
                "SELECT id, host, data FROM outbox WHERE due_at <= ? AND expires_at > ?"
                " ORDER BY due_at, id LIMIT ?",
                (now, now, limit + _DELIVERY_SCAN),
            )
            for webhook_id, host, data in due:
                left = busy.get(host, room.per_host)
                if left > 0 and len(taken) < limit:
                    busy[host] = left - 1
                    taken.append(OutboxEntry.from_storage(data))
                    await db.execute(
                        "UPDATE outbox SET due_at = ?, owner = ? WHERE id = ?",
                        (now + lease_s, consumer, webhook_id),
                    )
                elif left <= 0:  # let other hosts by
                    await db.execute(
                        "UPDATE outbox SET due_at = ? WHERE id = ?",
                        (now + _BUSY_HOST_DEFER_S, webhook_id),
                    )
            row = await first(db, "SELECT MIN(due_at) FROM outbox")
        return taken, None if row[0] is None else row[0] - now

    async def retry_delivery(self, consumer: str, entry: OutboxEntry, delay_s: float) -> bool:
        return await self._changed_one(
            "UPDATE outbox SET data = ?, owner = NULL, due_at = ? WHERE id = ? AND owner = ?",
            (entry.to_storage(), time.time() + delay_s, entry.webhook_id, consumer),
        )

    async def finish_delivery(self, webhook_id: str) -> None:
        async with self._conn() as db:
            await db.execute("DELETE FROM outbox WHERE id = ?", (webhook_id,))

    async def outbox_depth(self) -> int:
        async with self._conn() as db:
            row = await first(db, "SELECT COUNT(*) FROM outbox")
        return int(row[0])
