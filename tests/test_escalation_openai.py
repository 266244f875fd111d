"""Escalation end to end over HTTP: two OpenAI-compatible stand-ins on loopback (the
chat-completions server of tests/engines/test_openai.py, each over a scripted answerer),
a models file whose ``weak`` model (engine ``openai``) escalates to ``strong``, the
worker runtime serving both (a Worker per model over its own OpenAI engine), both real
stores. The weak server's answers disagree (a different wrong number for every sample
seed); the strong server's are right."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any, cast

import uvicorn

from ponder.admission import build_task
from ponder.config import Settings
from ponder.engines import BaseEngine
from ponder.engines.base import SampleOutput, SampleRequest
from ponder.ids import IdGenerator
from ponder.runtime import WorkerRuntime
from ponder.schemas import TaskCreate
from ponder.store.base import Admission, TaskStore
from ponder.types import SampleStatus, Task, TaskStatus
from tests.conftest import follow_to_end, make_settings, open_store, start_uvicorn
from tests.engines.test_openai import CompatServer

QUESTION = "What is 17 * 24?"

MODELS = """
[models.weak]
engine = "openai"
base_url = "{weak}"
upstream_model = "weak-upstream"
escalate_to = "strong"

[models.strong]
engine = "openai"
base_url = "{strong}"
upstream_model = "strong-upstream"
"""


class Answerer:
    """What the stand-in server runs in place of a model: each request's text from
    ``answer(seed)``, a program printing it where the system prompt asks for one."""

    def __init__(self, answer: Callable[[int], str], mean_logprob: float) -> None:
        self.answer = answer
        self.mean_logprob = mean_logprob
        self.seeds: list[int] = []

    async def generate(self, requests: Sequence[SampleRequest]) -> list[SampleOutput]:
        outputs = []
        for request in requests:
            seed = request.seed or 0
            self.seeds.append(seed)
            value = self.answer(seed)
            system = str((request.messages or [{}])[0].get("content", ""))
            text = (
                f"```python\nprint({value})\n```"
                if "Python program" in system
                else f"17 * 24 is {value}. The answer is {value}."
            )
            outputs.append(SampleOutput(text, 30, 12, "stop", mean_logprob=self.mean_logprob))
        return outputs


def wrong(seed: int) -> str:
    return str(1000 + seed % 99991)  # never 408; two seeds of one task all but never agree


@contextlib.asynccontextmanager
async def stand_in(answerer: Answerer) -> AsyncIterator[str]:
    """An OpenAI-compatible chat-completions server over ``answerer``; its base URL."""
    compat = CompatServer(cast(BaseEngine, answerer))
    config = uvicorn.Config(
        compat.app, host="127.0.0.1", port=0, log_level="warning", lifespan="off", ws="none"
    )
    server = uvicorn.Server(config)
    job, port = await start_uvicorn(server)
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        server.should_exit = True
        await job


@contextlib.asynccontextmanager
async def deployment(
    tmp_path: Path, store_keys: dict[str, object], weak: Answerer, strong: Answerer
) -> AsyncIterator[tuple[Settings, TaskStore, WorkerRuntime]]:
    """Both stand-ins, the models file naming them, and the worker runtime serving both
    models (a Worker per model, each over its model's OpenAI engine)."""
    async with stand_in(weak) as weak_url, stand_in(strong) as strong_url:
        path = tmp_path / "models.toml"
        path.write_text(MODELS.format(weak=weak_url, strong=strong_url), encoding="utf-8")
        settings = make_settings(models_file=str(path), **store_keys)
        async with open_store(settings) as store:
            runtime = WorkerRuntime(settings, store)
            await runtime.start()
            try:
                yield settings, store, runtime
            finally:
                await runtime.stop()


async def submit(store: TaskStore, settings: Settings, **fields: Any) -> Task:
    req = TaskCreate(prompt=QUESTION, mode="auto", **fields)
    task = build_task(req, settings, task_id=IdGenerator("t1").new_id(), owner="")
    task.model = "weak"
    stored, _ = await store.create_task(task, Admission(max_pending=settings.max_pending))
    return stored


async def test_the_weak_server_escalates_to_the_strong_one(
    tmp_path: Path, store_keys: dict[str, object]
) -> None:
    weak, strong = Answerer(wrong, -2.0), Answerer(lambda seed: "408", -0.3)
    async with deployment(tmp_path, store_keys, weak, strong) as (settings, store, runtime):
        assert sorted(w.model for w in runtime.workers) == ["strong", "weak"]
        task = await submit(store, settings)
        done = await follow_to_end(store, task.id, 30)
    assert done.status == TaskStatus.done, done.error
    assert done.result is not None
    assert (done.result.answer, done.result.model, done.result.escalated_to) == (
        "408",
        "strong",
        "strong",
    )
    assert "escalate_to:strong" in done.result.escalations
    ran = [s for s in done.samples if s.status != SampleStatus.skipped]
    assert {s.model for s in ran} == {"weak", "strong"}
    # every sample that ran went to its own model's server, by its seed
    assert sorted(s.seed for s in ran if s.model == "weak") == sorted(weak.seeds)
    assert sorted(s.seed for s in ran if s.model == "strong") == sorted(strong.seeds)
    assert all(s.answer != "408" for s in ran if s.model == "weak")


async def test_agreeing_weak_answers_stay_on_the_weak_server(
    tmp_path: Path, store_keys: dict[str, object]
) -> None:
    weak, strong = Answerer(lambda seed: "408", -0.5), Answerer(lambda seed: "408", -0.3)
    async with deployment(tmp_path, store_keys, weak, strong) as (settings, store, _):
        task = await submit(store, settings, target_confidence=0.5)
        done = await follow_to_end(store, task.id, 30)
    assert done.status == TaskStatus.done and done.result is not None
    assert (done.result.answer, done.result.model, done.result.escalated_to) == (
        "408",
        "weak",
        None,
    )
    assert weak.seeds and not strong.seeds
    assert {s.model for s in done.samples} == {"weak"}
