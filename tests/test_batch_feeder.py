"""The batch feeder driven tick by tick over a real store (both stores): one feeder at a
time, lines admitted once on the batch lane, and a batch whose feeder stopped while it
was finalizing, and lines whose task expired in the queue."""

from __future__ import annotations

import json
from typing import Any

import pytest

from ponder.config import Settings
from ponder.ids import IdGenerator, sort_key
from ponder.openai.batch_feeder import LEASE, BatchFeeder
from ponder.openai.batches import KIND, new_batch
from ponder.openai.files import FileStore, file_id_of
from ponder.store import TaskStore
from ponder.store.base import StoredObject
from ponder.types import Result, TaskStatus, utcnow
from ponder.worker.expiry import expire

pytestmark = pytest.mark.timeout(30)

_ids = IdGenerator("test1")
CHAT = "/v1/chat/completions"


def line(i: int) -> str:
    body = {"model": "ponder-fast", "messages": [{"role": "user", "content": f"q{i}"}]}
    return json.dumps({"custom_id": f"c{i}", "method": "POST", "url": CHAT, "body": body})


async def make_batch(store: TaskStore, settings: Settings, lines: int) -> StoredObject:
    raw = _ids.new_id()
    file_id = file_id_of(raw)
    content = "\n".join(line(i) for i in range(lines)) + "\n"
    await FileStore(store, settings).create(
        file_id=file_id,
        raw_id=raw,
        owner="k",
        filename="in.jsonl",
        purpose="batch",
        content=content,
    )
    raw = _ids.new_id()
    data = new_batch(
        f"batch_{raw}",
        input_file_id=file_id,
        endpoint=CHAT,
        window="24h",
        metadata=None,
        webhook_url=None,
    )
    obj = StoredObject(KIND, f"batch_{raw}", "k", sort_key(raw), data, active=True)
    assert await store.create_object(obj, ttl_s=600)
    return obj


async def batch_of(store: TaskStore, obj: StoredObject) -> dict[str, Any]:
    stored = await store.get_object(KIND, obj.id)
    assert stored is not None
    return stored.data


async def test_one_feeder_at_a_time(store: TaskStore, settings: Settings) -> None:
    obj = await make_batch(store, settings, 20)
    first = BatchFeeder(store, settings, holder="first")
    second = BatchFeeder(store, settings, holder="second")
    await first.tick()  # validates
    await first.tick()  # admits (no worker runs them: they stay pending)
    data = await batch_of(store, obj)
    assert data["batch"]["status"] == "in_progress"
    admitted = dict(data["state"]["in_flight"])
    assert len(admitted) == settings.batch_max_in_flight
    assert await store.batch_pending_count() == settings.batch_max_in_flight
    assert await store.pending_count() == settings.batch_max_in_flight  # no other task
    await second.tick()  # the lease is the first's: nothing happens
    assert (await batch_of(store, obj))["state"] == data["state"]
    await store.release_lease(LEASE, "first")  # as its run() does when it stops
    await second.tick()
    again = await batch_of(store, obj)
    assert again["state"]["in_flight"] == admitted  # carried on, nothing admitted twice
    tasks = await store.get_tasks(list(admitted.values()))
    assert all(t is not None and t.priority == 5 for t in tasks)


async def test_a_batch_stopped_while_finalizing_is_finished_by_the_next_feeder(
    store: TaskStore, settings: Settings
) -> None:
    obj = await make_batch(store, settings, 3)
    obj.data["batch"].update(status="finalizing", finalizing_at=1)
    obj.data["batch"]["request_counts"] = {"total": 3, "completed": 3, "failed": 0}
    obj.data["state"]["next_line"] = 3
    for n in range(3):
        entry = {
            "id": f"batch_req_{n}",
            "custom_id": f"c{n}",
            "error": None,
            "response": {"status_code": 200, "request_id": f"req_{n}", "body": {"n": n}},
        }
        await store.put_part(obj.id, n, json.dumps({"ok": True, "entry": entry}), ttl_s=60)
    assert await store.update_object(obj)
    await BatchFeeder(store, settings, holder="next").tick()
    data = await batch_of(store, obj)
    assert data["batch"]["status"] == "completed" and data["batch"]["completed_at"]
    assert data["batch"]["error_file_id"] is None
    content = await FileStore(store, settings).content(data["batch"]["output_file_id"])
    assert content is not None
    assert [json.loads(x)["custom_id"] for x in content.splitlines()] == ["c0", "c1", "c2"]
    assert await store.active_objects(KIND) == []
    assert await store.get_parts(obj.id) == {}


async def test_a_line_whose_task_expired_is_a_queue_timeout_error(
    store: TaskStore, settings: Settings
) -> None:
    obj = await make_batch(store, settings, 3)
    feeder = BatchFeeder(store, settings, holder="f")
    await feeder.tick()  # validates
    await feeder.tick()  # admits the three lines: pending, nobody runs them
    in_flight = (await batch_of(store, obj))["state"]["in_flight"]
    tasks = await store.get_tasks([in_flight[str(n)] for n in range(3)])
    assert all(t is not None and t.status == TaskStatus.pending for t in tasks)
    first, second, third = (t for t in tasks if t is not None)
    for task in (first, second):
        task.queue_timeout_s = 1.0  # as the sweeper finds it, past its deadline
        assert await expire(store, task)
    third.status, third.started_at = TaskStatus.running, utcnow()
    assert await store.update_task(third, [("status", {"status": "running"})])
    third.status, third.finished_at = TaskStatus.done, utcnow()
    third.result = Result(answer="1", text="It is 1.", confidence=1, agreement=1, votes={"1": 1},
                          chosen_sample=0)  # fmt: skip
    assert await store.update_task(third, [("result", third.to_public())])
    await feeder.tick()  # collects the three, ends the batch
    data = await batch_of(store, obj)
    batch = data["batch"]
    assert batch["status"] == "completed"
    assert batch["request_counts"] == {"total": 3, "completed": 1, "failed": 2}
    files = FileStore(store, settings)
    errors = [
        json.loads(x) for x in (await files.content(batch["error_file_id"]) or "").splitlines()
    ]
    assert [(e["custom_id"], e["response"], e["error"]["code"]) for e in errors] == [
        ("c0", None, "queue_timeout"),
        ("c1", None, "queue_timeout"),
    ]
    assert "1s queue_timeout_s" in errors[0]["error"]["message"]
    output = await files.content(batch["output_file_id"])
    assert output is not None and json.loads(output)["custom_id"] == "c2"
