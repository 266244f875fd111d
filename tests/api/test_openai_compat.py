"""The OpenAI-compatible endpoints, driven by the official ``openai`` SDK."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx
import openai
import pytest
from openai import AsyncOpenAI, OpenAI

from ponder.config import Settings
from ponder.types import Mode
from tests.api.test_events import read_stream
from tests.conftest import LiveServer

pytestmark = pytest.mark.timeout(60)

USER = "user"


@pytest.fixture
async def sdk(server: LiveServer) -> AsyncIterator[AsyncOpenAI]:
    async with AsyncOpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0) as c:
        yield c


def ask(text: str) -> list[Any]:
    return [{"role": "system", "content": "Be brief."}, {"role": USER, "content": text}]


def extra(obj: Any) -> dict[str, Any]:
    """The ``ponder`` field the SDK keeps among a model's extra fields."""
    ponder: dict[str, Any] = (obj.model_extra or {})["ponder"]
    return ponder


async def test_chat_completion(sdk: AsyncOpenAI, client: httpx.AsyncClient) -> None:
    completion = await sdk.chat.completions.create(
        model="ponder", messages=ask("What is 6 * 7? [[answers: 42, 41, 42]]")
    )
    assert completion.object == "chat.completion"
    assert completion.model == "ponder"
    assert len(completion.choices) == 1
    choice = completion.choices[0]
    assert choice.index == 0 and choice.finish_reason == "stop"
    assert choice.message.role == "assistant"
    assert choice.message.content is not None and "42" in choice.message.content
    assert completion.usage is not None
    assert completion.usage.total_tokens == (
        completion.usage.prompt_tokens + completion.usage.completion_tokens
    )
    assert completion.usage.completion_tokens > 0
    ponder = extra(completion)
    assert ponder["answer"] == "42" and ponder["votes"] == {"42": 2, "41": 1}
    assert completion.id == f"chatcmpl-{ponder['task_id']}"
    task = (await client.get(f"/v1/tasks/{ponder['task_id']}")).json()
    assert task["status"] == "done" and task["mode"] == "standard"
    assert task["messages"][1] == {
        "role": "user",
        "content": "What is 6 * 7? [[answers: 42, 41, 42]]",
    }


async def test_n_and_deep_mode(sdk: AsyncOpenAI, client: httpx.AsyncClient) -> None:
    completion = await sdk.chat.completions.create(
        model="ponder",
        messages=ask("[[answers: 5, 6, 5, 5, 7]]"),
        n=3,
        temperature=0.7,
        max_tokens=64,
        extra_body={"mode": "deep"},
    )
    assert completion.model == "ponder"
    assert [c.index for c in completion.choices] == [0, 1, 2]
    ponder = extra(completion)
    assert completion.choices[0].message.content == ponder["text"]
    assert ponder["answer"] == "5"
    task = (await client.get(f"/v1/tasks/{ponder['task_id']}")).json()
    assert task["mode"] == "deep" and task["max_new_tokens"] == 64
    assert task["temperature"] == 0.7
    assert task["samples_planned"] >= 3
    texts = {c.message.content for c in completion.choices}
    done = {s["text"] for s in task["samples"] if s["status"] == "done"}
    assert texts <= done
    # a model name may pick the mode too
    fast = await sdk.chat.completions.create(model="ponder-fast", messages=ask("[[answers: 1]]"))
    task = (await client.get(f"/v1/tasks/{extra(fast)['task_id']}")).json()
    assert task["mode"] == "fast" and task["samples_planned"] == 1


async def test_auto_mode_and_its_budget_through_the_sdk(
    sdk: AsyncOpenAI, client: httpx.AsyncClient
) -> None:
    """``ponder-auto`` runs the cascade; ``extra_body`` carries the target and the budget,
    and the ``ponder`` field says where the cascade ended."""
    completion = await sdk.chat.completions.create(
        model="ponder-auto",
        messages=ask("[[answers: 5, 6, 5, 5, 5]]"),
        extra_body={"target_confidence": 1.0, "max_samples": 3, "max_total_tokens": 500},
    )
    ponder = extra(completion)
    assert ponder["answer"] == "5" and ponder["stage"] == 3
    assert ponder["escalations"] == ["second_path", "deep_plan"]
    assert ponder["stop_reason"] == "confident"  # the third sample broke the tie
    task = (await client.get(f"/v1/tasks/{ponder['task_id']}")).json()
    assert task["mode"] == "auto" and task["samples_planned"] == 3
    assert (task["max_samples"], task["max_total_tokens"]) == (3, 500)
    # a budget of two samples ends the open vote after stage 2
    cut = await sdk.chat.completions.create(
        model="ponder-auto",
        messages=ask("[[answers: 5, 6, 5]]"),
        extra_body={"target_confidence": 1.0, "max_samples": 2},
    )
    assert (extra(cut)["stage"], extra(cut)["stop_reason"]) == (2, "budget")
    assert task["target_confidence"] == 1.0
    with pytest.raises(openai.UnprocessableEntityError) as info:
        await sdk.chat.completions.create(
            model="ponder-auto", messages=ask("x"), extra_body={"max_total_tokens": 0}
        )
    assert "max_total_tokens" in str(info.value)


async def test_stop_sequences_cut_the_answer(sdk: AsyncOpenAI) -> None:
    completion = await sdk.chat.completions.create(
        model="ponder", messages=ask("[[answers: 9]]"), stop=["step by"], n=1
    )
    assert completion.choices[0].message.content == "Let me work through this "
    assert completion.choices[0].finish_reason == "stop"


async def test_streaming(sdk: AsyncOpenAI) -> None:
    stream = await sdk.chat.completions.create(
        model="ponder",
        messages=ask("[[answers: 8, 8, 3]]"),
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = [chunk async for chunk in stream]
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert len({c.id for c in chunks}) == 1
    with_choices = [c for c in chunks if c.choices]
    assert with_choices[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in with_choices)
    assert text.endswith("The answer is 8.")
    finishes = [c.choices[0].finish_reason for c in with_choices if c.choices[0].finish_reason]
    assert finishes == ["stop"]
    assert extra(with_choices[-1])["answer"] == "8"
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens > 0


async def test_streaming_with_n(sdk: AsyncOpenAI) -> None:
    stream = await sdk.chat.completions.create(
        model="ponder", messages=ask("[[answers: 1, 2, 1]]"), stream=True, n=2
    )
    texts: dict[int, str] = {}
    async for chunk in stream:
        for choice in chunk.choices:
            texts[choice.index] = texts.get(choice.index, "") + (choice.delta.content or "")
    assert sorted(texts) == [0, 1]
    assert texts[0].endswith("The answer is 1.")


async def test_errors_in_openai_shape(sdk: AsyncOpenAI, client: httpx.AsyncClient) -> None:
    with pytest.raises(openai.UnprocessableEntityError) as info:
        await sdk.chat.completions.create(
            model="ponder-fast", messages=ask("x"), n=2
        )  # fast mode runs one sample
    body: Any = info.value.body
    assert body["code"] == "invalid" and body["param"] == "n"
    assert body["type"] == "invalid_request_error" and "n:" in body["message"]
    with pytest.raises(openai.UnprocessableEntityError) as info:
        await sdk.chat.completions.create(model="ponder", messages=[])
    assert info.value.body["param"] == "messages"  # type: ignore[index]
    with pytest.raises(openai.UnprocessableEntityError):
        await sdk.chat.completions.create(model="ponder", messages=ask("x"), temperature=1.9)
    image = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]
    with pytest.raises(openai.UnprocessableEntityError) as info:
        await sdk.chat.completions.create(model="ponder", messages=image)  # type: ignore[arg-type]
    assert "text" in info.value.message
    # content parts of type text are fine
    parts = [{"role": "user", "content": [{"type": "text", "text": "[[answers: 3]]"}]}]
    ok = await sdk.chat.completions.create(model="ponder-fast", messages=parts)  # type: ignore[arg-type]
    assert extra(ok)["answer"] == "3"
    raw = await client.post(
        "/v1/chat/completions", content=b"{nope", headers={"content-type": "application/json"}
    )
    assert raw.status_code == 400 and raw.json()["error"]["type"] == "invalid_request_error"
    assert (await client.get("/v1/tasks")).json()["data"][0]["id"] == extra(ok)["task_id"]


async def test_a_failed_task_is_not_retried_by_the_sdk(
    server: LiveServer, client: httpx.AsyncClient
) -> None:
    async with AsyncOpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=2) as sdk:
        with pytest.raises(openai.InternalServerError) as info:
            await sdk.chat.completions.create(model="ponder", messages=ask("[[fail]]"))
    body: Any = info.value.body
    assert body["type"] == "server_error" and body["code"] == "engine_error"
    assert len((await client.get("/v1/tasks")).json()["data"]) == 1  # no resubmits
    async with AsyncOpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0) as sdk:
        stream = await sdk.chat.completions.create(
            model="ponder", messages=ask("[[fail]]"), stream=True
        )
        with pytest.raises(openai.APIError, match="failed"):
            async for _ in stream:
                pass


async def test_models(sdk: AsyncOpenAI) -> None:
    models = [m.id async for m in sdk.models.list()]
    assert models == ["ponder", *(f"ponder-{mode}" for mode in Mode)]
    assert {"ponder-fast", "ponder-standard", "ponder-deep", "ponder-auto"} <= set(models)
    model = await sdk.models.retrieve("ponder-deep")
    assert model.id == "ponder-deep" and model.object == "model"
    with pytest.raises(openai.NotFoundError) as info:
        await sdk.models.retrieve("gpt-17")
    assert info.value.code == "model_not_found"


async def test_an_unknown_model_is_404_model_not_found(
    sdk: AsyncOpenAI, client: httpx.AsyncClient
) -> None:
    """As OpenAI and vLLM answer: 404 ``model_not_found``, and no task is made."""
    for stream in (False, True):
        with pytest.raises(openai.NotFoundError) as info:
            await sdk.chat.completions.create(
                model="gpt-4o", messages=ask("[[answers: 1]]"), stream=stream
            )
        body: Any = info.value.body
        assert body["code"] == "model_not_found" and body["param"] == "model"
        assert body["type"] == "invalid_request_error"
        assert "gpt-4o" in body["message"] and "PONDER_MODEL_ALIASES" in body["message"]
    with pytest.raises(openai.NotFoundError) as info:
        await sdk.responses.create(model="gpt-4o", input="[[answers: 1]]")
    assert info.value.code == "model_not_found"
    assert (await client.get("/v1/tasks")).json()["data"] == []


async def test_model_aliases(settings: Settings) -> None:
    """PONDER_MODEL_ALIASES: an alias is accepted and listed; the answer names the served
    model, whose mode runs."""
    aliased = settings.model_copy(update={"model_aliases": {"gpt-4o": "ponder-deep"}})
    async with (
        LiveServer(aliased, workers=1) as live,
        AsyncOpenAI(base_url=f"{live.url}/v1", api_key="x", max_retries=0) as sdk,
        httpx.AsyncClient(base_url=live.url) as client,
    ):
        assert [m.id async for m in sdk.models.list()][-1] == "gpt-4o"
        assert (await sdk.models.retrieve("gpt-4o")).id == "gpt-4o"
        completion = await sdk.chat.completions.create(
            model="gpt-4o", messages=ask("[[answers: 5, 5, 5, 5, 5]]")
        )
        assert completion.model == "ponder-deep"
        response = await sdk.responses.create(model="gpt-4o", input="[[answers: 5, 5, 5, 5, 5]]")
        assert response.model == "ponder-deep"
        for task_id in (extra(completion)["task_id"], extra(response)["task_id"]):
            assert (await client.get(f"/v1/tasks/{task_id}")).json()["mode"] == "deep"
        with pytest.raises(openai.NotFoundError):
            await sdk.chat.completions.create(model="gpt-4o-mini", messages=ask("x"))


@pytest.mark.parametrize("stream", [False, True])
async def test_usage_counts_the_prompt_once(
    sdk: AsyncOpenAI, client: httpx.AsyncClient, stream: bool
) -> None:
    """Standard mode with n=3 reads the prompt three times: OpenAI's usage counts it once;
    the completion tokens are every sample's."""
    create: Any = sdk.chat.completions.create
    args = {"model": "ponder", "messages": ask("[[answers: 3, 4, 3]]"), "n": 3}
    if stream:
        stream_options = {"include_usage": True}
        chunks = [c async for c in await create(**args, stream=True, stream_options=stream_options)]
        usage, task_id = chunks[-1].usage, extra(chunks[-2])["task_id"]
    else:
        completion = await create(**args)
        usage, task_id = completion.usage, extra(completion)["task_id"]
    task = (await client.get(f"/v1/tasks/{task_id}")).json()
    prompts = [s["tokens"]["prompt"] for s in task["samples"]]
    assert len(prompts) == 3 and min(prompts) > 0
    assert usage is not None
    assert usage.prompt_tokens == max(prompts) < task["usage"]["prompt_tokens"]
    assert usage.completion_tokens == sum(s["tokens"]["completion"] for s in task["samples"])
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens


async def test_auth(settings: Settings) -> None:
    from ponder.api.deps import key_digest

    secured = settings.model_copy(update={"api_keys": [key_digest("pk_good")]})
    async with LiveServer(secured, workers=1) as live:
        for key, ok in (("pk_good", True), ("pk_bad", False)):
            async with AsyncOpenAI(base_url=f"{live.url}/v1", api_key=key, max_retries=0) as sdk:
                if ok:
                    done = await sdk.chat.completions.create(
                        model="ponder", messages=ask("[[answers: 2]]")
                    )
                    assert extra(done)["answer"] == "2"
                    assert [m.id async for m in sdk.models.list()]
                else:
                    with pytest.raises(openai.AuthenticationError) as info:
                        await sdk.chat.completions.create(model="ponder", messages=ask("x"))
                    assert info.value.body["type"] == "authentication_error"  # type: ignore[index]
                    with pytest.raises(openai.AuthenticationError):
                        await sdk.models.list()


async def test_queue_full_is_retried_after_retry_after(settings: Settings) -> None:
    """A full backlog answers 503 queue_full with Retry-After: the SDK retries it."""
    tiny = settings.model_copy(update={"max_pending": 1})
    async with LiveServer(tiny, workers=0) as live, httpx.AsyncClient(base_url=live.url) as c:
        assert (await c.post("/v1/tasks", json={"prompt": "x"})).status_code == 202
        async with AsyncOpenAI(base_url=f"{live.url}/v1", api_key="x", max_retries=0) as sdk:
            with pytest.raises(openai.InternalServerError) as info:
                await sdk.chat.completions.create(model="ponder", messages=ask("x"))
        assert info.value.status_code == 503
        assert info.value.response.headers["retry-after"] == "1"
        assert info.value.body["code"] == "queue_full"  # type: ignore[index]


async def test_sync_sdk(server: LiveServer) -> None:
    def call() -> Any:
        with OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0) as sdk:
            return sdk.chat.completions.create(model="ponder", messages=ask("[[answers: 11]]"))

    completion = await asyncio.to_thread(call)
    assert extra(completion)["answer"] == "11"


async def test_client_that_leaves_cancels_its_task(
    server: LiveServer, client: httpx.AsyncClient
) -> None:
    body = {"model": "ponder", "messages": ask("[[hang]]")}
    with pytest.raises(httpx.ReadTimeout):
        await client.post("/v1/chat/completions", json=body, timeout=httpx.Timeout(5, read=0.5))
    (task,) = (await client.get("/v1/tasks")).json()["data"]
    events = await read_stream(client, task["id"])  # ends when the task does
    assert events[-1][1:] == ("status", {"status": "cancelled"})
    # the same for a stream the client drops
    async with client.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as r:
        async for line in r.aiter_lines():
            if line.startswith("data:"):
                break  # the role chunk came: leave
    second = (await client.get("/v1/tasks")).json()["data"][0]
    assert second["id"] != task["id"]
    events = await read_stream(client, second["id"])
    assert events[-1][1:] == ("status", {"status": "cancelled"})


async def test_rate_limit_in_openai_shape(settings: Settings) -> None:
    limited = settings.model_copy(update={"rate_limit_per_s": 0.01, "rate_limit_burst": 1})
    async with LiveServer(limited, workers=0) as live:
        async with AsyncOpenAI(base_url=f"{live.url}/v1", api_key="x", max_retries=0) as sdk:
            await sdk.models.list()
            with pytest.raises(openai.RateLimitError) as info:
                await sdk.chat.completions.create(model="ponder", messages=ask("x"))
        body: Any = info.value.body
        assert body["code"] == "rate_limited" and body["type"] == "rate_limit_error"
        assert int(info.value.response.headers["retry-after"]) >= 1


async def test_the_openai_route_keeps_its_own_leniency(
    sdk: AsyncOpenAI, client: httpx.AsyncClient
) -> None:
    """/v1/tasks is strict; the OpenAI route ignores what it does not read, as SDKs expect."""
    completion = await sdk.chat.completions.create(
        model="ponder-fast",
        messages=[{"role": "user", "content": "[[answers: 4]]", "name": "ann"}],
        max_tokens=32,
        user="u-1",
        seed=7,
        extra_body={"logit_bias": {}, "something_new": True},
    )
    assert extra(completion)["answer"] == "4"
    task = (await client.get(f"/v1/tasks/{extra(completion)['task_id']}")).json()
    assert task["messages"][-1] == {"role": "user", "content": "[[answers: 4]]", "name": "ann"}
    assert task["max_new_tokens"] == 32
    # its errors keep OpenAI's shape, with the parameter named
    with pytest.raises(openai.UnprocessableEntityError) as info:
        await sdk.chat.completions.create(model="ponder", messages=ask("x"), temperature=5)
    body: Any = info.value.body
    assert body["type"] == "invalid_request_error" and body["param"] == "temperature"
