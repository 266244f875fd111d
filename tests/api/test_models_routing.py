"""Routing by ``model`` on every way in (issue #45): a models file of two scripted models,
``small`` (the default) and ``big``. The task API, chat completions and Responses (the
official OpenAI SDK) and a Batch line put the model on the task; an unknown model is 404
``model_not_found`` and creates nothing; ``GET /v1/models`` lists each model and its mode
variants with whether a live worker serves it."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from openai import AsyncOpenAI
from openai.types.chat import ChatCompletionMessageParam

from ponder.config import Settings
from ponder.ids import IdGenerator, sort_key
from ponder.openai.batch_feeder import BatchFeeder
from ponder.openai.batches import KIND, new_batch
from ponder.openai.files import FileStore, file_id_of
from ponder.store import TaskStore
from ponder.store.base import StoredObject
from ponder.store.records import ModelState
from ponder.types import Mode
from ponder.worker.expiry import ExpirySweeper
from tests.api.sdk import fast_settings
from tests.conftest import LiveServer, make_settings, open_store

pytestmark = pytest.mark.timeout(60)

MODELS = """
[models.small]
engine = "scripted"

[models.big]
engine = "scripted"
queue_timeout_s = 30
"""
NAMES = [
    *(["ponder", *(f"ponder-{m}" for m in Mode)]),
    *(["small", *(f"small-{m}" for m in Mode)]),
    *(["big", *(f"big-{m}" for m in Mode)]),
    "gpt-4o",
]
ASK: list[ChatCompletionMessageParam] = [
    {"role": "user", "content": "What is 6 * 7? [[answers: 42]]"}
]


@pytest.fixture
def two_models(store_keys: dict[str, object], tmp_path: Path) -> Settings:
    """Settings with the models file of ``small`` and ``big`` (an alias gpt-4o → big-deep),
    once per store."""
    path = tmp_path / "models.toml"
    path.write_text(MODELS)
    settings = make_settings(
        models_file=str(path), model_aliases={"gpt-4o": "big-deep"}, **store_keys
    )
    return fast_settings(settings)


@pytest.fixture
async def api(two_models: Settings) -> AsyncIterator[LiveServer]:
    """The API alone (no worker): tasks stay pending, which is all routing needs."""
    async with LiveServer(two_models, workers=0) as live:
        yield live


@pytest.fixture
async def http(api: LiveServer) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=api.url, timeout=10) as c:
        yield c


@pytest.fixture
async def sdk(api: LiveServer) -> AsyncIterator[AsyncOpenAI]:
    async with AsyncOpenAI(base_url=f"{api.url}/v1", api_key="x", max_retries=0) as c:
        yield c


async def task_count(http: httpx.AsyncClient) -> int:
    return len((await http.get("/v1/tasks", params={"limit": 100})).json()["data"])


async def task_of(http: httpx.AsyncClient, task_id: str) -> dict[str, Any]:
    response = await http.get(f"/v1/tasks/{task_id}")
    assert response.status_code == 200, response.text
    task: dict[str, Any] = response.json()
    return task


# --- the task API ---------------------------------------------------------------------
@pytest.mark.parametrize(
    ("body", "model", "mode", "queue_timeout_s"),
    [
        ({}, "small", "standard", None),  # the default model: the file's first
        ({"model": "big"}, "big", "standard", 30.0),  # the model's queue_timeout_s
        ({"model": "big-deep"}, "big", "deep", 30.0),  # the name's mode
        ({"model": "big-deep", "mode": "fast"}, "big", "fast", 30.0),  # the field wins
        ({"model": "ponder-fast"}, "small", "fast", None),  # ponder*: the default model
        ({"model": "gpt-4o", "queue_timeout_s": 2.5}, "big", "deep", 2.5),  # an alias
    ],
)
async def test_the_task_api_puts_the_model_on_the_task(
    http: httpx.AsyncClient,
    body: dict[str, Any],
    model: str,
    mode: str,
    queue_timeout_s: float | None,
) -> None:
    response = await http.post("/v1/tasks", json={"prompt": "2 + 2?", **body})
    assert response.status_code == 202, response.text
    created = response.json()
    assert (created["model"], created["mode"]) == (model, mode)
    assert created["queue_timeout_s"] == queue_timeout_s
    stored = await task_of(http, created["id"])
    assert (stored["model"], stored["mode"], stored["queue_timeout_s"]) == (
        model,
        mode,
        queue_timeout_s,
    )


async def test_the_task_api_refuses_an_unknown_model_and_creates_nothing(
    http: httpx.AsyncClient,
) -> None:
    before = await task_count(http)
    for name in ("gpt-17", "big-turbo", "-fast", "BIG"):
        response = await http.post("/v1/tasks", json={"prompt": "2 + 2?", "model": name})
        assert response.status_code == 404, response.text
        error = response.json()["error"]
        assert error["code"] == "model_not_found"
        assert f"`{name}`" in error["message"] and "small, big" in error["message"]
    bad = await http.post("/v1/tasks", json={"prompt": "2 + 2?", "queue_timeout_s": 0})
    assert bad.status_code == 422 and "queue_timeout_s" in bad.json()["error"]["message"]
    assert await task_count(http) == before


# --- the OpenAI routes, through the official SDK ---------------------------------------
async def test_chat_completions_route_by_model(sdk: AsyncOpenAI, http: httpx.AsyncClient) -> None:
    """The stream's first chunk names the task (``chatcmpl-<task id>``): the task is on
    the model asked for, in the mode its name selects; the chunk names the name asked."""
    for name, model, mode in (("big-fast", "big", "fast"), ("small", "small", "standard"),
                              ("gpt-4o", "big", "deep")):  # fmt: skip
        stream = await sdk.chat.completions.create(
            model=name, messages=ASK, stream=True, extra_body={"queue_timeout_s": 5}
        )
        async with stream:
            first = await anext(aiter(stream))
        assert first.model == ("big-deep" if name == "gpt-4o" else name)
        task = await task_of(http, first.id.removeprefix("chatcmpl-"))
        assert (task["model"], task["mode"], task["queue_timeout_s"]) == (model, mode, 5.0)


async def test_responses_route_by_model(sdk: AsyncOpenAI, http: httpx.AsyncClient) -> None:
    response = await sdk.responses.create(model="big-deep", input="2 + 2?", background=True)
    assert response.status == "queued" and response.model == "big-deep"
    task = await task_of(http, response.id.removeprefix("resp_"))
    assert (task["model"], task["mode"]) == ("big", "deep")


async def test_the_openai_routes_refuse_an_unknown_model_and_create_nothing(
    sdk: AsyncOpenAI, http: httpx.AsyncClient
) -> None:
    before = await task_count(http)
    with pytest.raises(openai.NotFoundError) as chat:
        await sdk.chat.completions.create(model="big-turbo", messages=ASK)
    body: Any = chat.value.body
    assert body["code"] == "model_not_found" and body["param"] == "model"
    assert body["type"] == "invalid_request_error" and "`big-turbo`" in body["message"]
    with pytest.raises(openai.NotFoundError) as responses:
        await sdk.responses.create(model="gpt-17", input="x", background=True)
    assert responses.value.code == "model_not_found"
    assert await task_count(http) == before


# --- GET /v1/models -------------------------------------------------------------------
def ponder_of(model: Any) -> dict[str, Any]:
    extra: dict[str, Any] = (model.model_extra or {})["ponder"]
    return extra


async def test_models_lists_each_model_its_variants_and_whether_it_is_served(
    sdk: AsyncOpenAI, api: LiveServer, two_models: Settings
) -> None:
    listed = [m async for m in sdk.models.list()]
    assert [m.id for m in listed] == NAMES
    by_id = {m.id: ponder_of(m) for m in listed}
    assert by_id["ponder"]["model"] == "small" and by_id["ponder-deep"]["mode"] == "deep"
    assert by_id["big-fast"] == {"model": "big", "mode": "fast", "engine": "scripted",
                                 "served": False, "state": None, "resident_mb": None}  # fmt: skip
    assert by_id["gpt-4o"]["model"] == "big" and by_id["gpt-4o"]["mode"] == "deep"
    # a worker that serves big (loaded) registers: big is served, small still is not
    async with open_store(two_models) as store:
        await store.register_worker(
            "test1-big-w0", 30, [ModelState("big", "test1-big-w0", "loaded", 512.0)]
        )
    served = {m.id: ponder_of(m) async for m in sdk.models.list()}
    assert served["big"]["served"] and served["big-deep"]["state"] == "loaded"
    assert served["big"]["resident_mb"] == 512.0
    assert not served["small"]["served"] and not served["ponder"]["served"]
    one = await sdk.models.retrieve("big-auto")
    assert one.id == "big-auto" and ponder_of(one)["mode"] == "auto"
    assert ponder_of(one)["served"] and ponder_of(one)["state"] == "loaded"
    with pytest.raises(openai.NotFoundError) as unknown:
        await sdk.models.retrieve("big-turbo")
    assert unknown.value.code == "model_not_found"


# --- a Batch line ---------------------------------------------------------------------
_ids = IdGenerator("test1")
CHAT = "/v1/chat/completions"


async def chat_batch(store: TaskStore, settings: Settings, models: list[str]) -> StoredObject:
    """A chat batch whose line ``i`` asks ``models[i]``."""
    lines = [
        json.dumps({"custom_id": f"c{i}", "method": "POST", "url": CHAT,
                    "body": {"model": name, "messages": ASK}})
        for i, name in enumerate(models)
    ]  # fmt: skip
    raw = _ids.new_id()
    await FileStore(store, settings).create(
        file_id=file_id_of(raw), raw_id=raw, owner="k", filename="in.jsonl", purpose="batch",
        content="\n".join(lines) + "\n",
    )  # fmt: skip
    batch_raw = _ids.new_id()
    data = new_batch(f"batch_{batch_raw}", input_file_id=file_id_of(raw), endpoint=CHAT,
                     window="24h", metadata=None, webhook_url=None)  # fmt: skip
    obj = StoredObject(KIND, f"batch_{batch_raw}", "k", sort_key(batch_raw), data, active=True)
    assert await store.create_object(obj, ttl_s=600)
    return obj


async def test_a_batch_line_runs_on_its_model(two_models: Settings) -> None:
    async with open_store(two_models) as store:
        obj = await chat_batch(store, two_models, ["big-deep", "gpt-17", "small"])
        feeder = BatchFeeder(store, two_models, holder="f")
        await feeder.tick()  # validates
        await feeder.tick()  # admits the lines: the unknown model's is an error line
        stored = await store.get_object(KIND, obj.id)
        assert stored is not None
        in_flight = stored.data["state"]["in_flight"]
        assert sorted(in_flight) == ["0", "2"]  # line 1 created nothing
        tasks = await store.get_tasks([in_flight["0"], in_flight["2"]])
        assert [(t.model, t.mode) for t in tasks if t is not None] == [
            ("big", "deep"),
            ("small", "standard"),
        ]
        tasks_of_k, _ = await store.list_tasks("k", status=None, limit=10, cursor=None)
        assert len(tasks_of_k) == 2
        kept = json.dumps(await store.get_parts(obj.id))
        assert "model_not_found" in kept and "body.model" in kept


# --- end to end -----------------------------------------------------------------------
async def test_each_model_answers_on_its_own_queue(two_models: Settings) -> None:
    """``ponder serve`` with the models file: a worker loop per model; a chat completion
    on each model is answered, and its task names the model that ran it."""
    async with (
        LiveServer(two_models, workers=1) as live,
        AsyncOpenAI(base_url=f"{live.url}/v1", api_key="x", max_retries=0) as sdk,
        httpx.AsyncClient(base_url=live.url, timeout=10) as http,
    ):
        for name, model in (("small", "small"), ("big-fast", "big")):
            completion = await sdk.chat.completions.create(model=name, messages=ASK)
            assert completion.model == name
            assert completion.choices[0].message.content is not None
            task_id = completion.id.removeprefix("chatcmpl-")
            task = await task_of(http, task_id)
            assert task["status"] == "done" and task["model"] == model
            assert {s["model"] for s in task["samples"]} <= {model, None}


async def test_a_chat_completion_whose_task_expires(two_models: Settings) -> None:
    """A task not started within its ``queue_timeout_s`` never runs: the chat completion
    answers 503 ``queue_timeout`` (not retried), streamed or not. No worker runs here, only
    the sweeper that every worker process runs (a worker could claim the task within its
    deadline, however short)."""
    async with (
        LiveServer(two_models, workers=0) as live,
        AsyncOpenAI(base_url=f"{live.url}/v1", api_key="x") as sdk,  # the SDK's retries on
        httpx.AsyncClient(base_url=live.url, timeout=10) as http,
    ):
        sweeper = ExpirySweeper(live.app.state.ponder.store, every_s=0.05)  # the API's store
        await sweeper.start()
        try:
            late = {"queue_timeout_s": 0.1}
            with pytest.raises(openai.InternalServerError) as expired:
                await sdk.chat.completions.create(model="big", messages=ASK, extra_body=late)
            assert expired.value.status_code == 503 and expired.value.code == "queue_timeout"
            assert "expired" in expired.value.message
            (task,) = (await http.get("/v1/tasks")).json()["data"]  # one task: not retried
            assert (task["status"], task["model"], task["samples_used"]) == ("expired", "big", 0)
            body = {"model": "small", "messages": ASK, "stream": True, **late}
            async with http.stream("POST", "/v1/chat/completions", json=body) as stream:
                lines = [line async for line in stream.aiter_lines() if line.startswith("data:")]
        finally:
            await sweeper.stop()
        role, error = (json.loads(line.removeprefix("data: ")) for line in lines)
        assert role["model"] == "small" and error["error"]["code"] == "queue_timeout"
