"""The TaskStore contract: every test runs against both implementations (``store`` fixture)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from ponder.config import Settings
from ponder.errors import IdempotencyConflict, QueueFull
from ponder.ids import IdGenerator
from ponder.store import Claim, Notice, OutboxEntry, TaskStore
from ponder.types import CallbackInfo, Task, TaskStatus

ALL = [0, 1, 2, 3, 4, 5]
_ids = IdGenerator("test1")


def make_task(priority: int = 3, owner: str = "") -> Task:
    return Task(id=_ids.new_id(), priority=priority, prompt="x", owner=owner)


async def add(store: TaskStore, priority: int = 3, owner: str = "") -> Task:
    task, created = await store.create_task(make_task(priority, owner), max_pending=1000)
    assert created
    return task


async def advance(store: TaskStore, task: Task, status: TaskStatus) -> None:
    task.status = status
    assert await store.update_task(task, [("status", {"status": status.value})])


async def let_time_pass(seconds: float) -> None:
    """Leases and liveness are measured in time: the tests must let it actually pass."""
    await asyncio.sleep(seconds)


# --- records ------------------------------------------------------------------------------
async def test_create_then_get_roundtrips(store: TaskStore) -> None:
    task = Task(id=_ids.new_id(), priority=1, prompt="2+2?", owner="k1", metadata={"a": [1]})
    stored, created = await store.create_task(task, max_pending=10)
    assert created and stored is task
    got = await store.get_task(task.id)
    assert got is not None
    assert got.to_storage() == task.to_storage()
    assert got.owner == "k1"
    assert await store.get_task(_ids.new_id()) is None


async def test_idempotency_key_with_same_body_returns_the_stored_task(store: TaskStore) -> None:
    first, created = await store.create_task(
        make_task(), max_pending=10, idempotency_key="k", body_hash="h1"
    )
    assert created
    again, created = await store.create_task(
        make_task(), max_pending=10, idempotency_key="k", body_hash="h1"
    )
    assert not created
    assert again.id == first.id
    assert await store.pending_count() == 1


async def test_idempotency_key_with_other_body_conflicts(store: TaskStore) -> None:
    await store.create_task(make_task(), max_pending=10, idempotency_key="k", body_hash="h1")
    with pytest.raises(IdempotencyConflict):
        await store.create_task(make_task(), max_pending=10, idempotency_key="k", body_hash="h2")
    assert await store.pending_count() == 1


async def test_idempotency_keys_are_per_owner(store: TaskStore) -> None:
    a, _ = await store.create_task(
        make_task(owner="a"), max_pending=10, idempotency_key="k", body_hash="h"
    )
    b, created = await store.create_task(
        make_task(owner="b"), max_pending=10, idempotency_key="k", body_hash="other"
    )
    assert created and b.id != a.id


async def test_admission_is_atomic_under_concurrent_creates(store: TaskStore) -> None:
    tasks = [make_task() for _ in range(50)]
    outcomes = await asyncio.gather(
        *(store.create_task(t, max_pending=10) for t in tasks), return_exceptions=True
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
    await store.create_task(make_task(), max_pending=1)
    with pytest.raises(QueueFull) as info:
        await store.create_task(make_task(), max_pending=1)
    assert info.value.limit == 1


# --- updates ------------------------------------------------------------------------------
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
    first, _ = await store.create_task(make_task(priority=2), max_pending=1)
    with pytest.raises(QueueFull):
        await store.create_task(make_task(), max_pending=1)
    await advance(store, first, TaskStatus.running)
    assert await store.pending_count() == 0
    await store.create_task(make_task(), max_pending=1)
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


# --- queue --------------------------------------------------------------------------------
async def test_claim_follows_the_priority_order_given_and_fifo_within_a_level(
    store: TaskStore,
) -> None:
    order = [(await add(store, p)).id for p in (3, 1, 3, 1, 5, 0)]
    by_level = {3: [order[0], order[2]], 1: [order[1], order[3]], 5: [order[4]], 0: [order[5]]}
    claims = [await store.claim("w", [5, 1, 3, 0], 0) for _ in range(6)]
    assert [(c.task_id, c.priority) for c in claims if c] == [
        (by_level[5][0], 5),
        (by_level[1][0], 1),
        (by_level[1][1], 1),
        (by_level[3][0], 3),
        (by_level[3][1], 3),
        (by_level[0][0], 0),
    ]


async def test_claim_only_takes_the_levels_given(store: TaskStore) -> None:
    await add(store, 4)
    assert await store.claim("w", [0, 1], 0) is None
    assert await store.claim("w", [4], 0) is not None


async def test_claim_waits_block_ms_then_returns_none(store: TaskStore) -> None:
    started = time.monotonic()
    assert await store.claim("w", ALL, 300) is None
    assert 0.25 <= time.monotonic() - started < 2.0


async def test_claim_wakes_when_a_task_arrives(store: TaskStore) -> None:
    claimer = asyncio.create_task(store.claim("w", ALL, 10_000))
    with pytest.raises(TimeoutError):  # it is waiting, not returning early
        await asyncio.wait_for(asyncio.shield(claimer), 0.3)
    started = time.monotonic()
    task = await add(store, 2)
    claim = await asyncio.wait_for(claimer, 5)
    assert claim is not None and claim.task_id == task.id and claim.priority == 2
    assert time.monotonic() - started < 2.0


async def test_ack_removes_the_entry_for_good(store: TaskStore) -> None:
    await add(store)
    claim = await store.claim("w", ALL, 0)
    assert claim is not None
    await store.ack(claim)
    await store.release(claim)  # a late release must not bring it back
    assert await store.claim("w", ALL, 0) is None
    await let_time_pass(0.05)
    assert await store.reclaim("w2", 0.01) == []


async def live(store: TaskStore, *workers: str) -> None:
    """Register ``workers`` as alive: reclaim takes a dead consumer's entries at once."""
    for worker in workers:
        await store.register_worker(worker, 30)


async def test_an_idle_lease_is_reclaimed_and_renew_prevents_it(store: TaskStore) -> None:
    await live(store, "a", "b", "c")
    task = await add(store, 1)
    claim = await store.claim("a", ALL, 0)
    assert claim is not None
    await let_time_pass(0.4)
    await store.renew("a", [claim])
    assert await store.reclaim("b", 0.3) == []  # renewed just now

    await let_time_pass(0.4)
    reclaimed = await store.reclaim("b", 0.3)
    assert reclaimed == [Claim(task.id, 1, claim.receipt)]
    assert await store.reclaim("c", 0.3) == []  # reclaiming renews the lease too

    await store.ack(reclaimed[0])
    await let_time_pass(0.4)
    assert await store.reclaim("c", 0.3) == []


async def test_renew_does_not_take_back_a_reclaimed_entry(store: TaskStore) -> None:
    await live(store, "a", "b", "c")
    await add(store)
    claim = await store.claim("a", ALL, 0)
    assert claim is not None
    await let_time_pass(0.4)
    assert len(await store.reclaim("b", 0.3)) == 1
    await let_time_pass(0.4)
    await store.renew("a", [claim])  # "a" lost it: this must not reset b's lease
    assert len(await store.reclaim("c", 0.3)) == 1


async def test_reclaim_respects_the_limit(store: TaskStore) -> None:
    await live(store, "a", "b")
    for p in (5, 0, 3):
        await add(store, p)
    for _ in range(3):
        assert await store.claim("a", ALL, 0) is not None
    await let_time_pass(0.1)
    first = await store.reclaim("b", 0.05, limit=2)
    assert [c.priority for c in first] == [0, 3]
    assert [c.priority for c in await store.reclaim("b", 0.05, limit=2)] == [5]


async def test_a_dead_workers_entries_are_taken_over_at_once(store: TaskStore) -> None:
    """No waiting for each entry's lease: a consumer whose registration has lapsed (or
    that never registered) is dead, and one call takes what the caller has room for."""
    await live(store, "b")
    await store.register_worker("a", 0.2)
    tasks = [await add(store, p) for p in (4, 0, 2, 2, 5)]
    claims = [await store.claim("a", ALL, 0) for _ in tasks]
    await store.claim("ghost", ALL, 0)  # nothing left; "ghost" never registered
    assert await store.reclaim("b", 60, limit=5) == []  # "a" is alive: leases are young
    await let_time_pass(0.3)  # a's registration lapses (a SIGKILLed worker stops renewing it)
    taken = await store.reclaim("b", 60, limit=3)
    assert [c.priority for c in taken] == [0, 2, 2]  # most urgent first, up to the limit
    rest = await store.reclaim("b", 60, limit=10)
    assert sorted(c.task_id for c in taken + rest) == sorted(c.task_id for c in claims if c)
    assert await store.reclaim("b", 60, limit=10) == []
    assert all(t.status is TaskStatus.pending for t in tasks)  # the queue alone changed


async def test_reclaim_never_takes_over_the_callers_own_entries_at_once(store: TaskStore) -> None:
    await add(store)
    mine = await store.claim("b", ALL, 0)  # "b" is not registered: dead to others only
    assert mine is not None
    assert await store.reclaim("b", 60) == []
    await live(store, "c")
    assert [c.receipt for c in await store.reclaim("c", 60)] == [mine.receipt]


async def test_release_makes_the_entry_claimable_at_once(store: TaskStore) -> None:
    task = await add(store)
    claim = await store.claim("a", ALL, 0)
    assert claim is not None
    assert await store.claim("b", ALL, 0) is None
    await store.release(claim)
    again = await store.claim("b", ALL, 0)
    assert again is not None and again.task_id == task.id


async def test_release_wakes_a_waiting_claim(store: TaskStore) -> None:
    await add(store)
    claim = await store.claim("a", ALL, 0)
    assert claim is not None
    waiter = asyncio.create_task(store.claim("b", ALL, 10_000))
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(asyncio.shield(waiter), 0.3)
    await store.release(claim)
    again = await asyncio.wait_for(waiter, 5)
    assert again is not None and again.task_id == claim.task_id


# --- events -------------------------------------------------------------------------------
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


# --- listing ------------------------------------------------------------------------------
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


# --- liveness -----------------------------------------------------------------------------
async def test_live_workers_counts_registered_unexpired_workers(store: TaskStore) -> None:
    assert await store.live_workers() == 0
    await store.register_worker("w1", 30)
    await store.register_worker("w2", 30)
    await store.register_worker("w2", 30)  # a heartbeat, not a new worker
    await store.register_worker("gone", 0)  # expired at once
    assert await store.live_workers() == 2
    await store.unregister_worker("w1")
    assert await store.live_workers() == 1
    assert await store.ping()


# --- notices ------------------------------------------------------------------------------
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


# --- webhook outbox -----------------------------------------------------------------------
HOOK = "http://127.0.0.1:9/hook"


def with_callback(url: str = HOOK) -> Task:
    return Task(id=_ids.new_id(), prompt="x", callback=CallbackInfo(url=url))


async def claim_all(store: TaskStore, consumer: str = "d", **kw: Any) -> list[OutboxEntry]:
    entries, _ = await store.claim_deliveries(
        consumer, kw.pop("limit", 100), kw.pop("lease_s", 30), host_room={}, per_host=100, **kw
    )
    return entries


async def test_the_terminal_write_adds_the_webhook_once_ever(store: TaskStore) -> None:
    cursor, _ = await store.read_notices(Notice.outbox, None, 0)
    task, _ = await store.create_task(with_callback(), max_pending=10)
    plain = await add(store)
    await advance(store, task, TaskStatus.running)
    await advance(store, plain, TaskStatus.running)
    assert await store.outbox_depth() == 0
    task.status = TaskStatus.running
    assert await store.update_task(task, [("preliminary", {"answer": "4"})])
    await advance(store, task, TaskStatus.done)
    await advance(store, plain, TaskStatus.done)  # no callback: nothing to send
    await advance(store, task, TaskStatus.done)  # a delivery record written later: no more
    assert await store.outbox_depth() == 2
    entries = await claim_all(store)
    assert sorted((e.event, e.webhook_id, e.task_id, e.url, e.attempts) for e in entries) == [
        ("task.completed", f"msg_{task.id}_task.completed", task.id, HOOK, 0),
        ("task.preliminary", f"msg_{task.id}_task.preliminary", task.id, HOOK, 0),
    ]
    _, posted = await store.read_notices(Notice.outbox, cursor, 0)
    assert posted  # delivery loops were woken
    for entry in entries:
        await store.finish_delivery(entry.webhook_id)
    # sent: a later preliminary answer, a rewrite of the end, the same ids again add nothing
    assert await store.update_task(task, [("preliminary", {"answer": "5"})])
    await store.enqueue_deliveries(entries)
    assert await store.outbox_depth() == 0


async def test_a_cancel_adds_its_webhook(store: TaskStore) -> None:
    task, _ = await store.create_task(with_callback(), max_pending=10)
    await advance(store, task, TaskStatus.cancelled)
    (entry,) = await claim_all(store)
    assert entry.event == "task.cancelled"


async def test_deliveries_are_leased_rescheduled_and_finished(store: TaskStore) -> None:
    await store.enqueue_deliveries(
        [OutboxEntry(webhook_id=f"msg_{i}", event="e", url=HOOK, body={"i": i}) for i in range(3)]
    )
    await store.enqueue_deliveries([OutboxEntry(webhook_id="msg_0", event="e", url=HOOK, body={})])
    assert await store.outbox_depth() == 3  # an id already queued is left as it was
    first, wait_s = await store.claim_deliveries("a", 2, 0.3, host_room={}, per_host=10)
    assert [e.webhook_id for e in first] == ["msg_0", "msg_1"] and first[0].body == {"i": 0}
    assert wait_s is not None and wait_s <= 0  # msg_2 is due still
    assert [e.webhook_id for e in await claim_all(store, "b")] == ["msg_2"]
    assert await claim_all(store, "b") == []  # all three are leased
    # a failed attempt: stored with its count, due again after the delay
    first[0].attempts = 1
    assert await store.retry_delivery("a", first[0], 60)
    assert not await store.retry_delivery("b", first[1], 0)  # "b" does not hold it
    await store.finish_delivery("msg_2")
    await let_time_pass(0.4)  # a's lease of msg_1 lapses: another loop may take it
    (again,) = await claim_all(store, "b")
    assert again.webhook_id == "msg_1" and again.attempts == 0
    assert not await store.retry_delivery("a", first[1], 0)  # taken over: a's word is void
    await store.finish_delivery("msg_1")
    entries, wait_s = await store.claim_deliveries("c", 10, 30, host_room={}, per_host=10)
    assert entries == [] and wait_s is not None and 50 < wait_s <= 60  # msg_0's retry
    assert await store.outbox_depth() == 1
    await store.finish_delivery("msg_0")
    assert await store.claim_deliveries("c", 10, 30, host_room={}, per_host=10) == ([], None)


async def test_a_busy_host_lets_others_by(store: TaskStore) -> None:
    busy, other = "http://10.0.0.1:80/h", "http://10.0.0.2:8080/h"
    entries = [OutboxEntry(webhook_id=f"b{i}", event="e", url=busy, body={}) for i in range(4)]
    entries.append(OutboxEntry(webhook_id="o", event="e", url=other, body={}))
    await store.enqueue_deliveries(entries)
    taken, _ = await store.claim_deliveries("a", 10, 30, host_room={"10.0.0.1:80": 1}, per_host=2)
    assert sorted(e.webhook_id for e in taken) == ["b0", "o"]
    assert await claim_all(store) == []  # the busy host's others wait a moment
    await let_time_pass(1.1)
    assert len(await claim_all(store)) == 3


async def test_the_schedule_survives_a_restart(settings: Settings, store: TaskStore) -> None:
    from ponder.store import create_store

    await store.enqueue_deliveries(
        [OutboxEntry(webhook_id=i, event="e", url=HOOK, body={}) for i in ("soon", "later")]
    )
    claimed = {e.webhook_id: e for e in await claim_all(store, "a")}
    soon, later = claimed["soon"], claimed["later"]
    later.attempts = 3
    assert await store.retry_delivery("a", later, 3600)
    soon.attempts = 1
    assert await store.retry_delivery("a", soon, 0.2)
    await store.close()
    reopened = create_store(settings)
    await reopened.start()
    try:
        assert await claim_all(reopened) == []
        await let_time_pass(0.3)
        (due,) = await claim_all(reopened)
        assert (due.webhook_id, due.attempts) == ("soon", 1)
        assert await reopened.outbox_depth() == 2
    finally:
        await reopened.close()
