"""SSE and WebSocket event streams, on both stores and across processes over Redis."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import websockets
from websockets.exceptions import InvalidStatus

from ponder.config import Settings
from tests.conftest import LiveServer, wait_for_task
from tests.split import ponder_processes

pytestmark = pytest.mark.timeout(60)

Event = tuple[str, str, dict[str, Any]]  # (id, event, data)


async def sse_events(response: httpx.Response) -> AsyncIterator[Event | str]:
    """Parse an SSE body: events as (id, name, data); comments as their text."""
    event_id, name, data = "", "message", []
    async for line in response.aiter_lines():
        if line.startswith(":"):
            yield line
        elif line.startswith("id: "):
            event_id = line[4:]
        elif line.startswith("event: "):
            name = line[7:]
        elif line.startswith("data: "):
            data.append(line[6:])
        elif not line and data:
            yield event_id, name, json.loads("\n".join(data))
            event_id, name, data = "", "message", []


async def read_stream(
    client: httpx.AsyncClient, task_id: str, headers: dict[str, str] | None = None
) -> list[Event]:
    """Every event of one connection, until the server ends the stream."""
    async with client.stream("GET", f"/v1/tasks/{task_id}/events", headers=headers) as r:
        assert r.status_code == 200, await r.aread()
        assert r.headers["content-type"].startswith("text/event-stream")
        assert r.headers["cache-control"] == "no-cache"
        return [e async for e in sse_events(r) if not isinstance(e, str)]


def check_story(events: list[Event], samples: int, final: str = "done") -> None:
    """The events of one task, in order: pending, running, samples, result. (Samples
    that early stopping skipped never ran: they have no event.)"""
    names = [name for _, name, _ in events]
    assert names[:2] == ["status", "status"]
    assert [d["status"] for _, n, d in events if n == "status"][:2] == ["pending", "running"]
    assert names[-1] == "result" and events[-1][2]["status"] == final
    ran = [s for s in events[-1][2]["samples"] if s["status"] != "skipped"]
    assert names.count("sample") == len(ran) == samples
    ids = [i for i, _, _ in events]
    assert len(set(ids)) == len(ids) and all(ids)


async def test_sse_follows_a_task_to_its_end(client: httpx.AsyncClient) -> None:
    task = (await client.post("/v1/tasks", json={"prompt": "[[answers: 4, 5, 4]]"})).json()
    events = await read_stream(client, task["id"])
    check_story(events, samples=3)
    result = events[-1][2]
    assert result["id"] == task["id"] and result["result"]["answer"] == "4"
    assert {d["index"] for _, n, d in events if n == "sample"} == {0, 1, 2}


async def test_deep_mode_streams_a_preliminary_answer(client: httpx.AsyncClient) -> None:
    body = {"prompt": "What is 2 + 3? [[answers: 5, 5, 4, 5, 5]]", "mode": "deep"}
    task = (await client.post("/v1/tasks", json=body)).json()
    events = await read_stream(client, task["id"])
    names = [name for _, name, _ in events]
    # at most one a 0.5 s (tests/enhance/test_strategy.py holds the throttle to its clock):
    # this task's samples end within one interval unless the machine is slow
    preliminaries = [i for i, name in enumerate(names) if name == "preliminary"]
    assert preliminaries
    assert names.index("sample") < preliminaries[0]
    assert preliminaries[-1] < names.index("result")
    preliminary = events[preliminaries[-1]][2]
    assert {"answer", "text", "confidence", "votes"} <= set(preliminary)
    assert events[-1][2]["preliminary"] == preliminary  # the task keeps the last one


async def test_sse_replays_a_finished_task_and_resumes_after_any_id(
    client: httpx.AsyncClient,
) -> None:
    task = (
        await client.post("/v1/tasks", json={"prompt": "[[answers: 1]]", "mode": "fast"})
    ).json()
    await wait_for_task(client, task["id"])
    everything = await read_stream(client, task["id"])
    check_story(everything, samples=1)
    assert await read_stream(client, task["id"]) == everything  # replay is stable
    for cut in range(len(everything)):
        last_id = everything[cut][0]
        rest = await read_stream(client, task["id"], {"Last-Event-ID": last_id})
        assert rest == everything[cut + 1 :]
    # the query parameter works as the header does (for clients that cannot set headers)
    r = await client.get(
        f"/v1/tasks/{task['id']}/events", params={"last_event_id": everything[0][0]}
    )
    assert r.text.count("event: ") == len(everything) - 1


async def test_sse_client_disconnects_midway_and_resumes(settings: Settings) -> None:
    """One sample at a time: the client leaves after the first one, resumes, and gets
    every later event exactly once."""
    slow = settings.model_copy(update={"engine_max_rows": 1})
    async with LiveServer(slow, workers=1) as live, httpx.AsyncClient(base_url=live.url) as c:
        body = {"prompt": "[[answers: 1, 2, 3, 4, 5]] [[sleep_ms: 60]]", "samples": 5}
        task = (await c.post("/v1/tasks", json=body)).json()
        seen: list[Event] = []
        async with c.stream("GET", f"/v1/tasks/{task['id']}/events") as r:
            async for item in sse_events(r):
                if isinstance(item, str):
                    continue
                seen.append(item)
                if item[1] == "sample":
                    break  # disconnect in the middle of the task
        assert seen[-1][1] == "sample"
        rest = await read_stream(c, task["id"], {"Last-Event-ID": seen[-1][0]})
        full = seen + rest
        check_story(full, samples=5)
        assert full == await read_stream(c, task["id"])  # nothing missed, nothing twice


async def test_sse_keepalive_and_cancel_ends_the_stream(settings: Settings) -> None:
    quick = settings.model_copy(update={"events_keepalive_s": 0.1})
    async with LiveServer(quick, workers=1) as live, httpx.AsyncClient(base_url=live.url) as c:
        task = (await c.post("/v1/tasks", json={"prompt": "[[hang]]"})).json()
        items: list[Event | str] = []
        async with c.stream("GET", f"/v1/tasks/{task['id']}/events") as r:
            async for item in sse_events(r):
                items.append(item)
                if item == ": keep-alive" and items.count(item) == 2:
                    assert (await c.delete(f"/v1/tasks/{task['id']}")).status_code == 200
        events = [i for i in items if not isinstance(i, str)]
        assert events[-1][1:] == ("status", {"status": "cancelled"})


async def test_sse_stops_reading_when_the_client_leaves(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A vanished client costs nothing: the server's blocked read of the log is cancelled
    at once (not at the next keep-alive)."""
    async with LiveServer(settings, workers=1) as live:
        store: Any = live.app.state.ponder.store
        blocked, left = asyncio.Event(), asyncio.Event()  # a blocking read in progress; cancelled
        real_read = store.read_events

        async def read_events(task_id: str, after: str | None, **kwargs: Any) -> Any:
            blocking = bool(kwargs.get("block_ms"))
            if blocking:
                blocked.set()
            try:
                events = await real_read(task_id, after, **kwargs)
            except asyncio.CancelledError:
                left.set()
                raise
            if blocking:
                blocked.clear()
            return events

        monkeypatch.setattr(store, "read_events", read_events)
        async with httpx.AsyncClient(base_url=live.url) as c:
            task = (await c.post("/v1/tasks", json={"prompt": "[[hang]]"})).json()
            async with c.stream("GET", f"/v1/tasks/{task['id']}/events") as r:
                # held in a variable: a dropped generator would be closed by the garbage
                # collector at any moment, closing the connection before we mean to
                items = sse_events(r)
                async for item in items:
                    if not isinstance(item, str) and item[2].get("status") == "running":
                        break
                # the read that returned "running" has ended: wait for the next one to block
                await asyncio.wait_for(blocked.wait(), 10)
            await asyncio.wait_for(left.wait(), 5)  # the keep-alive is 15 s away
            await items.aclose()
            assert task["id"] not in getattr(store, "_events", {})
            await c.delete(f"/v1/tasks/{task['id']}")


async def test_sse_errors(settings: Settings) -> None:
    from ponder.api.deps import key_digest

    secured = settings.model_copy(update={"api_keys": [key_digest("pk_a"), key_digest("pk_b")]})
    async with LiveServer(secured, workers=1) as live:
        a = httpx.AsyncClient(base_url=live.url, headers={"Authorization": "Bearer pk_a"})
        b = httpx.AsyncClient(base_url=live.url, headers={"Authorization": "Bearer pk_b"})
        anon = httpx.AsyncClient(base_url=live.url)
        async with a, b, anon:
            task = (await a.post("/v1/tasks", json={"prompt": "[[answers: 1, 2, 1]]"})).json()
            for c, status, code in ((anon, 401, "unauthorized"), (b, 404, "not_found")):
                r = await c.get(f"/v1/tasks/{task['id']}/events")
                assert r.status_code == status and r.json()["error"]["code"] == code
            r = await a.get("/v1/tasks/1764412800123-nope-1/events")
            assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
            r = await a.get(f"/v1/tasks/{task['id']}/events", headers={"Last-Event-ID": "9" * 80})
            assert r.status_code == 400 and "Last-Event-ID" in r.json()["error"]["message"]
            assert r.json()["error"]["code"] == "invalid"
            check_story(await read_stream(a, task["id"]), samples=3)


@pytest.mark.parametrize("bad", ["abc", "1-2-3", "-1", "5 6", "5.0", "1764412800123-x", "9" * 21])
async def test_a_malformed_last_event_id_is_400(client: httpx.AsyncClient, bad: str) -> None:
    task = (await client.post("/v1/tasks", json={"prompt": "[[answers: 1]]"})).json()
    url = f"/v1/tasks/{task['id']}/events"
    for r in (
        await client.get(url, headers={"Last-Event-ID": bad}),
        await client.get(url, params={"last_event_id": bad}),
    ):
        assert r.status_code == 400, r.text
        assert r.json()["error"]["code"] == "invalid"
        assert "Last-Event-ID" in r.json()["error"]["message"]


def _one_past(event_id: str) -> str:
    """The id after ``event_id`` in the store's own form (a row id, or a stream id)."""
    first, dash, second = event_id.partition("-")
    return f"{first}-{int(second) + 1}" if dash else str(int(first) + 1)


@pytest.mark.parametrize("beyond", [_one_past, lambda _: "99999999999999999999"])
async def test_an_id_past_the_end_of_a_running_task_waits_for_the_next_event(
    settings: Settings, beyond: Any
) -> None:
    slow = settings.model_copy(update={"batch_max_size": 1})
    async with LiveServer(slow, workers=1) as live, httpx.AsyncClient(base_url=live.url) as c:
        # each sample takes 300 ms: nothing new is written while the client reconnects
        body = {"prompt": "[[answers: 1, 2, 1]] [[sleep_ms: 300]]", "early_stop": False}
        task = (await c.post("/v1/tasks", json=body)).json()
        async with c.stream("GET", f"/v1/tasks/{task['id']}/events") as r:
            async for item in sse_events(r):
                if not isinstance(item, str) and item[2].get("status") == "running":
                    last_id = item[0]
                    break
        rest = await read_stream(c, task["id"], {"Last-Event-ID": beyond(last_id)})
        everything = await read_stream(c, task["id"])
    assert rest[-1][1] == "result" and rest[-1][2]["status"] == "done"
    after = [event_id for event_id, _, _ in everything].index(last_id) + 1
    assert rest == everything[after:]  # every later event, in order, none skipped


# --- WebSocket ------------------------------------------------------------------------
async def ws_events(url: str, **kwargs: Any) -> tuple[list[Event], int]:
    """Every message of one WebSocket connection and the server's close code."""
    received: list[Event] = []
    async with websockets.connect(url, **kwargs) as ws:
        async for raw in ws:
            message = json.loads(raw)
            assert set(message) == {"event", "id", "data"}
            received.append((message["id"], message["event"], message["data"]))
        assert ws.close_code is not None
        return received, ws.close_code


async def test_websocket_streams_the_same_events(
    client: httpx.AsyncClient, server: LiveServer
) -> None:
    task = (await client.post("/v1/tasks", json={"prompt": "[[answers: 3, 1, 3]]"})).json()
    ws_url = server.url.replace("http://", "ws://") + f"/v1/tasks/{task['id']}/ws"
    live, code = await ws_events(ws_url)
    assert code == 1000
    check_story(live, samples=3)
    assert live == await read_stream(client, task["id"])
    replay, code = await ws_events(ws_url)  # a finished task: replayed, then closed
    assert replay == live and code == 1000
    rest, _ = await ws_events(ws_url + f"?last_event_id={live[1][0]}")
    assert rest == live[2:]
    rest, _ = await ws_events(ws_url, additional_headers={"Last-Event-ID": live[-2][0]})
    assert rest == live[-1:]


async def test_websocket_refuses_unknown_tasks_and_bad_keys(settings: Settings) -> None:
    from ponder.api.deps import key_digest

    secured = settings.model_copy(update={"api_keys": [key_digest("pk_a")]})
    async with LiveServer(secured, workers=1) as live:
        base = live.url.replace("http://", "ws://")
        with pytest.raises(InvalidStatus) as info:
            await ws_events(base + "/v1/tasks/1764412800123-nope-1/ws", additional_headers={
                "Authorization": "Bearer pk_a"})  # fmt: skip
        assert info.value.response.status_code == 404
        assert json.loads(info.value.response.body or b"{}")["error"]["code"] == "not_found"
        with pytest.raises(InvalidStatus) as info:
            await ws_events(base + "/v1/tasks/1764412800123-nope-1/ws")
        assert info.value.response.status_code == 401
        assert info.value.response.headers["www-authenticate"] == "Bearer"
        with pytest.raises(InvalidStatus) as info:
            await ws_events(base + "/v1/tasks/1764412800123-nope-1/ws?last_event_id=abc",
                            additional_headers={"Authorization": "Bearer pk_a"})  # fmt: skip
        assert info.value.response.status_code == 400


async def test_websocket_client_leaving_early_is_fine(
    client: httpx.AsyncClient, server: LiveServer
) -> None:
    task = (await client.post("/v1/tasks", json={"prompt": "[[hang]]"})).json()
    ws_url = server.url.replace("http://", "ws://") + f"/v1/tasks/{task['id']}/ws"
    async with websockets.connect(ws_url) as ws:
        first = json.loads(await ws.recv())
        assert first["event"] == "status"
        await ws.send("ignored")  # what a client sends is read and dropped
    assert (await client.delete(f"/v1/tasks/{task['id']}")).status_code == 200
    events, code = await ws_events(ws_url)
    assert code == 1000 and events[-1][1:] == ("status", {"status": "cancelled"})


# --- across processes -----------------------------------------------------------------
@contextlib.asynccontextmanager
async def split_service(redis_url: str, key_prefix: str, **env: str) -> AsyncIterator[str]:
    """`ponder api` and `ponder worker` as two processes over Redis; yields the API's URL."""
    base = {
        "PONDER_REDIS_URL": redis_url,
        "PONDER_KEY_PREFIX": key_prefix,
        "PONDER_ENGINE": "scripted",
        "PONDER_BATCH_MAX_SIZE": "1",
        "PONDER_CLAIM_BLOCK_MS": "200",
        **env,
    }
    async with ponder_processes(base) as (url, _):
        yield url


@pytest.mark.slow
@pytest.mark.timeout(120)
async def test_every_channel_across_processes_over_redis(redis_url: str, key_prefix: str) -> None:
    """The API streams what a worker in another process writes: SSE (with a drop and a
    resume), WebSocket, the SDK's wait and the OpenAI SDK."""
    from openai import AsyncOpenAI

    from ponder import AsyncClient

    async with split_service(redis_url, key_prefix) as url:
        async with httpx.AsyncClient(base_url=url, timeout=30) as c:
            body = {"prompt": "[[answers: 7, 8, 9, 6]] [[sleep_ms: 50]]", "samples": 4}
            task = (await c.post("/v1/tasks", json=body)).json()
            seen: list[Event] = []
            async with c.stream("GET", f"/v1/tasks/{task['id']}/events") as r:
                async for item in sse_events(r):
                    if not isinstance(item, str):
                        seen.append(item)
                        if item[1] == "sample":
                            break
            rest = await read_stream(c, task["id"], {"Last-Event-ID": seen[-1][0]})
            check_story(seen + rest, samples=4)
            assert seen + rest == await read_stream(c, task["id"])
            ws_url = url.replace("http://", "ws://") + f"/v1/tasks/{task['id']}/ws"
            replay, code = await ws_events(ws_url)
            assert replay == seen + rest and code == 1000
        async with AsyncClient(url) as client:
            submitted = await client.submit("[[answers: 3, 1, 3]]")
            done = await client.wait(submitted.id, timeout=60)
            assert done.result is not None and done.result.answer == "3"
        async with AsyncOpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0) as sdk:
            completion = await sdk.chat.completions.create(
                model="ponder", messages=[{"role": "user", "content": "[[answers: 2, 5, 2]]"}]
            )
            assert (completion.model_extra or {})["ponder"]["answer"] == "2"


async def test_event_streams_are_rate_limited(settings: Settings) -> None:
    limited = settings.model_copy(update={"rate_limit_per_s": 0.01, "rate_limit_burst": 2})
    async with LiveServer(limited, workers=0) as live, httpx.AsyncClient(base_url=live.url) as c:
        task = (await c.post("/v1/tasks", json={"prompt": "x"})).json()
        await c.delete(f"/v1/tasks/{task['id']}")  # the bucket is empty now
        r = await c.get(f"/v1/tasks/{task['id']}/events")
        assert r.status_code == 429 and r.json()["error"]["code"] == "rate_limited"
        ws_url = live.url.replace("http://", "ws://") + f"/v1/tasks/{task['id']}/ws"
        with pytest.raises(InvalidStatus) as info:
            await ws_events(ws_url)
        assert info.value.response.status_code == 429


async def test_more_event_streams_than_a_default_redis_pool_all_follow(
    redis_settings: Settings,
) -> None:
    """Every SSE follower waits on a Redis connection of its own: 120 at once (redis-py's
    default pool holds 100; the 101st was a 503) all follow their task to its end."""
    followers = 120
    quick = redis_settings.model_copy(update={"events_keepalive_s": 0.2})
    unpooled = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with (
        LiveServer(quick, workers=0) as live,
        httpx.AsyncClient(base_url=live.url, limits=unpooled, timeout=30) as c,
    ):
        ids = [
            (await c.post("/v1/tasks", json={"prompt": "x"})).json()["id"] for _ in range(followers)
        ]

        async def follow(task_id: str, waited_once: asyncio.Future[None]) -> tuple[int, Any]:
            try:
                async with c.stream("GET", f"/v1/tasks/{task_id}/events") as r:
                    if r.status_code != 200:
                        return r.status_code, await r.aread()
                    last: Any = None
                    async for item in sse_events(r):
                        if item == ": keep-alive" and not waited_once.done():
                            waited_once.set_result(None)  # a blocking read ran its course
                        elif not isinstance(item, str):
                            last = item
                    return r.status_code, last
            finally:
                if not waited_once.done():
                    waited_once.set_result(None)  # ended without waiting (the failure)

        loop = asyncio.get_running_loop()
        waited = [loop.create_future() for _ in ids]
        runs = [asyncio.create_task(follow(i, w)) for i, w in zip(ids, waited, strict=True)]
        await asyncio.gather(*waited)  # every stream has been inside its blocking read
        for task_id in ids:
            assert (await c.delete(f"/v1/tasks/{task_id}")).status_code == 200
        results = await asyncio.gather(*runs)
    assert [status for status, _ in results] == [200] * followers
    assert all(last[1:] == ("status", {"status": "cancelled"}) for _, last in results)
