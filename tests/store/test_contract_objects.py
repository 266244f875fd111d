"""The ObjectStore part of the contract (the OpenAI-compatible APIs' objects, blobs and
parts), against both stores (``store`` fixture)."""

from __future__ import annotations

import asyncio

import pytest

from ponder.ids import sort_key
from ponder.store import TaskStore
from ponder.store.base import StoredObject

from .helpers import ids


def new_object(kind: str = "batch", owner: str = "k1", *, active: bool = False) -> StoredObject:
    raw = ids.new_id()
    return StoredObject(kind, f"{kind}_{raw}", owner, sort_key(raw), {"n": 1}, active=active)


# --- objects ----------------------------------------------------------------------------
async def test_an_object_is_created_once(store: TaskStore) -> None:
    obj = new_object(active=True)
    assert await store.create_object(obj, ttl_s=60)
    again = StoredObject(obj.kind, obj.id, "k2", obj.sort_key, {"other": True})
    assert not await store.create_object(again, ttl_s=60)
    got = await store.get_object(obj.kind, obj.id)
    assert got == obj
    assert await store.get_object("file", obj.id) is None  # kinds are separate


async def test_update_object_writes_over_the_revision_read(store: TaskStore) -> None:
    obj = new_object(active=True)
    await store.create_object(obj, ttl_s=60)
    first = await store.get_object(obj.kind, obj.id)
    second = await store.get_object(obj.kind, obj.id)
    assert first is not None and second is not None
    first.data = {"n": 2}
    assert await store.update_object(first)
    assert first.rev == 1
    second.data = {"n": 3}
    assert not await store.update_object(second)  # it changed since it was read
    got = await store.get_object(obj.kind, obj.id)
    assert got is not None and got.data == {"n": 2} and got.rev == 1 and got.active
    got.active = False
    assert await store.update_object(got)
    assert await store.active_objects(obj.kind) == []
    assert not await store.update_object(new_object())  # never created


async def test_objects_expire(store: TaskStore) -> None:
    obj = new_object(active=True)
    await store.create_object(obj, ttl_s=0.05)
    kept = new_object()
    await store.create_object(kept, ttl_s=0.05)
    assert await store.update_object(kept, ttl_s=60)  # a new time to live
    await asyncio.sleep(0.15)
    assert await store.get_object(obj.kind, obj.id) is None
    assert not await store.update_object(obj)
    assert await store.active_objects(obj.kind) == []
    assert await store.get_object(kept.kind, kept.id) is not None
    assert await store.create_object(obj, ttl_s=60)  # its id is free again


async def test_list_objects_newest_first_with_a_cursor(store: TaskStore) -> None:
    made = [new_object(owner="k1") for _ in range(5)]
    for obj in made:
        await store.create_object(obj, ttl_s=60)
    await store.create_object(new_object(owner="k2"), ttl_s=60)
    await store.create_object(new_object("file", owner="k1"), ttl_s=60)
    page, more = await store.list_objects("batch", "k1", after=None, limit=2)
    assert [o.id for o in page] == [made[4].id, made[3].id] and more
    page, more = await store.list_objects("batch", "k1", after=page[-1].id, limit=2)
    assert [o.id for o in page] == [made[2].id, made[1].id] and more
    page, more = await store.list_objects("batch", "k1", after=page[-1].id, limit=2)
    assert [o.id for o in page] == [made[0].id] and not more
    assert await store.delete_object("batch", made[3].id)
    assert not await store.delete_object("batch", made[3].id)
    page, _ = await store.list_objects("batch", "k1", after=None, limit=10)
    assert [o.id for o in page] == [o.id for o in reversed(made) if o is not made[3]]
    with pytest.raises(ValueError):
        await store.list_objects("batch", "k1", after=made[3].id, limit=2)
    with pytest.raises(ValueError):  # another owner's object is no cursor
        await store.list_objects("batch", "k2", after=made[0].id, limit=2)


async def test_active_objects_oldest_first(store: TaskStore) -> None:
    a, b, c = new_object(active=True), new_object(), new_object(active=True)
    for obj in (a, b, c):
        await store.create_object(obj, ttl_s=60)
    assert await store.active_objects("batch") == [a.id, c.id]
    await store.delete_object("batch", a.id)
    assert await store.active_objects("batch") == [c.id]


# --- blobs and parts --------------------------------------------------------------------
async def test_blobs(store: TaskStore) -> None:
    text = '{"a": "é"}\n' * 1000
    await store.put_blob("f1", text, ttl_s=60)
    assert await store.get_blob("f1") == text
    await store.put_blob("f1", "new", ttl_s=60)
    assert await store.get_blob("f1") == "new"
    await store.delete_blob("f1")
    assert await store.get_blob("f1") is None
    await store.put_blob("f2", "x", ttl_s=0.05)
    await asyncio.sleep(0.15)
    assert await store.get_blob("f2") is None


async def test_parts(store: TaskStore) -> None:
    await store.put_part("b1", 3, "three", ttl_s=60)
    await store.put_part("b1", 0, "zero", ttl_s=60)
    await store.put_part("b1", 3, "THREE", ttl_s=60)
    assert await store.get_parts("b1") == {0: "zero", 3: "THREE"}
    assert await store.get_parts("b2") == {}
    await store.delete_parts("b1")
    assert await store.get_parts("b1") == {}
