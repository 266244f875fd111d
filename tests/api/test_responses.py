"""The Responses API, driven by the official ``openai`` SDK against a live server, on
both stores: background mode, polling, cancel, streaming with resume, store, delete,
input items, tenancy and errors."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx
import openai
import pytest
from openai import AsyncOpenAI

from ponder import admission, aio
from ponder.config import Settings
from tests.api.sdk import fast_settings, retrieve_until
from tests.api.test_events import read_stream
from tests.conftest import LiveServer
from tests.test_expiry import worker_side

pytestmark = pytest.mark.timeout(60)

FINAL = ("completed", "failed", "cancelled", "incomplete")


@pytest.fixture
async def sdk(server: LiveServer) -> AsyncIterator[AsyncOpenAI]:
    async with AsyncOpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0) as c:
        yield c


def ponder_of(obj: Any) -> dict[str, Any]:
    ponder: dict[str, Any] = (obj.model_extra or {})["ponder"]
    return ponder


async def poll(sdk: AsyncOpenAI, response_id: str, timeout_s: float = 20) -> Any:
    """What a client of background mode does: retrieve until the status is final."""
    return await retrieve_until(sdk.responses.retrieve, response_id, FINAL, timeout_s, 0.02)


async def test_background_response_is_polled_to_its_fused_answer(
    sdk: AsyncOpenAI, client: httpx.AsyncClient
) -> None:
    created = await sdk.responses.create(
        model="ponder",
        input="What is 6 * 7? [[answers: 42, 41, 42]] [[sleep_ms: 50]]",
        instructions="Be brief.",
        background=True,
        metadata={"user": "42"},
    )
    assert created.status == "queued" and created.background
    assert created.id.startswith("resp_") and created.output == []
    done = await poll(sdk, created.id)
    assert done.status == "completed" and done.error is None
    assert done.output_text.endswith("The answer is 42.")
    assert done.output[0].type == "message" and done.output[0].role == "assistant"
    ponder = ponder_of(done)
    assert ponder["answer"] == "42" and ponder["votes"] == {"42": 2, "41": 1}
    assert done.metadata == {"user": "42"} and done.instructions == "Be brief."
    task = (await client.get(f"/v1/tasks/{ponder['task_id']}")).json()
    assert created.id == f"resp_{task['id']}"
    assert task["messages"][0] == {"role": "system", "content": "Be brief."}
    # usage counts the prompt once (three samples read it) and every sample's output
    assert done.usage is not None
    prompts = [s["tokens"]["prompt"] for s in task["samples"]]
    assert len(prompts) == 3 and min(prompts) > 0
    assert done.usage.input_tokens == max(prompts) < task["usage"]["prompt_tokens"]
    assert done.usage.output_tokens == task["usage"]["completion_tokens"]
    assert done.usage.output_tokens == sum(s["tokens"]["completion"] for s in task["samples"])
    assert done.usage.total_tokens == done.usage.input_tokens + done.usage.output_tokens


async def test_a_background_auto_response_ends_where_its_confidence_allows(
    sdk: AsyncOpenAI, client: httpx.AsyncClient
) -> None:
    created = await sdk.responses.create(
        model="ponder-auto",
        input="What is 6 * 7? [[answers: 42, 41]]",
        background=True,
        extra_body={"target_confidence": 0.01, "max_total_tokens": 400},
    )
    done = await poll(sdk, created.id)
    assert done.status == "completed"
    ponder = ponder_of(done)
    assert ponder["answer"] == "42" and ponder["stage"] == 1 and ponder["escalations"] == []
    assert ponder["stop_reason"] == "confident" and ponder["samples_saved"] == 4
    task = (await client.get(f"/v1/tasks/{ponder['task_id']}")).json()
    assert task["mode"] == "auto" and task["max_total_tokens"] == 400


async def test_without_background_the_call_waits(
    sdk: AsyncOpenAI, client: httpx.AsyncClient
) -> None:
    done = await sdk.responses.create(
        model="ponder-fast",
        input=[
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": [{"type": "output_text", "text": "Hello"}]},
            {"role": "user", "content": [{"type": "input_text", "text": "[[answers: 9]]"}]},
        ],
        temperature=0.2,
        max_output_tokens=40,
        extra_body={"task_type": "math"},
    )
    assert done.status == "completed" and not done.background
    assert done.output_text.endswith("The answer is 9.")
    assert done.temperature == 0.2 and done.max_output_tokens == 40
    task = (await client.get(f"/v1/tasks/{ponder_of(done)['task_id']}")).json()
    assert task["mode"] == "fast" and task["max_new_tokens"] == 40
    assert task["task_type"] == "math"
    assert [m["role"] for m in task["messages"]] == ["user", "assistant", "user"]
    # a failed task is a failed response
    failed = await sdk.responses.create(model="ponder-fast", input="[[fail]]")
    assert failed.status == "failed" and failed.error is not None
    assert failed.error.code == "server_error" and "engine_error" in failed.error.message
    # a partial one is incomplete
    partial = await sdk.responses.create(
        model="ponder", input="[[answers: 3, fail, fail]]", extra_body={"samples": 3}
    )
    assert partial.status == "incomplete" and partial.output_text.endswith("is 3.")
    assert partial.incomplete_details is not None
    assert partial.incomplete_details.reason == "partial_samples"  # type: ignore[comparison-overlap]


async def test_cancel_a_background_response(sdk: AsyncOpenAI, client: httpx.AsyncClient) -> None:
    created = await sdk.responses.create(model="ponder", input="[[hang]]", background=True)
    cancelled = await sdk.responses.cancel(created.id)
    assert cancelled.status == "cancelled" and cancelled.output == []
    assert (await sdk.responses.retrieve(created.id)).status == "cancelled"
    task = (await client.get(f"/v1/tasks/{ponder_of(cancelled)['task_id']}")).json()
    assert task["status"] == "cancelled"
    # cancelling again, or a finished response, returns it as it is
    assert (await sdk.responses.cancel(created.id)).status == "cancelled"
    done = await sdk.responses.create(model="ponder-fast", input="[[answers: 1]]", background=True)
    done = await poll(sdk, done.id)
    assert (await sdk.responses.cancel(done.id)).status == "completed"
    # only background responses can be cancelled, as on OpenAI
    waited = await sdk.responses.create(model="ponder-fast", input="[[answers: 1]]")
    with pytest.raises(openai.BadRequestError):
        await sdk.responses.cancel(waited.id)


async def _events(stream: Any, stop_after: str | None = None) -> list[Any]:
    seen = []
    async for event in stream:
        seen.append(event)
        if event.type == stop_after:
            break
    return seen


async def test_a_stream_cut_midway_resumes_with_starting_after(
    sdk: AsyncOpenAI, client: httpx.AsyncClient
) -> None:
    stream = await sdk.responses.create(
        model="ponder",
        input="[[answers: 5, 5, 6]] [[sleep_ms: 150]]",
        stream=True,
        background=True,
        extra_body={"samples": 3},
    )
    first = await _events(stream, stop_after="ponder.sample")  # cut after the first sample
    await stream.close()
    response_id = first[0].response.id
    assert [e.type for e in first[:3]] == [
        "response.created",
        "response.queued",
        "response.in_progress",
    ]
    last = first[-1].sequence_number
    # a background response goes on without its client
    rest = await _events(
        await sdk.responses.retrieve(response_id, stream=True, starting_after=last)
    )
    numbers = [e.sequence_number for e in first + rest]
    assert numbers == list(range(len(numbers)))  # no gap, no duplicate
    assert rest[-1].type == "response.completed"
    assert rest[-1].response.output_text.endswith("The answer is 5.")
    types = [e.type for e in rest]
    assert types[-7:] == [
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    deltas = "".join(e.delta for e in rest if e.type == "response.output_text.delta")
    assert deltas == rest[-1].response.output_text
    # a replay from the start numbers every event the same way
    replay = await _events(await sdk.responses.retrieve(response_id, stream=True))
    assert [(e.sequence_number, e.type) for e in replay] == [
        (e.sequence_number, e.type) for e in first + rest
    ]
    task = (await client.get(f"/v1/tasks/{ponder_of(rest[-1].response)['task_id']}")).json()
    assert task["status"] == "done"


async def stream_and_leave(client: httpx.AsyncClient, body: dict[str, Any]) -> None:
    """POST a streamed response and leave once its first event (response.created) came."""
    async with client.stream("POST", "/v1/responses", json={**body, "stream": True}) as r:
        async for line in r.aiter_lines():
            if line.startswith("data:"):
                break


async def test_a_foreground_client_that_leaves_cancels_its_response(
    client: httpx.AsyncClient,
) -> None:
    body = {"model": "ponder", "input": "[[hang]]"}
    with pytest.raises(httpx.ReadTimeout):
        await client.post("/v1/responses", json=body, timeout=httpx.Timeout(5, read=0.5))
    await stream_and_leave(client, body)
    tasks = (await client.get("/v1/tasks")).json()["data"]
    assert len(tasks) == 2
    for task in tasks:
        events = await read_stream(client, task["id"])  # ends when the task does
        assert events[-1][1:] == ("status", {"status": "cancelled"})
    # a background stream left midway does not cancel its response
    await stream_and_leave(client, {**body, "background": True})
    (latest, *_) = (await client.get("/v1/tasks")).json()["data"]
    await asyncio.sleep(0.3)
    assert (await client.get(f"/v1/tasks/{latest['id']}")).json()["status"] == "running"
    await client.delete(f"/v1/tasks/{latest['id']}")


async def test_a_stream_left_midway_cancels_its_task_even_when_the_cancel_is_slow(
    client: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stream's clean-up (the task's cancel, a store call) runs to its end, however
    soon a second cancel would come (here: at once), until it is let go."""
    cancel = admission.cancel_task
    started, released = asyncio.Event(), asyncio.Event()

    async def held_cancel(*args: Any) -> Any:
        started.set()
        await released.wait()
        return await cancel(*args)

    monkeypatch.setattr(admission, "cancel_task", held_cancel)
    monkeypatch.setattr(aio, "_RECANCEL_S", 0.0)
    await stream_and_leave(client, {"model": "ponder", "input": "[[hang]]"})
    await asyncio.wait_for(started.wait(), 10)
    released.set()
    (task, *_) = (await client.get("/v1/tasks")).json()["data"]
    events = await read_stream(client, task["id"])  # ends when the task does
    assert events[-1][1:] == ("status", {"status": "cancelled"})


async def test_a_response_not_started_in_time_fails_with_queue_timeout(
    settings: Settings,
) -> None:
    """No worker serves the model: with PONDER_QUEUE_TIMEOUT_S (here 0.3 s) a background
    response ends ``failed`` with ``error.code`` ``queue_timeout`` when it polls, when its
    stream is followed, and a response that waits gets the same; a request's own
    ``queue_timeout_s`` overrides the default."""
    config = fast_settings(settings, queue_timeout_s=0.3)
    async with (
        LiveServer(config, workers=0) as live,
        AsyncOpenAI(base_url=f"{live.url}/v1", api_key="x", max_retries=0) as sdk,
    ):
        created = await sdk.responses.create(model="ponder", input="[[answers: 1]]",
                                             background=True)  # fmt: skip
        assert created.status == "queued" and created.error is None
        stream = await sdk.responses.retrieve(created.id, stream=True)
        async with worker_side(config):
            events = await _events(stream)
            failed = await poll(sdk, created.id)
            own = await sdk.responses.create(
                model="ponder", input="x", background=True, extra_body={"queue_timeout_s": 0.1}
            )
            waited = await sdk.responses.create(model="ponder-fast", input="x")
            own_failed = await poll(sdk, own.id)
    assert failed.status == "failed" and failed.error is not None
    assert failed.error.code == "queue_timeout"  # type: ignore[comparison-overlap]
    assert "0.3s queue_timeout_s" in failed.error.message
    assert failed.output == [] and failed.completed_at is None
    assert failed.usage is not None and failed.usage.output_tokens == 0
    assert ponder_of(failed)["status"] == "expired"
    assert [e.type for e in events] == ["response.created", "response.queued", "response.failed"]
    assert events[-1].response.error.code == "queue_timeout"
    assert events[-1].response.model_dump() == failed.model_dump()
    for response in (waited, own_failed):
        assert response.status == "failed" and response.error is not None
        assert response.error.code == "queue_timeout"  # type: ignore[comparison-overlap]
    assert "0.1s" in own_failed.error.message  # type: ignore[union-attr]


async def test_store_false_and_delete(sdk: AsyncOpenAI, client: httpx.AsyncClient) -> None:
    unstored = await sdk.responses.create(model="ponder-fast", input="[[answers: 2]]", store=False)
    assert unstored.status == "completed" and unstored.store is False
    with pytest.raises(openai.NotFoundError):
        await sdk.responses.retrieve(unstored.id)
    with pytest.raises(openai.UnprocessableEntityError) as info:
        await sdk.responses.create(model="ponder", input="x", store=False, background=True)
    assert info.value.body["param"] == "store"  # type: ignore[index]
    # delete: a running response is cancelled first, then gone
    running = await sdk.responses.create(model="ponder", input="[[hang]]", background=True)
    await sdk.responses.delete(running.id)
    with pytest.raises(openai.NotFoundError):
        await sdk.responses.retrieve(running.id)
    with pytest.raises(openai.NotFoundError):
        await sdk.responses.delete(running.id)
    task_id = running.id.removeprefix("resp_")
    assert (await client.get(f"/v1/tasks/{task_id}")).json()["status"] == "cancelled"


async def test_input_items_are_listed_with_pagination(sdk: AsyncOpenAI) -> None:
    response = await sdk.responses.create(
        model="ponder-fast",
        input=[{"role": "user", "content": f"message {i} [[answers: 1]]"} for i in range(5)],
    )
    page = await sdk.responses.input_items.list(response.id, limit=2)  # newest first
    texts = [item.content[0].text for item in page.data]  # type: ignore[union-attr]
    assert texts == ["message 4 [[answers: 1]]", "message 3 [[answers: 1]]"]
    assert page.has_more
    every = [item async for item in sdk.responses.input_items.list(response.id, limit=2)]
    assert len(every) == 5 and len({i.id for i in every}) == 5
    ascending = await sdk.responses.input_items.list(response.id, order="asc", limit=10)
    assert [i.id for i in ascending.data] == [i.id for i in reversed(every)]
    assert not ascending.has_more


async def test_errors_in_openai_shape(sdk: AsyncOpenAI, client: httpx.AsyncClient) -> None:
    cases: list[tuple[dict[str, Any], str]] = [
        ({"input": "x", "tools": [{"type": "web_search"}]}, "tools"),
        ({"input": "x", "previous_response_id": "resp_1"}, "previous_response_id"),
        ({"input": [{"role": "user", "content": [{"type": "input_image"}]}]}, "input[0].content"),
        ({"input": [{"type": "function_call", "name": "f"}]}, "input[0]"),
        ({"input": "x", "temperature": 3}, "temperature"),
        ({"input": "x", "metadata": {"k": "v" * 600}}, "metadata"),
        ({"input": "x", "model": "ponder-fast", "samples": 2}, "samples"),
        ({"input": []}, "input"),
        ({"input": "x", "model": "gpt-4o"}, "model"),
    ]
    for body, param in cases:
        r = await client.post("/v1/responses", json={"model": "ponder", **body})
        assert r.status_code == (404 if param == "model" else 422), (body, r.text)
        error = r.json()["error"]
        assert error["param"] == param and error["type"] == "invalid_request_error", error
        assert error["message"].startswith(param), error
    r = await client.post(
        "/v1/responses", content=b"{", headers={"content-type": "application/json"}
    )
    assert r.status_code == 400 and r.json()["error"]["code"] == "bad_request"
    for missing in ("resp_nope", "resp_1764412800123-x-1", "1764412800123-x-1"):
        with pytest.raises(openai.NotFoundError):
            await sdk.responses.retrieve(missing)
    r = await client.get("/v1/responses/resp_x?stream=true&starting_after=abc")
    assert r.status_code == 404
    assert (await client.get("/v1/tasks")).json()["data"] == []  # nothing was created


async def test_a_key_sees_only_its_own_responses(settings: Settings) -> None:
    from ponder.api.deps import key_digest

    secured = settings.model_copy(update={"api_keys": [key_digest("a"), key_digest("b")]})
    async with (
        LiveServer(secured, workers=1) as live,
        AsyncOpenAI(base_url=f"{live.url}/v1", api_key="a", max_retries=0) as alice,
        AsyncOpenAI(base_url=f"{live.url}/v1", api_key="b", max_retries=0) as bob,
    ):
        mine = await alice.responses.create(model="ponder", input="[[hang]]", background=True)
        for call in (
            bob.responses.retrieve(mine.id),
            bob.responses.cancel(mine.id),
            bob.responses.delete(mine.id),
            bob.responses.input_items.list(mine.id),
        ):
            with pytest.raises(openai.NotFoundError):
                await call
        assert (await alice.responses.cancel(mine.id)).status == "cancelled"
        async with AsyncOpenAI(base_url=f"{live.url}/v1", api_key="c", max_retries=0) as eve:
            with pytest.raises(openai.AuthenticationError):
                await eve.responses.retrieve(mine.id)


async def test_an_idempotency_key_repeat_is_the_same_response(sdk: AsyncOpenAI) -> None:
    key = {"Idempotency-Key": "order-17"}
    first = await sdk.responses.create(
        model="ponder-fast", input="[[answers: 5]]", background=True, extra_headers=key
    )
    again = await sdk.responses.create(
        model="ponder-fast", input="[[answers: 5]]", background=True, extra_headers=key
    )
    assert again.id == first.id
    items = await sdk.responses.input_items.list(first.id)
    assert [i.id for i in items.data] == [f"msg_{first.id.removeprefix('resp_')}_0"]
    with pytest.raises(openai.ConflictError):
        await sdk.responses.create(model="ponder-fast", input="other", extra_headers=key)


def test_per_token_deltas_map_to_output_text_or_sample_deltas() -> None:
    """The mapping of task events, with the ``delta`` events a streaming engine adds:
    one sample's text is the output; several samples' texts are ponder's own events."""
    from ponder.openai.responses import ResponseEvents
    from ponder.store.base import Event
    from ponder.types import Result, Task, TaskStatus

    meta = {"model": "ponder", "instructions": None, "input": [], "top_p": None,
            "max_output_tokens": None, "metadata": {}, "background": True,
            "store": True}  # fmt: skip
    result = Result(
        answer="4", text="It is 4.", confidence=1, agreement=1, votes={"4": 1}, chosen_sample=0
    )
    log = [
        Event("1", "status", {"status": "pending"}),
        Event("2", "status", {"status": "running"}),
        Event("3", "delta", {"index": 0, "text": "It "}),
        Event("4", "delta", {"index": 0, "text": "is "}),
        Event("5", "result", {}),
    ]
    for planned, delta_type in ((1, "response.output_text.delta"), (3, "ponder.sample.delta")):
        task = Task(id="1764412800123-x-1", samples_planned=planned)
        final = task.model_copy(update={"status": TaskStatus.done, "result": result})
        runs = []
        for _ in range(2):  # a replay maps the log to the same events
            mapper = ResponseEvents(meta, task)
            runs.append([e for ev in log for e in mapper.map(ev, final if ev.id == "5" else None)])
        assert runs[0] == runs[1]
        events = runs[0]
        assert [e["sequence_number"] for e in events] == list(range(len(events)))
        deltas = [e["delta"] for e in events if e["type"] == delta_type]
        assert deltas[:2] == ["It ", "is "]
        text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
        assert text == "It is 4."  # the rest of the answer follows in one delta
        assert events[-1]["type"] == "response.completed"
