"""The EventLog part of the contract (each task's events, ``append_events`` for delta
events, notices), against both stores (``store`` fixture)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from ponder.store import Notice, TaskStore
from ponder.types import TaskStatus

from .helpers import add, advance


# --- events -----------------------------------------------------------------------------
async def test_events_read_back_in_order_and_resume_after_an_id(store: TaskStore) -> None:
    task = await add(store)
    task.status = TaskStatus.running
    appended: list[tuple[str, dict[str, Any]]] = [
        ("status", {"status": "running"}),
        ("sample", {"index": 0, "answer": "4"}),
    ]
    assert await store.update_task(task, appended)
    task.status = TaskStatus.done
    assert await store.update_task(task, [("result", {"answer": "4"})])

    events = await store.read_events(task.id, None)
    assert [(e.event, e.data) for e in events] == [
        ("status", {"status": "pending"}),
        *appended,
        ("result", {"answer": "4"}),
    ]
    assert len({e.id for e in events}) == 4
    assert await store.read_events(task.id, events[1].id) == events[2:]
    assert await store.read_events(task.id, events[0].id, limit=2) == events[1:3]
    assert await store.read_events(task.id, events[-1].id) == []


async def test_read_events_waits_for_the_next_event(store: TaskStore) -> None:
    task = await add(store)
    (first,) = await store.read_events(task.id, None)
    started = time.monotonic()
    assert await store.read_events(task.id, first.id, block_ms=300) == []
    assert time.monotonic() - started >= 0.25

    reader = asyncio.create_task(store.read_events(task.id, first.id, block_ms=10_000))
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(asyncio.shield(reader), 0.3)
    task.status = TaskStatus.running
    assert await store.update_task(task, [("status", {"status": "running"})])
    events = await asyncio.wait_for(reader, 5)
    assert [e.data for e in events] == [{"status": "running"}]


# --- streamed text (delta events) -------------------------------------------------------
@pytest.mark.timeout(30)
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


@pytest.mark.timeout(30)
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


@pytest.mark.timeout(30)
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


# --- notices ----------------------------------------------------------------------------
async def test_a_cancel_posts_a_notice_once(store: TaskStore) -> None:
    cursor, seen = await store.read_notices(Notice.cancel, None, 0)
    assert seen == []
    kept, cancelled = await add(store), await add(store)
    await advance(store, kept, TaskStatus.running)
    await advance(store, cancelled, TaskStatus.cancelled)
    await advance(store, cancelled, TaskStatus.cancelled)  # a rewrite of a cancelled task
    cursor, seen = await store.read_notices(Notice.cancel, cursor, 0)
    assert seen == [cancelled.id]
    assert await store.read_notices(Notice.cancel, cursor, 0) == (cursor, [])


async def test_a_blocked_reader_wakes_on_a_notice(store: TaskStore) -> None:
    task = await add(store)
    cursor, _ = await store.read_notices(Notice.cancel, None, 0)
    started = time.monotonic()
    assert await store.read_notices(Notice.cancel, cursor, 300) == (cursor, [])
    assert time.monotonic() - started >= 0.25
    reader = asyncio.create_task(store.read_notices(Notice.cancel, cursor, 10_000))
    with pytest.raises(TimeoutError):  # waiting, not returning early
        await asyncio.wait_for(asyncio.shield(reader), 0.3)
    await advance(store, task, TaskStatus.cancelled)
    after, seen = await asyncio.wait_for(reader, 5)
    assert seen == [task.id] and after != cursor


@pytest.mark.timeout(30)
async def test_posted_notices_reach_readers_in_order(store: TaskStore) -> None:
    cursor, _ = await store.read_notices(Notice.follow, None, 0)
    cancels, _ = await store.read_notices(Notice.cancel, None, 0)
    reader = asyncio.create_task(store.read_notices(Notice.follow, cursor, 10_000))
    with pytest.raises(TimeoutError):  # waiting, not returning early
        await asyncio.wait_for(asyncio.shield(reader), 0.1)
    await store.post_notice(Notice.follow, "a")
    after, seen = await asyncio.wait_for(reader, 5)
    assert seen == ["a"]
    await store.post_notice(Notice.follow, "b")
    await store.post_notice(Notice.follow, "c")
    _, seen = await store.read_notices(Notice.follow, after, 0)
    assert seen == ["b", "c"]
    # one topic's notices are not another's
    assert await store.read_notices(Notice.cancel, cancels, 0) == (cancels, [])
