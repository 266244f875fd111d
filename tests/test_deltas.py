"""DeltaPublisher: coalescing, placement by offset and ordering, against both real stores."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

import pytest

from ponder.deltas import DeltaPublisher
from ponder.errors import StoreUnavailable
from ponder.store import TaskStore
from ponder.store.base import Event
from ponder.types import Task, TaskStatus
from tests.store.test_contract import add, advance

pytestmark = pytest.mark.timeout(30)

INTERVAL_S = 0.1


async def running_task(store: TaskStore) -> Task:
    task = await add(store)
    await advance(store, task, TaskStatus.running)
    return task


async def deltas_of(store: TaskStore, task: Task) -> list[Event]:
    return [e for e in await store.read_events(task.id, None, limit=10_000) if e.event == "delta"]


def rebuild(events: list[Event], index: int) -> str:
    """A client's view of sample ``index``: each piece placed at its offset."""
    text = ""
    for event in events:
        if event.data["index"] == index:
            assert event.data["offset"] <= len(text)
            text = text[: event.data["offset"]] + event.data["text"]
    return text


async def test_pieces_are_coalesced_to_one_event_per_interval_and_sample(
    store: TaskStore,
) -> None:
    task = await running_task(store)
    publisher = DeltaPublisher(store, task.id, INTERVAL_S)
    writers = [publisher.writer(0), publisher.writer(1)]
    assert all(w is not None for w in writers)
    loop = asyncio.get_running_loop()
    started = loop.time()
    words = [f" w{i}" for i in range(150)]
    for word in words:  # an engine emitting a token every 5 ms for each of two rows
        for write in writers:
            assert write is not None
            write(word)
        await asyncio.sleep(0.005)
    await asyncio.sleep(INTERVAL_S * 2)  # the last pieces' flush
    elapsed = loop.time() - started
    publisher.end(0)
    publisher.end(1)
    await publisher.idle()
    events = await deltas_of(store, task)
    for index in (0, 1):
        mine = [e for e in events if e.data["index"] == index]
        # at most one event per interval (plus the first, written at once)
        assert 2 <= len(mine) <= elapsed / INTERVAL_S + 1
        assert rebuild(events, index) == "".join(words)
    assert publisher.events_written == len(events)


async def test_the_first_piece_is_written_without_waiting_for_an_interval(
    store: TaskStore,
) -> None:
    task = await running_task(store)
    publisher = DeltaPublisher(store, task.id, interval_s=60.0)
    write = publisher.writer(0)
    assert write is not None
    last = (await store.read_events(task.id, None))[-1].id
    write("Let")
    events = await store.read_events(task.id, last, block_ms=5000)
    assert [(e.event, e.data) for e in events] == [
        ("delta", {"index": 0, "offset": 0, "text": "Let"})
    ]
    write(" me")  # due only a minute later: dropped when the sample ends first
    publisher.end(0)
    await publisher.idle()
    assert len(await deltas_of(store, task)) == 1


async def test_no_delta_of_a_sample_follows_its_end(store: TaskStore) -> None:
    task = await running_task(store)
    publisher = DeltaPublisher(store, task.id, INTERVAL_S)
    write = publisher.writer(3)
    assert write is not None
    write("abc")  # written at once; the worker waits for it before writing the record
    publisher.end(3)
    await publisher.idle()
    assert [e.data["text"] for e in await deltas_of(store, task)] == ["abc"]
    task.samples_done = 1
    assert await store.update_task(task, [("sample", {"index": 3})])
    write("late")  # an engine callback after the end is ignored
    await asyncio.sleep(INTERVAL_S * 2)
    names = [e.event for e in await store.read_events(task.id, None)]
    assert names[-2:] == ["delta", "sample"]


async def test_a_sample_started_again_begins_at_offset_zero(store: TaskStore) -> None:
    task = await running_task(store)
    publisher = DeltaPublisher(store, task.id, INTERVAL_S)
    first = publisher.writer(0)
    assert first is not None
    first("old text")
    publisher.end(0)
    await publisher.idle()
    again = publisher.writer(0)
    assert again is not None
    again("new")
    await asyncio.sleep(INTERVAL_S * 2)  # flushed one interval after the first write
    publisher.end(0)
    await publisher.idle()
    events = await deltas_of(store, task)
    assert [e.data["offset"] for e in events] == [0, 0]
    assert rebuild(events, 0) == "new"


async def test_nothing_is_written_until_followed_then_the_text_so_far_at_offset_zero(
    store: TaskStore,
) -> None:
    task = await running_task(store)
    last = (await store.read_events(task.id, None))[-1].id
    publisher = DeltaPublisher(store, task.id, INTERVAL_S, followed=False)
    first, second = publisher.writer(0), publisher.writer(1)
    assert first is not None and second is not None
    for word in ("Let", " me", " see"):
        first(word)
    second("Two")
    # two intervals, in which flushes would be due: nothing comes
    assert await store.read_events(task.id, last, block_ms=int(INTERVAL_S * 2000)) == []
    assert publisher.events_written == 0
    publisher.end(1)  # an ended sample's text is the sample event's: not written
    publisher.follow()
    await publisher.idle()
    events = await deltas_of(store, task)
    assert [e.data for e in events] == [{"index": 0, "offset": 0, "text": "Let me see"}]
    first(" it")  # followed now: written one interval after the first write
    assert len(await store.read_events(task.id, events[-1].id, block_ms=5000)) == 1
    publisher.end(0)
    await publisher.idle()
    events = await deltas_of(store, task)
    assert [e.data["offset"] for e in events] == [0, len("Let me see")]
    assert rebuild(events, 0) == "Let me see it"


async def test_deltas_off(store: TaskStore) -> None:
    task = await running_task(store)
    assert DeltaPublisher(store, task.id, interval_s=0).writer(0) is None


class _DownStore:
    """A store whose event appends fail as in an outage (the publisher's error path)."""

    async def append_events(self, task_id: str, events: Sequence[tuple[str, Any]]) -> bool:
        raise StoreUnavailable("Redis is unavailable: connection refused")


async def test_a_failed_write_is_dropped_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    publisher = DeltaPublisher(_DownStore(), "1764412800123-test1-1", INTERVAL_S)  # type: ignore[arg-type]
    write = publisher.writer(0)
    assert write is not None
    with caplog.at_level(logging.DEBUG, logger="ponder.worker"):
        write("x")
        publisher.end(0)
        await publisher.idle()
    assert publisher.events_written == 0
    assert "1 delta event(s) dropped" in caplog.text
