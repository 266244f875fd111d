"""The SDK's ``delta`` events: both clients follow the text of running samples."""

from __future__ import annotations

import asyncio

import pytest

from ponder.client import AsyncClient, Client, TaskEvent
from ponder.config import Settings
from tests.conftest import LiveServer

pytestmark = pytest.mark.timeout(60)

PROMPT = "[[answers: 3, 3]] [[tokens: 30]]"


def rebuilt(events: list[TaskEvent]) -> dict[int, str]:
    texts: dict[int, str] = {}
    for event in events:
        if (delta := event.delta) is not None:
            texts[delta.index] = delta.apply(texts.get(delta.index, ""))
    return texts


async def test_both_clients_follow_deltas_and_can_leave_them_out(settings: Settings) -> None:
    slow = settings.model_copy(update={"scripted_step_ms": [20.0, 0.0]})
    async with LiveServer(slow, workers=1) as live:
        async with AsyncClient(live.url) as client:
            task = await client.submit(PROMPT, samples=2)
            events = [e async for e in client.events(task.id)]
            plain = [e async for e in client.events(task.id, deltas=False)]
            done = await client.wait(task.id, timeout=30)
        assert [e for e in events if e.event != "delta"] == plain
        assert all(e.delta is None for e in plain)
        texts = rebuilt(events)
        assert set(texts) == {0, 1}
        for sample in done.samples:
            assert sample.text is not None and sample.text.startswith(texts[sample.index])

        def sync_events() -> list[TaskEvent]:
            with Client(live.url) as sync:
                return list(sync.events(task.id))

        assert await asyncio.to_thread(sync_events) == events
