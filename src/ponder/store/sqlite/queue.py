"""The work queue in SQLite: the ``queue`` table (an entry's ``model`` and ``priority``
name its queue); a claim waits on an in-process signal."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

from ponder.config.models import DEFAULT_MODEL
from ponder.store.contract import WorkQueue
from ponder.store.records import Claim, check_priorities
from ponder.store.sqlite.base import SqliteBase, wait
from ponder.store.sqlite.schema import LIVE

__all__ = ["SqliteWorkQueue"]


class SqliteWorkQueue(SqliteBase, WorkQueue):
    """:class:`WorkQueue` in SQLite: a claim's receipt is the queue row's id."""

    async def claim(
        self, consumer: str, priorities: Sequence[int], block_ms: int, *, model: str = DEFAULT_MODEL
    ) -> Claim | None:
        """Wakes on any model's new entry (one signal), and looks again."""
        check_priorities(priorities)
        deadline = asyncio.get_running_loop().time() + block_ms / 1000
        while True:
            woken = self._queued.waiter()
            now = time.time()
            async with self._conn() as db:
                for p in priorities:
                    rows = await db.execute_fetchall(
                        "UPDATE queue SET consumer = ?, claimed_at = ? WHERE id ="
                        " (SELECT id FROM queue WHERE consumer IS NULL AND model = ?"
                        "  AND priority = ? ORDER BY id LIMIT 1)"
                        " RETURNING id, task_id, (SELECT data FROM tasks"
                        f"  WHERE tasks.id = queue.task_id AND {LIVE})",
                        (consumer, now, model, p, now),
                    )
                    for receipt, task_id, record in rows:
                        return Claim(task_id, p, str(receipt), record, model)
            if block_ms <= 0 or not await wait(woken, deadline):
                return None

    async def reclaim(
        self, consumer: str, min_idle_s: float, limit: int = 10, *, model: str = DEFAULT_MODEL
    ) -> list[Claim]:
        """A consumer is dead when it is not in the workers table with an expiry ahead;
        only ``model``'s entries are taken."""
        now = time.time()
        async with self._conn() as db:
            rows = await db.execute_fetchall(
                "UPDATE queue SET consumer = ?, claimed_at = ? WHERE id IN"
                " (SELECT id FROM queue WHERE consumer IS NOT NULL AND model = ? AND"
                "  (claimed_at <= ? OR (consumer != ? AND consumer NOT IN"
                "    (SELECT id FROM workers WHERE expires_at > ?)))"
                "  ORDER BY priority, id LIMIT ?)"
                " RETURNING id, task_id, priority",
                (consumer, now, model, now - min_idle_s, consumer, now, limit),
            )
        ordered = sorted(rows, key=lambda r: (r[2], r[0]))
        return [Claim(t, int(p), str(i), None, model) for i, t, p in ordered]

    async def renew(self, consumer: str, claims: Sequence[Claim]) -> None:
        """Renews the leases ``consumer`` still holds; claims taken over by another are skipped."""
        now = time.time()
        async with self._conn() as db:
            await db.executemany(
                "UPDATE queue SET claimed_at = ? WHERE id = ? AND consumer = ?",
                [(now, int(c.receipt), consumer) for c in claims],
            )

    async def ack(self, claim: Claim) -> None:
        async with self._conn() as db:
            await db.execute("DELETE FROM queue WHERE id = ?", (int(claim.receipt),))

    async def release(self, claim: Claim) -> None:
        """The entry keeps its place in the queue (ahead of later ones of its level)."""
        async with self._conn() as db:
            await db.execute(
                "UPDATE queue SET consumer = NULL, claimed_at = NULL WHERE id = ?",
                (int(claim.receipt),),
            )
        self._queued.fire()
