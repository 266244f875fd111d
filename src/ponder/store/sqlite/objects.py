"""The OpenAI-compatible APIs' objects, blobs and parts in SQLite."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any

from ponder.store.contract import ObjectStore
from ponder.store.records import StoredObject
from ponder.store.sqlite.base import SqliteBase, first

__all__ = ["SqliteObjects"]

_OBJECT_COLUMNS = "kind, id, owner, sort_key, rev, active, data"


def _object(row: Sequence[Any]) -> StoredObject:
    kind, obj_id, owner, key, rev, active, data = row
    return StoredObject(kind, obj_id, owner, key, json.loads(data), int(rev), bool(active))


class SqliteObjects(SqliteBase, ObjectStore):
    """:class:`ObjectStore` in SQLite: the ``objects``, ``blobs`` and ``parts`` tables."""

    # --- objects ----------------------------------------------------------------------
    async def create_object(self, obj: StoredObject, *, ttl_s: float) -> bool:
        now = time.time()
        async with self._tx() as db:
            await db.execute(
                "DELETE FROM objects WHERE kind = ? AND id = ? AND expires_at <= ?",
                (obj.kind, obj.id, now),
            )
            cur = await db.execute(
                "INSERT OR IGNORE INTO objects VALUES (?, ?, ?, ?, 0, ?, ?, ?)",
                (
                    obj.kind,
                    obj.id,
                    obj.owner,
                    obj.sort_key,
                    int(obj.active),
                    json.dumps(obj.data),
                    now + ttl_s,
                ),
            )
        if cur.rowcount == 1:
            obj.rev = 0
        return cur.rowcount == 1

    async def get_object(self, kind: str, obj_id: str) -> StoredObject | None:
        async with self._conn() as db:
            row = await first(
                db,
                f"SELECT {_OBJECT_COLUMNS} FROM objects"
                " WHERE kind = ? AND id = ? AND expires_at > ?",
                (kind, obj_id, time.time()),
            )
        return None if row is None else _object(row)

    async def update_object(self, obj: StoredObject, *, ttl_s: float | None = None) -> bool:
        now = time.time()
        written = await self._changed_one(
            "UPDATE objects SET data = ?, rev = rev + 1, active = ?,"
            " expires_at = COALESCE(?, expires_at)"
            " WHERE kind = ? AND id = ? AND rev = ? AND expires_at > ?",
            (
                json.dumps(obj.data),
                int(obj.active),
                None if ttl_s is None else now + ttl_s,
                obj.kind,
                obj.id,
                obj.rev,
                now,
            ),
        )
        if written:
            obj.rev += 1
        return written

    async def delete_object(self, kind: str, obj_id: str) -> bool:
        return await self._changed_one(
            "DELETE FROM objects WHERE kind = ? AND id = ? AND expires_at > ?",
            (kind, obj_id, time.time()),
        )

    async def list_objects(
        self, kind: str, owner: str, *, after: str | None, limit: int
    ) -> tuple[list[StoredObject], bool]:
        if limit < 1:
            raise ValueError("limit must be at least 1")
        sql = (
            f"SELECT {_OBJECT_COLUMNS} FROM objects WHERE kind = ? AND owner = ? AND expires_at > ?"
        )
        params: list[Any] = [kind, owner, time.time()]
        if after is not None:
            last = await self.get_object(kind, after)
            if last is None or last.owner != owner:
                raise ValueError(f"unknown cursor {after!r}")
            sql += " AND sort_key < ?"
            params.append(last.sort_key)
        sql += " ORDER BY sort_key DESC LIMIT ?"
        params.append(limit + 1)
        async with self._conn() as db:
            rows = await db.execute_fetchall(sql, params)
        objects = [_object(row) for row in rows]
        return objects[:limit], len(objects) > limit

    async def active_objects(self, kind: str) -> list[str]:
        async with self._conn() as db:
            rows = await db.execute_fetchall(
                "SELECT id FROM objects WHERE kind = ? AND active = 1 AND expires_at > ?"
                " ORDER BY sort_key",
                (kind, time.time()),
            )
        return [row[0] for row in rows]

    # --- blobs and parts --------------------------------------------------------------
    async def put_blob(self, key: str, data: str, *, ttl_s: float) -> None:
        async with self._conn() as db:
            await db.execute(
                "INSERT OR REPLACE INTO blobs VALUES (?, ?, ?)", (key, data, time.time() + ttl_s)
            )

    async def get_blob(self, key: str) -> str | None:
        async with self._conn() as db:
            row = await first(
                db, "SELECT data FROM blobs WHERE key = ? AND expires_at > ?", (key, time.time())
            )
        return None if row is None else str(row[0])

    async def delete_blob(self, key: str) -> None:
        async with self._conn() as db:
            await db.execute("DELETE FROM blobs WHERE key = ?", (key,))

    async def put_part(self, key: str, index: int, data: str, *, ttl_s: float) -> None:
        async with self._conn() as db:
            await db.execute(
                "INSERT OR REPLACE INTO parts VALUES (?, ?, ?, ?)",
                (key, index, data, time.time() + ttl_s),
            )

    async def get_parts(self, key: str) -> dict[int, str]:
        async with self._conn() as db:
            rows = await db.execute_fetchall(
                "SELECT idx, data FROM parts WHERE key = ? AND expires_at > ?", (key, time.time())
            )
        return {int(i): str(data) for i, data in rows}

    async def delete_parts(self, key: str) -> None:
        async with self._conn() as db:
            await db.execute("DELETE FROM parts WHERE key = ?", (key,))
