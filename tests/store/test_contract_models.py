"""Several models behind one store (issue #45), against both stores (``store`` fixture):
per-model queues, queue deadlines (``expire_due``), the hand-over of a running task to
another model's queue, and the model states of live workers."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest

from ponder.config.models import DEFAULT_MODEL
from ponder.errors import QueueFull
from ponder.store import TaskStore
from ponder.store.base import Admission, Claim, ModelState
from ponder.types import Task, TaskStatus

from .helpers import ALL, add, advance, live, make_task

BIG = "big"
ZERO = dict.fromkeys(ALL, 0)


def depths(**levels: int) -> dict[int, int]:
    """Depths by level: ``depths(p3=2)``."""
    return ZERO | {int(k[1:]): n for k, n in levels.items()}


# --- per-model queues -------------------------------------------------------------------
async def test_each_model_claims_only_its_own_queue(store: TaskStore) -> None:
    mine = [await add(store, 3), await add(store, 1)]
    big = [await add(store, 3, model=BIG), await add(store, 0, model=BIG)]
    assert await store.claim("w", ALL, 0, model="other") is None
    got = [await store.claim("wb", ALL, 0, model=BIG) for _ in range(3)]
    assert [(c.task_id, c.priority, c.model) for c in got if c] == [
        (big[1].id, 0, BIG),
        (big[0].id, 3, BIG),
    ]
    assert got[2] is None  # the default model's tasks stay on its queue
    claims = [await store.claim("w", ALL, 0) for _ in range(3)]
    assert [(c.task_id, c.model) for c in claims if c] == [
        (mine[1].id, DEFAULT_MODEL),
        (mine[0].id, DEFAULT_MODEL),
    ]
    assert claims[2] is None
    first = got[0]
    assert first is not None and first.record is not None
    assert Task.from_storage(first.record).model == BIG


async def test_queue_depths_by_model_and_summed(store: TaskStore) -> None:
    await add(store, 3)
    await add(store, 3)
    await add(store, 1, model=BIG)
    started = await add(store, 3, model=BIG)
    await add(store, 5, model="small")
    await advance(store, started, TaskStatus.running)  # no longer pending
    assert await store.queue_depths() == depths(p3=2, p1=1, p5=1)
    assert await store.queue_depths(DEFAULT_MODEL) == depths(p3=2)
    assert await store.queue_depths(BIG) == depths(p1=1)
    assert await store.queue_depths("unknown") == ZERO
    by_model = {m: d for m, d in (await store.queue_depths_by_model()).items() if d != ZERO}
    assert by_model == {
        DEFAULT_MODEL: depths(p3=2),
        BIG: depths(p1=1),
        "small": depths(p5=1),
    }
    assert await store.pending_count() == 4


async def test_a_waiting_claim_is_woken_by_its_models_task_only(store: TaskStore) -> None:
    claimer = asyncio.create_task(store.claim("w", ALL, 10_000, model=BIG))
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(asyncio.shield(claimer), 0.3)
    await add(store, 2)  # the default model's: not for this claim
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(asyncio.shield(claimer), 0.3)
    task = await add(store, 2, model=BIG)
    claim = await asyncio.wait_for(claimer, 5)
    assert claim is not None and (claim.task_id, claim.model) == (task.id, BIG)
    other = await store.claim("w", ALL, 0)
    assert other is not None and other.model == DEFAULT_MODEL


async def test_reclaim_takes_only_the_models_entries(store: TaskStore) -> None:
    await live(store, "b")
    mine, big = await add(store, 2), await add(store, 2, model=BIG)
    assert await store.claim("ghost", ALL, 0) is not None  # "ghost" is not a live worker
    assert await store.claim("ghost", ALL, 0, model=BIG) is not None
    taken = await store.reclaim("b", 60, model=BIG)
    assert [(c.task_id, c.model) for c in taken] == [(big.id, BIG)]
    assert await store.reclaim("b", 60, model=BIG) == []
    # the dead consumer's entry of the default model waited for that model's workers
    taken = await store.reclaim("b", 60)
    assert [(c.task_id, c.model) for c in taken] == [(mine.id, DEFAULT_MODEL)]


async def test_release_renew_and_ack_use_the_claims_model(store: TaskStore) -> None:
    await live(store, "a", "b")
    task = await add(store, 4, model=BIG)
    claim = await store.claim("a", ALL, 0, model=BIG)
    assert claim is not None
    await store.release(claim)
    again = await store.claim("b", ALL, 0, model=BIG)
    assert again is not None and again.task_id == task.id
    await store.renew("b", [again])
    task.status = TaskStatus.done
    assert await store.update_task(task, [("result", {})], ack=again)
    assert await store.reclaim("a", 0, model=BIG) == []  # acked: gone for good
    await store.ack(again)  # a second ack changes nothing
    assert await store.claim("a", ALL, 0, model=BIG) is None


# --- queue deadlines --------------------------------------------------------------------
async def add_due(store: TaskStore, overdue_s: float, model: str = DEFAULT_MODEL) -> Task:
    """A task whose queue deadline passed ``overdue_s`` seconds ago (negative: is ahead)."""
    task = make_task(model=model)
    task.queue_timeout_s = 10.0
    task.created_at -= timedelta(seconds=10.0 + overdue_s)
    stored, created = await store.create_task(task, Admission(max_pending=1000))
    assert created
    return stored


async def test_expire_due_lists_overdue_pending_tasks_oldest_deadline_first(
    store: TaskStore,
) -> None:
    await add(store)  # no deadline
    late = await add_due(store, 5)
    await add_due(store, -60)  # not due yet
    latest = await add_due(store, 50, model=BIG)
    later = await add_due(store, 20)
    assert await store.expire_due() == [latest.id, later.id, late.id]
    assert await store.expire_due(limit=2) == [latest.id, later.id]
    assert await store.expire_due(limit=2) == [latest.id, later.id]  # listing changes nothing
    assert await store.expire_due(limit=0) == []


async def test_a_task_leaving_pending_leaves_the_deadlines(store: TaskStore) -> None:
    started, cancelled, expired, left = [await add_due(store, s) for s in (4, 3, 2, 1)]
    await advance(store, started, TaskStatus.running)
    await advance(store, cancelled, TaskStatus.cancelled)
    await advance(store, left, TaskStatus.pending)  # a write that stays pending keeps it
    assert await store.expire_due() == [expired.id, left.id]
    await advance(store, expired, TaskStatus.expired)
    assert await store.expire_due() == [left.id]
    # a stale write (the task started meanwhile) is refused and leaves the index alone
    stale = left.model_copy()
    await advance(store, left, TaskStatus.running)
    stale.status = TaskStatus.expired
    assert not await store.update_task(stale)
    assert await store.expire_due() == []


async def test_an_expired_task_is_terminal_and_frees_its_backlog_slot(store: TaskStore) -> None:
    task = await add_due(store, 1)
    with pytest.raises(QueueFull):
        await store.create_task(make_task(), Admission(max_pending=1))
    await advance(store, task, TaskStatus.expired)
    assert await store.pending_count() == 0
    assert await store.queue_depths() == ZERO
    _, created = await store.create_task(make_task(), Admission(max_pending=1))
    assert created
    stored = await store.get_task(task.id)
    assert stored is not None and stored.status is TaskStatus.expired
    # the queue entry is still there: the worker that claims it finds the task ended
    claim = await store.claim("w", ALL, 0)
    assert claim is not None and claim.task_id == task.id


# --- hand-over --------------------------------------------------------------------------
async def running(store: TaskStore, worker: str = "a") -> tuple[Task, Claim]:
    """A default-model task that ``worker`` claimed and started."""
    task = await add(store, 2)
    claim = await store.claim(worker, ALL, 0)
    assert claim is not None and claim.task_id == task.id
    await advance(store, task, TaskStatus.running)
    return task, claim


async def test_hand_over_moves_a_running_task_to_the_other_models_queue(
    store: TaskStore,
) -> None:
    await live(store, "a", "b")
    task, claim = await running(store)
    before = await store.read_events(task.id, None)
    task.model, task.priority = BIG, 1
    assert await store.hand_over(task, claim, [("escalated", {"to": BIG})])
    assert task.rev == 2  # created at 0, started at 1
    events = await store.read_events(task.id, before[-1].id)
    assert [(e.event, e.data) for e in events] == [("escalated", {"to": BIG})]
    assert await store.claim("a", ALL, 0) is None  # acked on the old queue
    assert await store.reclaim("b", 0) == []
    moved = await store.claim("b", ALL, 0, model=BIG)
    assert moved is not None and (moved.task_id, moved.priority, moved.model) == (task.id, 1, BIG)
    if moved.record is not None:
        assert Task.from_storage(moved.record) == task
    stored = await store.get_task(task.id)
    assert stored == task and stored.status is TaskStatus.running
    assert await store.queue_depths(BIG) == ZERO  # running, not pending
    task.status = TaskStatus.done
    assert await store.update_task(task, [("result", {})], ack=moved)
    assert await store.reclaim("a", 0, model=BIG) == []


async def test_a_stale_hand_over_changes_nothing(store: TaskStore) -> None:
    await live(store, "a", "b")
    task, claim = await running(store)
    stale = task.model_copy()
    await advance(store, task, TaskStatus.running)  # another write since it was read
    events = await store.read_events(task.id, None)
    stale.model = BIG
    assert not await store.hand_over(stale, claim, [("escalated", {})])
    assert await store.get_task(task.id) == task
    assert await store.read_events(task.id, None) == events
    assert await store.claim("b", ALL, 0, model=BIG) is None
    await store.register_worker("a", 0)  # its claim is still held: "a" dies, b takes it
    assert [c.task_id for c in await store.reclaim("b", 60)] == [task.id]


async def test_hand_over_only_moves_running_tasks(store: TaskStore) -> None:
    task = await add(store)
    claim = await store.claim("a", ALL, 0)
    assert claim is not None
    task.model = BIG
    with pytest.raises(ValueError, match="running"):
        await store.hand_over(task, claim)


# --- model states -----------------------------------------------------------------------
async def test_served_models_are_those_of_live_workers(store: TaskStore) -> None:
    assert await store.served_models() == []
    w1 = [
        ModelState(DEFAULT_MODEL, "w1", "loaded", 812.5),
        ModelState(BIG, "w1", "unloaded"),
    ]
    await store.register_worker("w1", 30, w1)
    await store.register_worker("w2", 30, [ModelState(BIG, "w2", "loading")])
    await store.register_worker("gone", 0, [ModelState(BIG, "gone", "loaded")])  # expired
    await store.register_worker("bare", 30)  # serves nothing it reports
    served = await store.served_models()
    assert sorted(served, key=lambda m: (m.worker, m.model)) == [
        ModelState(BIG, "w1", "unloaded"),
        ModelState(DEFAULT_MODEL, "w1", "loaded", 812.5),
        ModelState(BIG, "w2", "loading"),
    ]
    await store.register_worker("w2", 30, [ModelState(BIG, "w2", "loaded", 100.0)])  # heartbeat
    await store.unregister_worker("w1")
    assert await store.served_models() == [ModelState(BIG, "w2", "loaded", 100.0)]
    assert await store.live_workers() == 2
