"""The OpenAI-compatible APIs' objects, blobs and parts on Redis."""

from __future__ import annotations

import json
from typing import Any

from ponder.store.contract import ObjectStore
from ponder.store.records import StoredObject
from ponder.store.redis.base import RedisBase, member_id, ms, unavailable

__all__ = ["RedisObjects"]


class RedisObjects(RedisBase, ObjectStore):
    """:class:`ObjectStore` on Redis: a hash per object (its own expiry), lexicographic
    indexes per owner and of the active ones, a string per blob, a hash per collection."""

    def _object_key(self, kind: str, obj_id: str) -> str:
        return f"{self._prefix}:obj:{kind}:{obj_id}"

    def _objects_key(self, kind: str, owner: str) -> str:
        return f"{self._prefix}:objs:{kind}:{owner}"

    def _active_key(self, kind: str) -> str:
        return f"{self._prefix}:active:{kind}"

    # --- objects ----------------------------------------------------------------------
    async def create_object(self, obj: StoredObject, *, ttl_s: float) -> bool:
        keys = [
            self._object_key(obj.kind, obj.id),
            self._objects_key(obj.kind, obj.owner),
            self._active_key(obj.kind),
        ]
        active = "1" if obj.active else "0"
        member = f"{obj.sort_key} {obj.id}"
        args: list[str | int] = [
            json.dumps(obj.data),
            obj.owner,
            obj.sort_key,
            active,
            ms(ttl_s),
            member,
        ]
        async with unavailable(self._timeout):
            created = await self._create_object(keys=keys, args=args)
        if created:
            obj.rev = 0
        return bool(created)

    async def get_object(self, kind: str, obj_id: str) -> StoredObject | None:
        async with unavailable(self._timeout):
            fields: Any = await self._r.hgetall(self._object_key(kind, obj_id))
        return _object(kind, obj_id, fields)

    async def update_object(self, obj: StoredObject, *, ttl_s: float | None = None) -> bool:
        keys = [self._object_key(obj.kind, obj.id), self._active_key(obj.kind)]
        args: list[str | int] = [
            obj.rev,
            json.dumps(obj.data),
            "1" if obj.active else "0",
            "" if ttl_s is None else ms(ttl_s),
            f"{obj.sort_key} {obj.id}",
        ]
        async with unavailable(self._timeout):
            written = await self._update_object(keys=keys, args=args)
        if written:
            obj.rev += 1
        return bool(written)

    async def delete_object(self, kind: str, obj_id: str) -> bool:
        obj = await self.get_object(kind, obj_id)
        if obj is None:
            return False
        member = f"{obj.sort_key} {obj.id}"
        async with unavailable(self._timeout), self._r.pipeline(transaction=True) as pipe:
            pipe.delete(self._object_key(kind, obj_id))
            pipe.zrem(self._objects_key(kind, obj.owner), member)
            pipe.zrem(self._active_key(kind), member)
            deleted, *_ = await pipe.execute()
        return bool(deleted)

    async def list_objects(
        self, kind: str, owner: str, *, after: str | None, limit: int
    ) -> tuple[list[StoredObject], bool]:
        if limit < 1:
            raise ValueError("limit must be at least 1")
        top = "+"
        if after is not None:
            last = await self.get_object(kind, after)
            if last is None or last.owner != owner:
                raise ValueError(f"unknown cursor {after!r}")
            top = f"({last.sort_key} {last.id}"
        index = self._objects_key(kind, owner)
        found: list[StoredObject] = []
        async with unavailable(self._timeout):
            while len(found) <= limit:
                members: list[Any] = await self._r.zrevrangebylex(index, top, "-", 0, limit + 1)
                if not members:
                    break
                async with self._r.pipeline(transaction=False) as pipe:
                    for member in members:
                        pipe.hgetall(self._object_key(kind, member_id(member)))
                    rows: list[Any] = await pipe.execute()
                gone = []
                for member, fields in zip(members, rows, strict=True):
                    obj = _object(kind, member_id(member), fields)
                    if obj is None:
                        gone.append(member)
                    else:
                        found.append(obj)
                if gone:
                    await self._r.zrem(index, *gone)
                top = f"({members[-1]}"
        return found[:limit], len(found) > limit

    async def active_objects(self, kind: str) -> list[str]:
        key = self._active_key(kind)
        async with unavailable(self._timeout):
            members: list[Any] = await self._r.zrangebylex(key, "-", "+")
            if not members:
                return []
            async with self._r.pipeline(transaction=False) as pipe:
                for member in members:
                    pipe.exists(self._object_key(kind, member_id(member)))
                alive: list[int] = await pipe.execute()
            gone = [m for m, live in zip(members, alive, strict=True) if not live]
            if gone:
                await self._r.zrem(key, *gone)
        return [member_id(m) for m, live in zip(members, alive, strict=True) if live]

    # --- blobs and parts --------------------------------------------------------------
    async def put_blob(self, key: str, data: str, *, ttl_s: float) -> None:
        async with unavailable(self._timeout):
            await self._r.set(f"{self._prefix}:blob:{key}", data, px=ms(ttl_s))

    async def get_blob(self, key: str) -> str | None:
        async with unavailable(self._timeout):
            data: Any = await self._r.get(f"{self._prefix}:blob:{key}")
        return None if data is None else str(data)

    async def delete_blob(self, key: str) -> None:
        async with unavailable(self._timeout):
            await self._r.delete(f"{self._prefix}:blob:{key}")

    async def put_part(self, key: str, index: int, data: str, *, ttl_s: float) -> None:
        name = f"{self._prefix}:parts:{key}"
        async with unavailable(self._timeout), self._r.pipeline(transaction=True) as pipe:
            pipe.hset(name, str(index), data)
            pipe.pexpire(name, ms(ttl_s))
            await pipe.execute()

    async def get_parts(self, key: str) -> dict[int, str]:
        async with unavailable(self._timeout):
            parts: Any = await self._r.hgetall(f"{self._prefix}:parts:{key}")
        return {int(i): data for i, data in parts.items()}

    async def delete_parts(self, key: str) -> None:
        async with unavailable(self._timeout):
            await self._r.delete(f"{self._prefix}:parts:{key}")


def _object(kind: str, obj_id: str, fields: dict[str, str]) -> StoredObject | None:
    """The object of a hash read by HGETALL (empty: gone)."""
    if "data" not in fields:
        return None
    return StoredObject(
        kind=kind,
        id=obj_id,
        owner=fields.get("owner", ""),
        sort_key=fields.get("sort_key", ""),
        data=json.loads(fields["data"]),
        rev=int(fields.get("rev", 0)),
        active=fields.get("active") == "1",
    )
