"""``delta`` events on SSE and WebSocket: the text of running samples as it is generated."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from ponder.config import Settings
from tests.api.test_events import Event, check_story, read_stream, sse_events, ws_events
from tests.conftest import LiveServer

pytestmark = pytest.mark.timeout(60)

#: 30 words per sample at 20 ms a step: each sample runs ~0.6 s, several delta intervals
SLOW = {"scripted_step_ms": [20.0, 0.0]}
PROMPT = "[[answers: 4, 4, 5]] [[tokens: 30]]"


def texts_by_index(events: list[Event]) -> dict[int, str]:
    """What a client rebuilds from the deltas: each piece placed at its offset."""
    texts: dict[int, str] = {}
    for _, name, data in events:
        if name == "delta":
            so_far = texts.get(data["index"], "")
            assert 0 <= data["offset"] <= len(so_far)
            texts[data["index"]] = so_far[: data["offset"]] + data["text"]
    return texts


def check_deltas(events: list[Event]) -> None:
    """Deltas come after the task's ``running`` status, and those of a sample before its
    ``sample`` event; they add up to its text."""
    final = {s["index"]: s for s in events[-1][2]["samples"]}
    ended: set[int] = set()
    running = False
    for _, name, data in events:
        if name == "status":
            running = running or data["status"] == "running"
        elif name == "delta":
            assert running, "a delta before the task's running status"
        if name == "sample":
            ended.add(data["index"])
        elif name == "delta":
            assert set(data) == {"index", "offset", "text"}
            assert data["index"] not in ended, "a delta after its sample's end"
    rebuilt = texts_by_index(events)
    assert rebuilt, "no delta event"
    for index, text in rebuilt.items():
        assert final[index]["text"].startswith(text)


@pytest.fixture
async def slow(settings: Settings) -> Any:
    live_server = LiveServer(settings.model_copy(update=SLOW), workers=1)
    async with live_server as live, httpx.AsyncClient(base_url=live.url, timeout=30) as c:
        yield live, c


async def test_sse_carries_deltas_of_every_sample(slow: Any) -> None:
    _, c = slow
    task = (await c.post("/v1/tasks", json={"prompt": PROMPT, "early_stop": False})).json()
    events = await read_stream(c, task["id"])
    check_story([e for e in events if e[1] != "delta"], samples=3)
    check_deltas(events)
    assert set(texts_by_index(events)) == {0, 1, 2}
    # coalesced: ~0.6 s of text per sample at most every 100 ms, not one event per word
    per_sample = [
        sum(1 for e in events if e[1] == "delta" and e[2]["index"] == i) for i in range(3)
    ]
    assert all(2 <= n <= 12 for n in per_sample), per_sample
    # a finished task replays its deltas too, and resumes after any of them
    assert await read_stream(c, task["id"]) == events
    cut = next(i for i, e in enumerate(events) if e[1] == "delta") + 1
    rest = await read_stream(c, task["id"], {"Last-Event-ID": events[cut - 1][0]})
    assert rest == events[cut:]


async def test_deltas_false_is_the_stream_without_deltas(slow: Any) -> None:
    _, c = slow
    task = (await c.post("/v1/tasks", json={"prompt": PROMPT, "mode": "fast"})).json()
    everything = await read_stream(c, task["id"])
    assert any(name == "delta" for _, name, _ in everything)
    async with c.stream("GET", f"/v1/tasks/{task['id']}/events?deltas=false") as r:
        plain = [e async for e in sse_events(r) if not isinstance(e, str)]
    assert plain == [e for e in everything if e[1] != "delta"]
    check_story(plain, samples=1)


async def test_an_interval_of_deltas_only_is_idle_without_deltas(settings: Settings) -> None:
    quick = settings.model_copy(update={**SLOW, "events_keepalive_s": 0.2})
    async with LiveServer(quick, workers=1) as live, httpx.AsyncClient(base_url=live.url) as c:
        body = {"prompt": "[[tokens: 60]]", "mode": "fast"}  # 1.2 s of deltas, then the end
        task = (await c.post("/v1/tasks", json=body)).json()
        follower = asyncio.create_task(read_stream(c, task["id"]))  # has deltas written
        async with c.stream("GET", f"/v1/tasks/{task['id']}/events?deltas=false") as r:
            items = [item async for item in sse_events(r)]
        assert ": keep-alive" in items
        assert [i for i in items if not isinstance(i, str) and i[1] == "delta"] == []
        assert sum(e[1] == "delta" for e in await follower) >= 5


async def read_until_end(c: httpx.AsyncClient, task_id: str) -> None:
    """Follow the task's events without deltas (not a follower of its text) to its end."""
    async with c.stream("GET", f"/v1/tasks/{task_id}/events?deltas=false") as r:
        async for _ in sse_events(r):
            pass


async def test_deltas_are_written_while_someone_follows(slow: Any) -> None:
    _, c = slow
    body = {"prompt": "[[tokens: 40]]", "mode": "fast"}  # 0.8 s of text
    alone, late, pace = [(await c.post("/v1/tasks", json=body)).json() for _ in range(3)]
    # pace runs beside late (a word a step each, late claimed first): once pace's deltas
    # hold 10 words, late has written as many with nobody following
    paced: list[Event] = []
    async with c.stream("GET", f"/v1/tasks/{pace['id']}/events") as r:
        async for item in sse_events(r):
            if not isinstance(item, str):
                paced.append(item)
                if len(texts_by_index(paced).get(0, "").split()) >= 10:
                    break
    events = await read_stream(c, late["id"])
    check_deltas(events)
    first = next(e[2] for e in events if e[1] == "delta")
    assert first["offset"] == 0 and len(first["text"].split()) >= 8  # the text so far
    assert len(texts_by_index(events)[0]) > len(first["text"])  # and the rest as it came
    # followed without deltas to its end: no delta in its log
    await read_until_end(c, alone["id"])
    replay = await read_stream(c, alone["id"])
    assert replay[-1][1] == "result" and all(e[1] != "delta" for e in replay)


async def test_websocket_carries_deltas_unless_asked_not_to(slow: Any) -> None:
    live, c = slow
    task = (await c.post("/v1/tasks", json={"prompt": PROMPT, "mode": "fast"})).json()
    ws_url = live.url.replace("http://", "ws://") + f"/v1/tasks/{task['id']}/ws"
    events, code = await ws_events(ws_url)
    assert code == 1000
    check_deltas(events)
    assert events == await read_stream(c, task["id"])
    plain, code = await ws_events(ws_url + "?deltas=false")
    assert code == 1000 and plain == [e for e in events if e[1] != "delta"]


async def test_a_cancelled_task_gets_no_more_deltas(slow: Any) -> None:
    _, c = slow
    task = (await c.post("/v1/tasks", json={"prompt": "[[tokens: 400]]", "mode": "fast"})).json()
    async with c.stream("GET", f"/v1/tasks/{task['id']}/events") as r:
        async for item in sse_events(r):
            if not isinstance(item, str) and item[1] == "delta":
                assert (await c.delete(f"/v1/tasks/{task['id']}")).status_code == 200
                break
    events = await read_stream(c, task["id"])
    assert events[-1][1:] == ("status", {"status": "cancelled"})
    await asyncio.sleep(0.5)  # the row runs on until the worker notices the cancel
    assert await read_stream(c, task["id"]) == events  # nothing was appended after it


@pytest.mark.slow
@pytest.mark.timeout(120)
async def test_deltas_cross_processes_over_redis(redis_url: str, key_prefix: str) -> None:
    """`ponder worker` appends the deltas, `ponder api` streams them; its overview has the
    store's figures only (no engine in that process)."""
    from tests.api.test_events import split_service

    env = {"PONDER_SCRIPTED_STEP_MS": "20,0"}
    async with (
        split_service(redis_url, key_prefix, **env) as url,
        httpx.AsyncClient(base_url=url, timeout=30) as c,
    ):
        task = (await c.post("/v1/tasks", json={"prompt": PROMPT, "mode": "fast"})).json()
        events = await read_stream(c, task["id"])
        overview = (await c.get("/v1/overview")).json()
    check_deltas(events)
    assert overview["role"] == "api" and overview["workers"] == 1
    assert overview["engine"] is None and "API only" in overview["note"]
