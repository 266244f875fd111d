"""The Python SDK against a real server on loopback: both clients, errors, retries, resume."""

from __future__ import annotations

import asyncio
import inspect
import json
import time
import typing
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest

import ponder
from ponder.client import (
    APIConnectionError,
    AsyncClient,
    AuthenticationError,
    Client,
    ConflictError,
    InvalidRequestError,
    NotFoundError,
    QueueFullError,
    TaskEvent,
    WaitTimeout,
)
from ponder.config import Settings
from ponder.errors import ConfigError
from ponder.types import FieldVote, JsonSchemaFormat, ResponseFormat, Task, TaskStatus, utcnow
from tests.conftest import LiveServer, make_settings, open_store

pytestmark = pytest.mark.timeout(60)


# --- a transport that drops event streams midway --------------------------------------
def _cut(chunks: list[bytes], events: int) -> tuple[bytes, bool]:
    """The bytes of the first ``events`` SSE events in ``chunks`` (and whether reached)."""
    data = b"".join(chunks)
    kept, seen = b"", 0
    for message in data.split(b"\n\n")[:-1]:
        kept += message + b"\n\n"
        if message.startswith(b"id:"):
            seen += 1
            if seen == events:
                return kept, True
    return data, False


class _DroppedStream(httpx.AsyncByteStream, httpx.SyncByteStream):
    """Passes the first ``events`` events through, then fails like a dead connection."""

    def __init__(self, inner: Any, events: int) -> None:
        self.inner, self.events, self.buffer = inner, events, []

    def _kept(self, chunk: bytes) -> bytes | None:
        """Buffers ``chunk``; once the events are in, what to pass on before the drop."""
        self.buffer.append(chunk)
        kept, reached = _cut(self.buffer, self.events)
        return kept if reached else None

    def __iter__(self) -> Iterator[bytes]:
        for chunk in self.inner:
            if (kept := self._kept(chunk)) is not None:
                yield kept
                raise httpx.ReadError("connection dropped (test)")
        yield b"".join(self.buffer)

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self.inner:
            if (kept := self._kept(chunk)) is not None:
                yield kept
                raise httpx.ReadError("connection dropped (test)")
        yield b"".join(self.buffer)

    def close(self) -> None:
        self.inner.close()

    async def aclose(self) -> None:
        await self.inner.aclose()


class DroppingTransport(httpx.AsyncBaseTransport, httpx.BaseTransport):
    """Records requests; the first ``drops`` event streams die after ``events`` events;
    ``on_status`` is called with each response status."""

    def __init__(self, drops: int = 0, events: int = 2) -> None:
        self.sync, self.async_ = httpx.HTTPTransport(), httpx.AsyncHTTPTransport()
        self.drops, self.events = drops, events
        self.requests: list[httpx.Request] = []
        self.statuses: asyncio.Queue[int] = asyncio.Queue()
        self.loop = asyncio.get_running_loop()

    def _wrap(self, request: httpx.Request, response: httpx.Response) -> httpx.Response:
        self.loop.call_soon_threadsafe(self.statuses.put_nowait, response.status_code)
        if request.url.path.endswith("/events") and self.drops > 0 and response.status_code == 200:
            self.drops -= 1
            return httpx.Response(
                200, headers=response.headers, stream=_DroppedStream(response.stream, self.events)
            )
        return response

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        return self._wrap(request, self.sync.handle_request(request))

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        return self._wrap(request, await self.async_.handle_async_request(request))

    def close(self) -> None:
        self.sync.close()

    async def aclose(self) -> None:
        await self.async_.aclose()

    def event_requests(self) -> list[httpx.Request]:
        return [r for r in self.requests if r.url.path.endswith("/events")]


def check_events(events: list[TaskEvent]) -> None:
    ids = [e.id for e in events]
    assert len(set(ids)) == len(ids)
    assert events[0].status == TaskStatus.pending
    assert events[-1].is_final and events[-1].event == "result"
    assert all(not e.is_final for e in events[:-1])


# --- the async client -----------------------------------------------------------------
async def test_async_client_round_trip(server: LiveServer) -> None:
    async with AsyncClient(server.url) as client:
        task = await client.submit("What is 6 * 7? [[answers: 42, 41, 42]]", metadata={"u": "1"})
        assert isinstance(task, Task) and task.status == TaskStatus.pending
        assert task.metadata == {"u": "1"}
        done = await client.wait(task.id, timeout=30)
        assert done.status == TaskStatus.done
        assert done.result is not None and done.result.answer == "42"
        assert (await client.get(task.id)).result == done.result
        events = [e async for e in client.events(task.id)]
        check_events(events)
        samples = [e.sample for e in events if e.event == "sample"]
        assert sorted(s.index for s in samples if s is not None) == [0, 1, 2]
        final = events[-1].task
        assert final is not None and final.id == task.id and final.result == done.result
        tail = [e async for e in client.events(task.id, last_event_id=events[1].id)]
        assert tail == events[2:]
        page = await client.list(limit=1)
        assert [t.id for t in page.data] == [task.id] and page.next_cursor is None
        assert (await client.list(status="failed")).data == []
        assert await client.tasks(limit=1) == page  # the CLI's name (`ponder tasks`)


async def test_async_cancel_conflict_and_errors(server: LiveServer) -> None:
    async with AsyncClient(server.url, max_retries=0) as client:
        hanging = await client.submit("[[hang]]")
        cancelled = await client.cancel(hanging.id)
        assert cancelled.status == TaskStatus.cancelled
        waited = await client.wait(hanging.id, timeout=10)
        assert waited.status == TaskStatus.cancelled
        done = await client.wait((await client.submit("[[answers: 1]]", mode="fast")).id)
        with pytest.raises(ConflictError) as conflict:
            await client.cancel(done.id)
        assert conflict.value.code == "conflict" and conflict.value.status_code == 409
        assert conflict.value.task is not None and conflict.value.task.status == TaskStatus.done
        with pytest.raises(NotFoundError) as missing:
            await client.get("1764412800123-nope-1")
        assert missing.value.code == "not_found" and "nope" in missing.value.message
        with pytest.raises(NotFoundError):
            async for _ in client.events("1764412800123-nope-1"):
                pass
        with pytest.raises(InvalidRequestError) as invalid:
            await client.submit("x", priority=9)
        assert invalid.value.code == "invalid" and "priority" in invalid.value.message
        assert isinstance(invalid.value, ponder.errors.PonderError)


async def test_async_wait_times_out(server: LiveServer) -> None:
    async with AsyncClient(server.url) as client:
        task = await client.submit("[[hang]]")
        started = time.monotonic()
        with pytest.raises(WaitTimeout):
            await client.wait(task.id, timeout=0.3)
        assert time.monotonic() - started < 5
        with pytest.raises(WaitTimeout):
            async for _ in client.events(task.id, timeout=0.3):
                pass
        await client.cancel(task.id)


async def test_async_events_resume_after_a_dropped_connection(server: LiveServer) -> None:
    transport = DroppingTransport(drops=2, events=2)
    http = httpx.AsyncClient(transport=transport)
    async with AsyncClient(server.url, http_client=http) as client, http:
        body = "[[answers: 1, 2, 3, 4]] [[sleep_ms: 30]]"
        task = await client.submit(body, samples=4)
        events = [e async for e in client.events(task.id)]
        check_events(events)
        assert len([e for e in events if e.event == "sample"]) == 4
        streams = transport.event_requests()
        assert len(streams) == 3  # dropped twice, resumed twice
        assert "last-event-id" not in streams[0].headers
        assert streams[1].headers["last-event-id"] == events[1].id
        assert streams[2].headers["last-event-id"] == events[3].id
    async with AsyncClient(server.url) as plain:
        assert [e async for e in plain.events(task.id)] == events  # nothing missed or doubled


async def test_queue_full_is_retried_after_retry_after(settings: Settings) -> None:
    tiny = settings.model_copy(update={"max_pending": 1, "retry_after_s": 1})
    async with LiveServer(tiny, workers=0) as live:
        transport = DroppingTransport()
        http = httpx.AsyncClient(transport=transport)
        async with AsyncClient(live.url, http_client=http) as client, http:
            first = await client.submit("one")
            async with AsyncClient(live.url, max_retries=0) as impatient:
                with pytest.raises(QueueFullError) as full:
                    await impatient.submit("two")
            assert full.value.code == "queue_full" and full.value.retry_after_s == 1.0
            started = time.monotonic()
            second = asyncio.create_task(client.submit("two"))
            try:
                async with asyncio.timeout(10):
                    while await transport.statuses.get() != 503:  # the first try is refused
                        pass
                await client.cancel(first.id)  # frees the backlog slot
                task = await asyncio.wait_for(second, 20)
            finally:
                second.cancel()
                await asyncio.gather(second, return_exceptions=True)
            assert time.monotonic() - started >= 0.9  # waited what Retry-After said
            assert task.prompt == "two"
            posts = [r for r in transport.requests if r.method == "POST" and b"two" in r.content]
            assert len(posts) == 2  # the same Idempotency-Key on both
            assert posts[0].headers["idempotency-key"] == posts[1].headers["idempotency-key"]
            assert len((await client.list()).data) == 2


async def test_api_keys(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    from ponder.api.deps import key_digest

    secured = settings.model_copy(update={"api_keys": [key_digest("pk_right")]})
    async with LiveServer(secured, workers=1) as live:
        monkeypatch.setenv("PONDER_URL", live.url)
        monkeypatch.setenv("PONDER_API_KEY", "pk_right")
        async with AsyncClient() as client:  # both from the environment
            assert client.base_url == live.url
            task = await client.submit("[[answers: 2]]", mode="fast")
            assert (await client.wait(task.id, timeout=30)).status == TaskStatus.done
        async with AsyncClient(api_key="pk_wrong") as wrong:
            with pytest.raises(AuthenticationError) as info:
                await wrong.get(task.id)
            assert info.value.code == "unauthorized" and info.value.status_code == 401


async def test_connection_errors_are_typed() -> None:
    async with AsyncClient("http://127.0.0.1:9", max_retries=1, max_retry_wait_s=0.01) as c:
        with pytest.raises(APIConnectionError):
            await c.get("1764412800123-x-1")


async def test_preliminary_events_are_typed(server: LiveServer) -> None:
    async with AsyncClient(server.url) as client:
        task = await client.submit("[[answers: 5, 5, 4, 5, 5]]", mode="deep")
        events = [e async for e in client.events(task.id)]
        (preliminary,) = [e.result for e in events if e.event == "preliminary"]
        assert preliminary is not None and preliminary.answer is not None


# --- structured answers ---------------------------------------------------------------
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
    },
    "required": ["name", "age"],
}


async def test_submit_a_structured_task(server: LiveServer) -> None:
    schema = JsonSchemaFormat(name="person", schema=PERSON, strict=True)
    async with AsyncClient(server.url) as client:
        structured = ResponseFormat(type="json_schema", json_schema=schema)
        typed = await client.submit("Who?", response_format=structured)
        assert typed.response_format is not None and typed.response_format.strict
        as_json = await client.submit("Any", mode="fast", response_format={"type": "json_object"})
        assert as_json.response_format == ResponseFormat(type="json_object")
        done = await client.wait(typed.id, timeout=30)
    assert done.status == TaskStatus.done and done.result is not None
    assert isinstance(done.result.object, dict)
    jsonschema.validate(done.result.object, PERSON)
    assert done.result.fields is not None
    assert all(isinstance(vote, FieldVote) for vote in done.result.fields.values())


# --- strict input, mirrored -----------------------------------------------------------
def _with_property(schema: dict[str, Any]) -> dict[str, Any]:
    """A response_format whose schema has one property ``a`` of ``schema``."""
    root = {"type": "object", "properties": {"a": schema}}
    return {"type": "json_schema", "json_schema": {"name": "x", "schema": root}}


STRICT = [
    ({"priority": True}, "priority: Input should be a valid integer"),
    ({"samples": "2"}, "samples: Input should be a valid integer"),
    ({"temperature": "0.5"}, "temperature: Input should be a valid number"),
    ({"timeout_s": float("inf")}, "timeout_s: Input should be a finite number"),
    ({"metadata": {"x": float("nan")}}, "metadata: `x` is NaN or Infinity"),
    ({"metadata": {"x": [1, {"y": float("-inf")}]}}, "metadata: `x[1].y` is NaN or Infinity"),
    ({"callback_url": "http://example.com:0/h"}, "callback_url: port 0"),
    ({"callback_url": "http://me:pw@example.com/h"}, "user name or password"),
    ({"early_stop": "yes"}, "early_stop: Input should be a valid boolean"),
    ({"stop": ["ok", ""]}, "stop.1: String should have at least 1 character"),
    ({"prompt": " \n "}, "prompt: the prompt is blank"),
    # structured answers: the schema checked against the subset, the part named
    (
        {"response_format": _with_property({"oneOf": [{"type": "string"}]})},
        "response_format.json_schema.schema: properties.a: 'oneOf' is not supported",
    ),
    ({"response_format": {"type": "json_schema"}}, 'response_format: give "json_schema"'),
    (
        {"response_format": _with_property({"type": "number", "maximum": float("nan")})},
        "response_format.json_schema.schema: `properties.a.maximum` is NaN or Infinity",
    ),
]


@pytest.mark.parametrize(("fields", "fragment"), STRICT)
async def test_submit_checks_its_request_as_the_api_does(
    server: LiveServer, fields: dict[str, Any], fragment: str
) -> None:
    body = {"prompt": "a question", **fields}
    # nothing listens on port 9: an error other than InvalidRequestError means it sent
    async with AsyncClient("http://127.0.0.1:9", max_retries=0) as offline:
        with pytest.raises(InvalidRequestError) as local:
            await offline.submit(**body)
    assert local.value.status_code == 422 and local.value.code == "invalid"
    assert fragment in local.value.message
    with (
        Client("http://127.0.0.1:9", max_retries=0) as blocking_client,
        pytest.raises(InvalidRequestError) as blocking,
    ):
        blocking_client.submit(**body)
    assert blocking.value.message == local.value.message
    # the API answers the same message (sent raw: json.dumps writes NaN and Infinity)
    async with httpx.AsyncClient(base_url=server.url) as raw:
        response = await raw.post(
            "/v1/tasks", content=json.dumps(body), headers={"content-type": "application/json"}
        )
    assert response.status_code == 422
    assert response.json()["error"]["message"] == local.value.message


async def test_submit_sends_every_field_of_the_request(server: LiveServer) -> None:
    async with AsyncClient(server.url) as client:
        task = await client.submit(
            "[[answers: 3, 3, 4]]", stop=["\n\n"], early_stop=False, temperature=1, priority=0,
            target_confidence=0.95,
        )  # fmt: skip
    assert (task.stop, task.early_stop, task.temperature, task.priority) == (
        ["\n\n"],
        False,
        1.0,
        0,
    )
    assert task.target_confidence == 0.95


@pytest.mark.parametrize(
    ("kwargs", "env", "fragment"),
    [
        ({"base_url": "localhost:8000"}, {}, "'localhost:8000' (PONDER_URL) is not an http(s) URL"),
        ({}, {"PONDER_URL": "ftp://example.com"}, "'ftp://example.com' (PONDER_URL)"),
        ({"base_url": "http://"}, {}, "is not an http(s) URL"),
        ({"api_key": "clé"}, {}, "the API key (PONDER_API_KEY) must be printable ASCII"),
        ({}, {"PONDER_API_KEY": "pk\nsecond-line"}, "printable ASCII"),
    ],
)
def test_a_client_with_a_bad_url_or_key_is_a_config_error(
    monkeypatch: pytest.MonkeyPatch, kwargs: dict[str, str], env: dict[str, str], fragment: str
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    for cls in (Client, AsyncClient):
        with pytest.raises(ConfigError) as info:
            cls(**kwargs)
        assert fragment in str(info.value)


# --- the blocking client --------------------------------------------------------------
async def test_sync_client(server: LiveServer) -> None:
    transport = DroppingTransport(drops=1, events=3)

    def use() -> None:
        with (
            httpx.Client(transport=transport) as http,
            ponder.Client(server.url, http_client=http) as client,
        ):
            task = client.submit(messages=[{"role": "user", "content": "[[answers: 7, 8, 7]]"}])
            done = client.wait(task.id, timeout=30)  # its stream drops once and resumes
            assert done.status == TaskStatus.done and done.result is not None
            assert done.result.answer == "7"
            events = list(client.events(task.id))
            check_events(events)
            assert list(client.events(task.id, last_event_id=events[-1].id)) == []
            assert client.get(task.id).id == task.id
            assert [t.id for t in client.list().data] == [task.id]
            assert client.tasks() == client.list()  # the CLI's name (`ponder tasks`)
            hanging = client.submit("[[hang]]")
            with pytest.raises(WaitTimeout):
                client.wait(hanging.id, timeout=0.3)
            assert client.cancel(hanging.id).status == TaskStatus.cancelled
            with pytest.raises(ConflictError):
                client.cancel(task.id)
            with pytest.raises(NotFoundError):
                client.get("1764412800123-nope-1")

    await asyncio.to_thread(use)
    streams = transport.event_requests()
    assert len(streams) >= 2 and "last-event-id" in streams[1].headers


def test_top_level_exports() -> None:
    assert ponder.Client is Client and ponder.AsyncClient is AsyncClient
    assert {"Client", "AsyncClient"} <= set(ponder.__all__)
    with pytest.raises(AttributeError):
        _ = ponder.NoSuchThing  # type: ignore[attr-defined]


SUBMIT_PARAMETERS = {
    "prompt": None, "messages": None, "model": None, "mode": None, "task_type": "auto",
    "priority": 3, "callback_url": None, "samples": None, "max_new_tokens": None,
    "temperature": None, "timeout_s": None, "queue_timeout_s": None, "tests": None,
    "stop": None, "early_stop": None,
    "target_confidence": None, "max_samples": None, "max_total_tokens": None,
    "metadata": None, "response_format": None, "idempotency_key": None,
}  # fmt: skip


def test_both_clients_have_the_same_methods_and_signatures() -> None:
    """One core under two clients: the same parameters and defaults; the async one's
    methods are coroutine functions (``events``: an async generator)."""
    methods = ("submit", "get", "cancel", "list", "tasks", "events", "wait", "close")
    for name in methods:
        blocking, coroutine = getattr(Client, name), getattr(AsyncClient, name)
        parameters = inspect.signature(blocking).parameters
        assert parameters == inspect.signature(coroutine).parameters, name
        assert not inspect.iscoroutinefunction(blocking), name
        is_async = inspect.iscoroutinefunction(coroutine) or inspect.isasyncgenfunction(coroutine)
        assert is_async, name
    submit = inspect.signature(Client.submit).parameters
    assert {n: p.default for n, p in submit.items() if n != "self"} == SUBMIT_PARAMETERS
    assert [n for n, p in submit.items() if p.kind is p.KEYWORD_ONLY] == list(SUBMIT_PARAMETERS)[1:]
    assert typing.get_type_hints(AsyncClient.submit)["return"] is Task
    assert "InvalidRequestError" in (inspect.getdoc(AsyncClient.submit) or "")
    assert TaskEvent.__module__ == NotFoundError.__module__ == "ponder.client"


MODELS = """
[models.small]
engine = "scripted"

[models.big]
engine = "scripted"
"""


async def test_submit_to_a_model_and_an_expired_task_ends_the_wait(tmp_path: Path) -> None:
    """``model`` and ``queue_timeout_s`` reach the task; an unknown model is
    ``NotFoundError`` (``model_not_found``) and creates nothing; ``expired`` is an end
    that ``wait`` and ``events`` stop on."""
    (tmp_path / "models.toml").write_text(MODELS)
    settings = make_settings(
        sqlite_path=str(tmp_path / "ponder.db"), models_file=str(tmp_path / "models.toml")
    )
    async with LiveServer(settings, workers=0) as live, AsyncClient(live.url) as client:
        task = await client.submit("2 + 2?", model="big-deep", queue_timeout_s=5)
        assert (task.model, task.mode, task.queue_timeout_s) == ("big", "deep", 5)
        assert (await client.submit("2 + 2?")).model == "small"
        with pytest.raises(NotFoundError) as unknown:
            await client.submit("2 + 2?", model="huge")
        assert unknown.value.code == "model_not_found" and "`huge`" in unknown.value.message
        assert len((await client.list()).data) == 2
        async with open_store(settings) as store:  # as the expiry sweeper writes it
            stored = await store.get_task(task.id)
            assert stored is not None
            stored.status, stored.finished_at = TaskStatus.expired, utcnow()
            assert await store.update_task(stored, [("status", {"status": "expired"})])
        ended = await asyncio.wait_for(client.wait(task.id, timeout=10), 15)
        assert ended.status == TaskStatus.expired
        events = [e async for e in client.events(task.id, timeout=10)]
        assert events[-1].is_final and events[-1].status == TaskStatus.expired
