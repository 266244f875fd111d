"""The TaskRecords part of the contract (records, admission, updates, listings, batch
lines' own backlog, bulk reads), against both stores (``store`` fixture)."""

from __future__ import annotations

import asyncio

import pytest

from ponder.errors import IdempotencyConflict, QueueFull
from ponder.store import TaskStore
from ponder.store.base import Admission
from ponder.types import Task, TaskStatus

from .helpers import ALL, add, advance, ids, make_task


def new_task(owner: str = "") -> Task:
    return Task(id=ids.new_id(), priority=5, prompt="x", owner=owner)


# --- records ----------------------------------------------------------------------------
async def test_create_then_get_roundtrips(store: TaskStore) -> None:
    task = Task(id=ids.new_id(), priority=1, prompt="2+2?", owner="k1", metadata={"a": [1]})
    stored, created = await store.create_task(task, Admission(max_pending=10))
    assert created and stored is task
    got = await store.get_task(task.id)
    assert got is not None
    assert got.to_storage() == task.to_storage()
    assert got.owner == "k1"
    assert await store.get_task(ids.new_id()) is None


async def test_idempotency_key_with_same_body_returns_the_stored_task(store: TaskStore) -> None:
    first, created = await store.create_task(
        make_task(), Admission(max_pending=10, idempotency_key="k", body_hash="h1")
    )
    assert created
    again, created = await store.create_task(
        make_task(), Admission(max_pending=10, idempotency_key="k", body_hash="h1")
    )
    assert not created
    assert again.id == first.id
    assert await store.pending_count() == 1


async def test_idempotency_key_with_other_body_conflicts(store: TaskStore) -> None:
    await store.create_task(
        make_task(), Admission(max_pending=10, idempotency_key="k", body_hash="h1")
    )
    with pytest.raises(IdempotencyConflict):
        await store.create_task(
            make_task(), Admission(max_pending=10, idempotency_key="k", body_hash="h2")
        )
    assert await store.pending_count() == 1


async def test_idempotency_keys_are_per_owner(store: TaskStore) -> None:
    a, _ = await store.create_task(
        make_task(owner="a"), Admission(max_pending=10, idempotency_key="k", body_hash="h")
    )
    b, created = await store.create_task(
        make_task(owner="b"), Admission(max_pending=10, idempotency_key="k", body_hash="other")
    )
    assert created and b.id != a.id


async def test_admission_is_atomic_under_concurrent_creates(store: TaskStore) -> None:
    tasks = [make_task() for _ in range(50)]
    outcomes = await asyncio.gather(
        *(store.create_task(t, Admission(max_pending=10)) for t in tasks), return_exceptions=True
    )
    accepted = [o for o in outcomes if isinstance(o, tuple)]
    rejected = [t for t, o in zip(tasks, outcomes, strict=True) if isinstance(o, QueueFull)]
    assert len(accepted) == 10 and len(rejected) == 40
    assert await store.pending_count() == 10
    assert await store.get_task(rejected[0].id) is None
    assert await store.read_events(rejected[0].id, None) == []
    listed, _ = await store.list_tasks("", status=None, limit=100, cursor=None)
    assert len(listed) == 10
    claimed = [await store.claim("w", ALL, 0) for _ in range(11)]
    assert sum(c is not None for c in claimed) == 10


async def test_queue_full_error_names_the_limit(store: TaskStore) -> None:
    await store.create_task(make_task(), Admission(max_pending=1))
    with pytest.raises(QueueFull) as info:
        await store.create_task(make_task(), Admission(max_pending=1))
    assert info.value.limit == 1


# --- updates ----------------------------------------------------------------------------
async def test_update_is_a_compare_and_set_on_the_revision(store: TaskStore) -> None:
    task = await add(store)
    mine = await store.get_task(task.id)
    theirs = await store.get_task(task.id)
    assert mine is not None and theirs is not None
    mine.status = TaskStatus.running
    assert await store.update_task(mine, [("status", {"status": "running"})])
    assert mine.rev == task.rev + 1

    theirs.status = TaskStatus.cancelled
    assert not await store.update_task(theirs, [("status", {"status": "cancelled"})])
    assert theirs.rev == task.rev
    stored = await store.get_task(task.id)
    assert stored is not None
    assert stored.status is TaskStatus.running and stored.rev == mine.rev
    assert [e.data["status"] for e in await store.read_events(task.id, None)] == [
        "pending",
        "running",
    ]


async def test_update_of_an_unknown_task_writes_nothing(store: TaskStore) -> None:
    ghost = make_task()
    assert not await store.update_task(ghost, [("status", {"status": "running"})])
    assert await store.get_task(ghost.id) is None
    assert await store.read_events(ghost.id, None) == []


async def test_leaving_pending_frees_a_backlog_slot(store: TaskStore) -> None:
    first, _ = await store.create_task(make_task(priority=2), Admission(max_pending=1))
    with pytest.raises(QueueFull):
        await store.create_task(make_task(), Admission(max_pending=1))
    await advance(store, first, TaskStatus.running)
    assert await store.pending_count() == 0
    await store.create_task(make_task(), Admission(max_pending=1))
    await advance(store, first, TaskStatus.done)  # running -> done changes no count
    assert await store.pending_count() == 1


async def test_queue_depths_count_pending_tasks_by_level(store: TaskStore) -> None:
    for p in (0, 0, 4):
        await add(store, p)
    running = await add(store, 4)
    await advance(store, running, TaskStatus.running)
    cancelled = await add(store, 5)
    await advance(store, cancelled, TaskStatus.cancelled)
    assert await store.queue_depths() == {0: 2, 1: 0, 2: 0, 3: 0, 4: 1, 5: 0}
    assert await store.pending_count() == 3


# --- listing ----------------------------------------------------------------------------
async def test_list_pages_newest_first(store: TaskStore) -> None:
    ids = [(await add(store, owner="k")).id for _ in range(7)]
    pages: list[list[str]] = []
    cursor: str | None = None
    while True:
        tasks, cursor = await store.list_tasks("k", status=None, limit=3, cursor=cursor)
        pages.append([t.id for t in tasks])
        if cursor is None:
            break
    assert pages == [ids[6:3:-1], ids[3:0:-1], ids[:1]]


async def test_list_filters_by_status_across_pages(store: TaskStore) -> None:
    tasks = [await add(store, owner="k") for _ in range(10)]
    for t in tasks[::3]:  # 0, 3, 6, 9
        await advance(store, t, TaskStatus.running)
    running: list[str] = []
    cursor: str | None = None
    pages = 0
    while True:
        page, cursor = await store.list_tasks(
            "k", status=TaskStatus.running, limit=3, cursor=cursor
        )
        pages += 1
        assert all(t.status is TaskStatus.running for t in page)
        running += [t.id for t in page]
        if cursor is None:
            break
    assert pages == 2
    assert running == [t.id for t in reversed(tasks[::3])]
    done, cursor = await store.list_tasks("k", status=TaskStatus.done, limit=3, cursor=None)
    assert done == [] and cursor is None


async def test_list_shows_only_the_owners_tasks(store: TaskStore) -> None:
    mine = await add(store, owner="a")
    await add(store, owner="b")
    tasks, cursor = await store.list_tasks("a", status=None, limit=10, cursor=None)
    assert [t.id for t in tasks] == [mine.id] and cursor is None
    assert await store.list_tasks("nobody", status=None, limit=10, cursor=None) == ([], None)


async def test_list_refuses_a_foreign_cursor_and_an_empty_page(store: TaskStore) -> None:
    with pytest.raises(ValueError):
        await store.list_tasks("a", status=None, limit=10, cursor="not-a-cursor")
    with pytest.raises(ValueError):
        await store.list_tasks("a", status=None, limit=0, cursor=None)


# --- batch lines ------------------------------------------------------------------------
async def test_batch_lines_have_a_backlog_of_their_own(store: TaskStore) -> None:
    for _ in range(3):
        await store.create_task(new_task(), Admission(max_pending=3, batch=True))
    with pytest.raises(QueueFull):
        await store.create_task(new_task(), Admission(max_pending=3, batch=True))
    # the batch lines do not count toward the backlog other tasks are admitted against
    await store.create_task(new_task(), Admission(max_pending=1))
    with pytest.raises(QueueFull):
        await store.create_task(new_task(), Admission(max_pending=1))
    assert await store.pending_count() == 4
    assert await store.batch_pending_count() == 3


async def test_a_started_batch_line_frees_its_slot(store: TaskStore) -> None:
    line, _ = await store.create_task(new_task(), Admission(max_pending=1, batch=True))
    other, _ = await store.create_task(new_task(), Admission(max_pending=1))
    line.status = TaskStatus.running
    assert await store.update_task(line)
    other.status = TaskStatus.cancelled
    assert await store.update_task(other)
    assert await store.batch_pending_count() == 0
    assert await store.pending_count() == 0
    await store.create_task(new_task(), Admission(max_pending=1, batch=True))
    await store.create_task(new_task(), Admission(max_pending=1))


async def test_get_tasks_reads_several_in_order(store: TaskStore) -> None:
    a, _ = await store.create_task(new_task(), Admission(max_pending=10))
    b, _ = await store.create_task(new_task(), Admission(max_pending=10))
    got = await store.get_tasks([b.id, ids.new_id(), a.id])
    assert [t.id if t else None for t in got] == [b.id, None, a.id]
    assert await store.get_tasks([]) == []
