"""``TaskStore.append_events`` (delta events): part of the store contract, both stores."""

from __future__ import annotations

import asyncio

import pytest

from ponder.store import TaskStore
from ponder.types import TaskStatus
from tests.store.test_contract import add, advance

pytestmark = pytest.mark.timeout(30)


async def test_appends_to_a_running_task_without_touching_its_record(store: TaskStore) -> None:
    task = await add(store)
    await advance(store, task, TaskStatus.running)
    before = await store.get_task(task.id)
    assert before is not None
    deltas = [
        ("delta", {"index": 0, "offset": 0, "text": "Let"}),
        ("delta", {"index": 1, "offset": 0, "text": "So"}),
    ]
    assert await store.append_events(task.id, deltas)
    events = await store.read_events(task.id, None)
    assert [(e.event, e.data) for e in events[-2:]] == deltas
    after = await store.get_task(task.id)
    assert after is not None and after.to_storage() == before.to_storage()
    # the record's revision is unchanged: the worker's next write still succeeds
    task.samples_done = 1
    assert await store.update_task(task, [("sample", {"index": 0})])
    ids = [e.id for e in await store.read_events(task.id, None)]
    assert len(set(ids)) == len(ids) == 5
    assert [e.event for e in await store.read_events(task.id, ids[2])] == ["delta", "sample"]


async def test_refused_unless_the_task_is_running(store: TaskStore) -> None:
    delta = [("delta", {"index": 0, "offset": 0, "text": "x"})]
    task = await add(store)
    assert not await store.append_events(task.id, delta)  # pending
    await advance(store, task, TaskStatus.running)
    await advance(store, task, TaskStatus.cancelled)
    assert not await store.append_events(task.id, delta)  # ended: nothing after the end
    assert [e.event for e in await store.read_events(task.id, None)] == ["status"] * 3
    assert not await store.append_events("1764412800123-nobody-1", delta)
    assert await store.read_events("1764412800123-nobody-1", None) == []


async def test_wakes_a_blocked_reader(store: TaskStore) -> None:
    task = await add(store)
    await advance(store, task, TaskStatus.running)
    last = (await store.read_events(task.id, None))[-1].id
    reader = asyncio.create_task(store.read_events(task.id, last, block_ms=5000))
    await asyncio.sleep(0.1)
    assert not reader.done()
    assert await store.append_events(task.id, [("delta", {"index": 0, "offset": 0, "text": "a"})])
    events = await asyncio.wait_for(reader, 2)
    assert [e.data["text"] for e in events] == ["a"]
