"""Liveness in SQLite: the ``workers`` table of expiries, and the ``leases`` table."""

from __future__ import annotations

import time

from ponder.store.contract import Liveness
from ponder.store.sqlite.base import SqliteBase, first

__all__ = ["SqliteLiveness"]


class SqliteLiveness(SqliteBase, Liveness):
    """:class:`Liveness` in SQLite."""

    # --- workers ----------------------------------------------------------------------
    async def register_worker(self, worker_id: str, ttl_s: float) -> None:
        async with self._conn() as db:
            await db.execute(
                "INSERT OR REPLACE INTO workers VALUES (?, ?)", (worker_id, time.time() + ttl_s)
            )

    async def unregister_worker(self, worker_id: str) -> None:
        async with self._conn() as db:
            await db.execute("DELETE FROM workers WHERE id = ?", (worker_id,))

    async def live_workers(self) -> int:
        async with self._conn() as db:
            row = await first(
                db, "SELECT COUNT(*) FROM workers WHERE expires_at > ?", (time.time(),)
            )
        return int(row[0])

    # --- named leases -----------------------------------------------------------------
    async def acquire_lease(self, name: str, holder: str, ttl_s: float) -> bool:
        now = time.time()
        return await self._changed_one(
            "INSERT INTO leases VALUES (?, ?, ?) ON CONFLICT (name) DO UPDATE SET"
            " holder = excluded.holder, expires_at = excluded.expires_at"
            " WHERE leases.holder = excluded.holder OR leases.expires_at <= ?",
            (name, holder, now + ttl_s, now),
        )

    async def release_lease(self, name: str, holder: str) -> None:
        async with self._conn() as db:
            await db.execute("DELETE FROM leases WHERE name = ? AND holder = ?", (name, holder))
