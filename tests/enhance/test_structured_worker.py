"""A structured task end to end: the worker, a real store and the scripted engine (which
writes schema-valid JSON, steered per sample by its ``fields`` directive)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from ponder.admission import build_task
from ponder.config import Settings
from ponder.engines.scripted import ScriptedEngine
from ponder.ids import IdGenerator
from ponder.schemas import TaskCreate
from ponder.states import is_terminal
from ponder.store import create_store
from ponder.store.base import Admission, TaskStore
from ponder.store.records import Event
from ponder.types import EventName, Task, TaskStatus
from ponder.worker import Worker

PERSON: dict[str, Any] = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
}


class Service:
    def __init__(self, settings: Settings, store: TaskStore) -> None:
        self.settings = settings
        self.store = store
        self.ids = IdGenerator("t1")

    async def submit(self, prompt: str, **fields: Any) -> Task:
        task = build_task(TaskCreate(prompt=prompt, **fields), self.settings,
                          task_id=self.ids.new_id(), owner="")  # fmt: skip
        stored, _ = await self.store.create_task(
            task, Admission(max_pending=self.settings.max_pending)
        )
        return stored

    async def finish(self, task_id: str, timeout_s: float = 10.0) -> tuple[Task, list[Event]]:
        """The task once terminal, and its event log (read as it grows: no polling)."""
        events: list[Event] = []
        async with asyncio.timeout(timeout_s):
            while True:
                task = await self.store.get_task(task_id)
                assert task is not None
                if is_terminal(task.status):
                    events += await self.store.read_events(
                        task_id, events[-1].id if events else None
                    )
                    return task, events
                after = events[-1].id if events else None
                events += await self.store.read_events(task_id, after, block_ms=200)


@pytest.fixture
async def service(sqlite_settings: Settings) -> AsyncIterator[Service]:
    store = create_store(sqlite_settings)
    await store.start()
    engine = ScriptedEngine(sqlite_settings)
    await engine.start()
    worker = Worker(store, engine, sqlite_settings, worker_id="w0")
    job = asyncio.create_task(worker.run())
    try:
        yield Service(sqlite_settings, store)
    finally:
        worker.stop()
        await job
        await engine.close()
        await store.close()


async def _person_task(service: Service, prompt: str) -> Task:
    """A standard task of three samples, all run, answering with a PERSON object."""
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}
    return await service.submit(
        prompt, mode="standard", samples=3, early_stop=False, response_format=fmt
    )


async def test_a_structured_task_is_voted_field_by_field(service: Service) -> None:
    task = await _person_task(
        service, "Who is it? [[fields: name = Ann Lee | ann lee | Bob; age = 30 | 31 | 30]]"
    )
    done, events = await service.finish(task.id)
    assert done.status == TaskStatus.done and done.result is not None
    result = done.result
    assert result.object == {"name": "Ann Lee", "age": 30}
    assert result.object_from == "fields"
    assert result.answer == '{"age":30,"name":"Ann Lee"}'
    assert result.fields is not None
    assert result.fields["name"].votes == {'"Ann Lee"': 2, '"Bob"': 1}
    assert result.fields["age"].votes == {"30": 2, "31": 1}
    assert all(0 < f.confidence <= 1 for f in result.fields.values())
    assert result.agreement == pytest.approx(2 / 3, abs=1e-3)
    samples = [e.data for e in events if e.event == EventName.sample]
    assert len(samples) == 3
    assert sorted(s["object"]["name"] for s in samples) == ["Ann Lee", "Bob", "ann lee"]
    assert all(s["schema_error"] is None and s["answer"] for s in samples)
    finals = [e.data for e in events if e.event == EventName.result]
    assert finals and finals[-1]["result"]["fields"]["age"]["value"] == 30
    for early in (e.data for e in events if e.event == EventName.preliminary):
        assert early["object"] is not None and set(early["fields"]) == {"name", "age"}


async def test_a_sample_that_is_not_valid_does_not_vote(service: Service) -> None:
    task = await _person_task(
        service, 'Who is it? [[fields: name = Ann | Bob | Ann; age = 30 | "old" | 30]]'
    )
    done, _ = await service.finish(task.id)
    assert done.result is not None and done.result.object == {"name": "Ann", "age": 30}
    invalid = [s for s in done.samples if s.object is None]
    assert [s.index for s in invalid] == [1]
    assert invalid[0].schema_error is not None and "age" in invalid[0].schema_error
    assert invalid[0].answer is None and invalid[0].confidence == 0.0
    assert done.result.fields is not None
    assert done.result.fields["name"].votes == {'"Ann"': 2}
