"""Liveness in SQLite: the ``workers`` table of expiries, and the ``leases`` table."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence

from ponder.store.contract import Liveness
from ponder.store.records import ModelState
from ponder.store.sqlite.base import SqliteBase, first

__all__ = ["SqliteLiveness"]


class SqliteLiveness(SqliteBase, Liveness):
    """:class:`Liveness` in SQLite."""

    # --- workers ----------------------------------------------------------------------
    async def register_worker(
        self, worker_id: str, ttl_s: float, models: Sequence[ModelState] = ()
    ) -> None:
        """The model states are a JSON list in the worker's row."""
        states = json.dumps([m.to_json() for m in models])
        async with self._conn() as db:
            await db.execute(
                "INSERT OR REPLACE INTO workers (id, expires_at, models) VALUES (?, ?, ?)",
                (worker_id, time.time() + ttl_s, states),
            )

    async def served_models(self) -> list[ModelState]:
        async with self._conn() as db:
            rows = await db.execute_fetchall(
                "SELECT models FROM workers WHERE expires_at > ? AND models IS NOT NULL"
                " ORDER BY id",
                (time.time(),),
            )
        return [ModelState(**state) for (states,) in rows for state in json.loads(states)]

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
