"""The Outbox part of the contract (webhook deliveries), against both stores (``store``
fixture)."""

from __future__ import annotations

from ponder.config import Settings
from ponder.store import Notice, OutboxEntry, TaskStore
from ponder.store.base import Admission, HostRoom
from ponder.types import CallbackInfo, Task, TaskStatus

from .helpers import add, advance, ids, let_time_pass

# --- webhook outbox ---------------------------------------------------------------------
HOOK = "http://127.0.0.1:9/hook"


def with_callback(url: str = HOOK) -> Task:
    return Task(id=ids.new_id(), prompt="x", callback=CallbackInfo(url=url))


async def claim_all(store: TaskStore, consumer: str = "d") -> list[OutboxEntry]:
    entries, _ = await store.claim_deliveries(consumer, 100, 30, HostRoom(100))
    return entries


async def test_the_terminal_write_adds_the_webhook_once_ever(store: TaskStore) -> None:
    cursor, _ = await store.read_notices(Notice.outbox, None, 0)
    task, _ = await store.create_task(with_callback(), Admission(max_pending=10))
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
    task, _ = await store.create_task(with_callback(), Admission(max_pending=10))
    await advance(store, task, TaskStatus.cancelled)
    (entry,) = await claim_all(store)
    assert entry.event == "task.cancelled"


async def test_deliveries_are_leased_rescheduled_and_finished(store: TaskStore) -> None:
    await store.enqueue_deliveries(
        [OutboxEntry(webhook_id=f"msg_{i}", event="e", url=HOOK, body={"i": i}) for i in range(3)]
    )
    await store.enqueue_deliveries([OutboxEntry(webhook_id="msg_0", event="e", url=HOOK, body={})])
    assert await store.outbox_depth() == 3  # an id already queued is left as it was
    first, wait_s = await store.claim_deliveries("a", 2, 0.3, HostRoom(10))
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
    entries, wait_s = await store.claim_deliveries("c", 10, 30, HostRoom(10))
    assert entries == [] and wait_s is not None and 50 < wait_s <= 60  # msg_0's retry
    assert await store.outbox_depth() == 1
    await store.finish_delivery("msg_0")
    assert await store.claim_deliveries("c", 10, 30, HostRoom(10)) == ([], None)


async def test_a_busy_host_lets_others_by(store: TaskStore) -> None:
    busy, other = "http://10.0.0.1:80/h", "http://10.0.0.2:8080/h"
    entries = [OutboxEntry(webhook_id=f"b{i}", event="e", url=busy, body={}) for i in range(4)]
    entries.append(OutboxEntry(webhook_id="o", event="e", url=other, body={}))
    await store.enqueue_deliveries(entries)
    taken, _ = await store.claim_deliveries("a", 10, 30, HostRoom(2, {"10.0.0.1:80": 1}))
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
    # due in 1 s: closing and reopening the store can take 0.2 s on a loaded machine
    assert await store.retry_delivery("a", soon, 1.0)
    await store.close()
    reopened = create_store(settings)
    await reopened.start()
    try:
        assert await claim_all(reopened) == []
        await let_time_pass(1.1)
        (due,) = await claim_all(reopened)
        assert (due.webhook_id, due.attempts) == ("soon", 1)
        assert await reopened.outbox_depth() == 2
    finally:
        await reopened.close()
