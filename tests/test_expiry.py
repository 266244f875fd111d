"""Queue deadlines: the expiry sweeper over a real store (both stores) ends ``expired`` the
pending tasks past their ``queue_timeout_s``, with their end event and ``task.expired``
webhook, and leaves a started, cancelled or not yet due task alone."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import pytest

from ponder import metrics
from ponder.config import Settings
from ponder.ids import IdGenerator
from ponder.openai.batch_feeder import BatchFeeder
from ponder.states import is_final
from ponder.store import TaskStore
from ponder.store.base import Admission
from ponder.types import CallbackInfo, Task, TaskStatus, utcnow
from ponder.webhooks import WebhookSender, verify, webhook_id
from ponder.worker.expiry import ExpirySweeper, expire, past_queue_deadline
from tests.conftest import open_store, until
from tests.test_webhooks import SECRET, Receiver, outbox_drained, sender_settings, sending

pytestmark = pytest.mark.timeout(30)

_ids = IdGenerator("test1")


@contextlib.asynccontextmanager
async def worker_side(settings: Settings) -> AsyncIterator[ExpirySweeper]:
    """What a worker process runs beside its worker loops, with no worker loop (no worker
    serves the tasks' model): the expiry sweeper, the batch feeder and the webhook
    delivery loop, over a store of their own."""
    async with open_store(settings) as store:
        sweeper = ExpirySweeper(store, every_s=0.05)
        feeder = BatchFeeder(store, settings, holder="expiry-test")
        sender = WebhookSender(store, settings)
        await sender.start()
        await sweeper.start()
        feeding = asyncio.create_task(feeder.run())
        try:
            yield sweeper
        finally:
            feeder.stop()
            await asyncio.wait_for(feeding, 10)
            await sweeper.stop()
            await sender.close()


async def queued(
    store: TaskStore,
    queue_timeout_s: float | None,
    *,
    age_s: float = 0.0,
    url: str | None = None,
    model: str = "ponder",
) -> Task:
    """A pending task created ``age_s`` seconds ago (so its deadline may have passed)."""
    task = Task(
        id=_ids.new_id(),
        prompt="x",
        samples_planned=1,
        model=model,
        queue_timeout_s=queue_timeout_s,
        created_at=utcnow() - timedelta(seconds=age_s),
        callback=CallbackInfo(url=url) if url else None,
    )
    task, created = await store.create_task(task, Admission(max_pending=100))
    assert created
    return task


async def stored(store: TaskStore, task_id: str) -> Task:
    task = await store.get_task(task_id)
    assert task is not None
    return task


async def final_events(store: TaskStore, task_id: str) -> list[Any]:
    return [e for e in await store.read_events(task_id, None) if is_final(e)]


def finished(status: str) -> float:
    value = metrics.REGISTRY.get_sample_value("ponder_tasks_finished_total", {"status": status})
    return value or 0.0


def test_past_queue_deadline() -> None:
    now = utcnow()
    task = Task(id="t1", prompt="x", queue_timeout_s=5, created_at=now - timedelta(seconds=6))
    assert past_queue_deadline(task, now)
    assert not past_queue_deadline(task, now - timedelta(seconds=2))
    assert not past_queue_deadline(task.model_copy(update={"queue_timeout_s": None}), now)
    running = task.model_copy(update={"status": TaskStatus.running})
    assert not past_queue_deadline(running, now)


async def test_the_sweeper_expires_a_due_task_with_its_webhook(
    settings: Settings, store: TaskStore
) -> None:
    config = sender_settings(settings)
    before = finished("expired")
    async with Receiver([200]) as receiver, sending(store, config):
        due = await queued(store, 0.5, age_s=5, url=receiver.url, model="b")
        not_yet = await queued(store, 60, age_s=5)
        no_limit = await queued(store, None, age_s=3600)
        assert await ExpirySweeper(store).sweep() == 1
        await outbox_drained(store)
    task = await stored(store, due.id)
    assert task.status == TaskStatus.expired and task.started_at is None
    assert task.finished_at is not None and task.error is not None
    assert task.error.code == "queue_timeout"
    assert "0.5s queue_timeout_s" in task.error.message and "'b'" in task.error.message
    assert finished("expired") == before + 1
    # one terminal event, the whole task (as a failed task's `result`)
    (event,) = await final_events(store, due.id)
    assert event.event == "result" and event.data["status"] == "expired"
    assert event.data["error"]["code"] == "queue_timeout"
    # the webhook: task.expired, signed, with the expired task
    (headers, raw), = receiver.requests  # fmt: skip
    assert headers["webhook-id"] == webhook_id(due.id, "task.expired")
    payload = verify(headers, raw, SECRET)
    assert payload["type"] == "task.expired" and payload["data"]["status"] == "expired"
    assert task.callback is not None
    assert [(d.event, d.delivered) for d in task.callback.deliveries] == [("task.expired", True)]
    # the others are untouched, and a second sweep finds nothing
    assert (await stored(store, not_yet.id)).status == TaskStatus.pending
    assert (await stored(store, no_limit.id)).status == TaskStatus.pending
    assert await ExpirySweeper(store).sweep() == 0


async def test_a_started_or_cancelled_task_is_left_alone(store: TaskStore) -> None:
    started = await queued(store, 1, age_s=5)
    started.status, started.started_at = TaskStatus.running, utcnow()
    assert await store.update_task(started, [("status", {"status": "running"})])
    cancelled = await queued(store, 1, age_s=5)
    cancelled.status, cancelled.finished_at = TaskStatus.cancelled, utcnow()
    assert await store.update_task(cancelled, [("status", {"status": "cancelled"})])
    assert await ExpirySweeper(store).sweep() == 0
    assert (await stored(store, started.id)).status == TaskStatus.running
    assert (await stored(store, cancelled.id)).status == TaskStatus.cancelled
    # a sweeper that read the task pending just before a worker started it: its
    # compare-and-set fails and the run goes on
    raced = await queued(store, 1, age_s=5)
    seen = await stored(store, raced.id)
    raced.status, raced.started_at = TaskStatus.running, utcnow()
    assert await store.update_task(raced, [("status", {"status": "running"})])
    assert not await expire(store, seen)
    assert (await stored(store, raced.id)).status == TaskStatus.running
    assert await final_events(store, raced.id) == []


async def test_the_loop_expires_tasks_as_they_fall_due_and_stops(store: TaskStore) -> None:
    """Run as a worker process runs it: started, it expires what falls due (more than
    one round's ``limit`` at once) every ``every_s``; stop() ends it at once."""
    tasks = [await queued(store, 0.2, age_s=1, model=f"m{i % 3}") for i in range(7)]
    sweeper = ExpirySweeper(store, every_s=0.05, limit=3)
    await sweeper.start()
    try:

        async def all_expired() -> bool:
            got = await store.get_tasks([t.id for t in tasks])
            return all(t is not None and t.status == TaskStatus.expired for t in got)

        await until(all_expired, 10, "every due task to expire")
        late = await queued(store, 0.3)  # falls due while the loop runs
        await until(
            lambda: _status_is(store, late.id, TaskStatus.expired), 10, "the late task to expire"
        )
    finally:
        await asyncio.wait_for(sweeper.stop(), 5)
    assert sweeper._loop is None
    for task in tasks:
        assert len(await final_events(store, task.id)) == 1


async def _status_is(store: TaskStore, task_id: str, status: TaskStatus) -> bool:
    return (await stored(store, task_id)).status == status


async def test_every_s_must_be_positive(store: TaskStore) -> None:
    with pytest.raises(ValueError, match="every_s"):
        ExpirySweeper(store, every_s=0)
