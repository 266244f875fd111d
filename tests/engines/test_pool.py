"""Engines loaded on demand (ponder.engines.pool): a model's engine starts on its first
row, rows that come while it loads share that start, it stops after keep_alive_s idle, at
most max_loaded_models local models at once (the least recently used idle one makes room;
a busy one drains), a waiting row ends when its request is cancelled, a failed start fails
the rows that waited for it. Scripted engines, no store."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from ponder.config import Settings
from ponder.config.models import KEEP_LOADED, ModelSpec
from ponder.engines.base import BaseEngine, SampleOutput, SampleRequest
from ponder.engines.pool import EnginePool
from ponder.engines.scripted import ScriptedEngine
from ponder.errors import ConfigError, EngineError
from tests.conftest import make_settings, until

pytestmark = pytest.mark.timeout(30)


class Log:
    """What the engines of a pool did, in order: ("start"|"close", model), and an event
    per model set at each close."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []
        self.closed: dict[str, asyncio.Event] = {}
        self.fail_starts: dict[str, int] = {}

    def starts(self, model: str) -> int:
        return self.events.count(("start", model))

    def closes(self, model: str) -> int:
        return self.events.count(("close", model))

    async def wait_closed(self, model: str, timeout_s: float = 10.0) -> None:
        await asyncio.wait_for(self.closed.setdefault(model, asyncio.Event()).wait(), timeout_s)
        self.closed[model] = asyncio.Event()

    def factory(self, settings: Settings) -> BaseEngine:
        log = self

        class Logged(ScriptedEngine):
            async def start(self) -> None:
                if log.fail_starts.get(self.served_model, 0) > 0:
                    log.fail_starts[self.served_model] -= 1
                    raise ConfigError(f"{self.served_model} refuses to start")
                if self._thread is None:  # submit() calls start() too: count the real one
                    log.events.append(("start", self.served_model))
                await super().start()

            async def close(self) -> None:
                started = self._thread is not None
                await super().close()
                if started:
                    log.events.append(("close", self.served_model))
                    log.closed.setdefault(self.served_model, asyncio.Event()).set()

        return Logged(settings)


def spec(keep_alive_s: float = 60.0) -> ModelSpec:
    return ModelSpec(engine="scripted", keep_alive_s=keep_alive_s)


@pytest.fixture
async def make_pool() -> AsyncIterator[Callable[..., tuple[EnginePool, Log]]]:
    pools: list[EnginePool] = []

    def make(models: dict[str, ModelSpec], **overrides: Any) -> tuple[EnginePool, Log]:
        log = Log()
        pool = EnginePool(make_settings(**overrides), models, factory=log.factory)
        pools.append(pool)
        return pool, log

    yield make
    for pool in pools:
        await pool.close()


def row(prompt: str = "2+2? [[answers: 4]]") -> SampleRequest:
    return SampleRequest(prompt=prompt, max_new_tokens=32)


async def test_an_engine_starts_on_its_first_row_and_stops_when_idle(
    make_pool: Callable[..., tuple[EnginePool, Log]],
) -> None:
    pool, log = make_pool({"a": spec(keep_alive_s=0.3)})
    await pool.start()
    runner = pool.runners["a"]
    assert runner.state == "unloaded" and log.starts("a") == 0  # not at start
    # five first rows at once: one start, every row answered
    outputs = await asyncio.gather(*(runner.submit(row()) for _ in range(5)))
    assert [o.finish_reason for o in outputs] == ["stop"] * 5
    assert "4" in outputs[0].text
    assert log.starts("a") == 1 and pool.loaded() == ["a"] and runner.loads == 1
    idle_since = time.monotonic()
    await log.wait_closed("a")
    assert time.monotonic() - idle_since >= 0.25  # keep_alive_s 0.3 (timer granularity)
    assert runner.state == "unloaded" and runner.load_state() == "unloaded"
    # the next row loads it again
    assert (await runner.submit(row())).finish_reason == "stop"
    assert log.starts("a") == 2 and runner.loads == 2


async def test_a_row_keeps_its_model_loaded_past_keep_alive(
    make_pool: Callable[..., tuple[EnginePool, Log]],
) -> None:
    pool, log = make_pool({"a": spec(keep_alive_s=0.2)})
    await pool.start()
    runner = pool.runners["a"]
    # one row running for 0.6 s: three keep-alives, and the model stays loaded meanwhile
    slow = asyncio.create_task(runner.submit(row("[[sleep_ms: 600]] [[answers: 1]]")))
    await asyncio.wait_for(_until_state(runner, "loaded"), 5)
    done, _ = await asyncio.wait({slow}, timeout=0.45)
    assert not done and log.closes("a") == 0 and runner.state == "loaded"
    assert (await slow).finish_reason == "stop"
    await log.wait_closed("a")  # then idle: unloaded


async def test_the_least_recently_used_idle_model_makes_room(
    make_pool: Callable[..., tuple[EnginePool, Log]],
) -> None:
    pool, log = make_pool({"a": spec(), "b": spec(), "c": spec()}, max_loaded_models=2)
    await pool.start()
    a, b, c = (pool.runners[n] for n in "abc")
    await a.submit(row())
    await b.submit(row())
    await a.submit(row())  # b is now the least recently used
    assert sorted(pool.loaded()) == ["a", "b"]
    await c.submit(row())
    assert sorted(pool.loaded()) == ["a", "c"]
    assert log.events == [("start", "a"), ("start", "b"), ("close", "b"), ("start", "c")]


async def test_a_model_waits_for_the_only_room_while_another_runs(
    make_pool: Callable[..., tuple[EnginePool, Log]],
) -> None:
    pool, log = make_pool({"a": spec(), "b": spec()}, max_loaded_models=1)
    await pool.start()
    a, b = pool.runners["a"], pool.runners["b"]
    ended: list[str] = []

    async def run(runner: Any, prompt: str, name: str) -> SampleOutput:
        output: SampleOutput = await runner.submit(row(prompt))
        ended.append(name)
        return output

    slow = asyncio.create_task(run(a, "[[sleep_ms: 400]] [[answers: 1]]", "a"))
    await asyncio.wait_for(_until_state(a, "loaded"), 5)
    waiting = asyncio.create_task(run(b, "[[answers: 2]]", "b"))
    # b waits: a's row holds the only room, a drains (a new row of a waits behind b)
    await asyncio.wait_for(_until(lambda: a.draining), 5)
    late = asyncio.create_task(run(a, "[[answers: 3]]", "a-late"))
    done, _ = await asyncio.wait({waiting}, timeout=0.1)
    assert not done and b.state == "unloaded"
    assert (await waiting).finish_reason == "stop" and "2" in (await waiting).text
    assert (await late).finish_reason == "stop"
    # a's running row ended, a unloaded, b ran, b made room for a's late row
    assert ended == ["a", "b", "a-late"]
    assert log.events == [
        ("start", "a"), ("close", "a"), ("start", "b"), ("close", "b"), ("start", "a"),
    ]  # fmt: skip
    assert (await slow).finish_reason == "stop"


async def test_a_row_waiting_for_room_ends_when_cancelled(
    make_pool: Callable[..., tuple[EnginePool, Log]],
) -> None:
    pool, log = make_pool({"a": spec(), "b": spec()}, max_loaded_models=1)
    await pool.start()
    a, b = pool.runners["a"], pool.runners["b"]
    hang = row("[[hang]]")
    running = asyncio.create_task(a.submit(hang))
    await asyncio.wait_for(_until_state(a, "loaded"), 5)
    request = row()
    waiting = asyncio.create_task(b.submit(request))
    await asyncio.wait_for(_until(lambda: a.draining), 5)
    request.cancel()  # as the task run does at its deadline
    output = await asyncio.wait_for(waiting, 5)
    assert output.finish_reason == "cancelled" and output.text == ""
    hang.cancel()
    assert (await running).finish_reason == "cancelled"
    # a drained and unloaded for b, which nobody wants any more: nothing loads
    await log.wait_closed("a")
    assert log.starts("b") == 0 and pool.loaded() == []


async def test_a_failed_start_fails_the_rows_that_waited_and_the_next_row_retries(
    make_pool: Callable[..., tuple[EnginePool, Log]],
) -> None:
    pool, log = make_pool({"a": spec()})
    log.fail_starts["a"] = 1
    await pool.start()
    runner = pool.runners["a"]
    results = await asyncio.gather(
        *(runner.submit(row()) for _ in range(3)), return_exceptions=True
    )
    assert all(isinstance(r, EngineError) for r in results), results
    assert "model 'a' could not be loaded: a refuses to start" in str(results[0])
    assert runner.state == "unloaded"
    assert (await runner.submit(row())).finish_reason == "stop"
    assert log.starts("a") == 1


async def test_kept_loaded_models_start_with_the_pool_and_must_fit(
    make_pool: Callable[..., tuple[EnginePool, Log]],
) -> None:
    pool, log = make_pool({"a": spec(KEEP_LOADED), "b": spec()}, max_loaded_models=2)
    await pool.start()
    assert log.events == [("start", "a")] and pool.runners["a"].state == "loaded"
    with pytest.raises(ConfigError, match=r"keep_alive_s -1\): a; PONDER_MAX_LOADED_MODELS=1 "):
        make_pool({"a": spec(KEEP_LOADED), "b": spec()}, max_loaded_models=1)


async def _until_state(runner: Any, state: str) -> None:
    await until(lambda: runner.state == state, 5, f"model {runner.name} {state}", 0.01)


async def _until(check: Callable[[], bool]) -> None:
    await until(check, 5, "the pool's state", 0.01)


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_a_real_engine_reports_its_memory_and_unloading_ends_its_process() -> None:
    """The openvino engine (SmolLM2-135M, one thread) loaded on demand: its engine
    process's resident memory is reported while it is loaded; unloading ends that
    process."""
    from ponder.engines.openvino import OpenVINOEngine

    settings = make_settings(engine="openvino", engine_threads=1)
    pool = EnginePool(
        settings, {"small": ModelSpec(engine="openvino", model="smollm2-135m", keep_alive_s=0.5)}
    )
    try:
        await pool.start()
        runner = pool.runners["small"]
        assert runner.resident_mb() is None and runner.figures()["state"] == "unloaded"
        output = await runner.submit(SampleRequest(prompt="2+2=", max_new_tokens=4))
        assert output.completion_tokens > 0
        engine = runner.engine
        assert isinstance(engine, OpenVINOEngine) and engine.process_pid is not None
        pid = engine.process_pid
        mb = runner.resident_mb()
        assert mb is not None and mb > 50, mb  # the model's weights and the runtime
        assert runner.figures()["resident_mb"] is not None
        await until(lambda: runner.state == "unloaded", 30, "the model unloaded")
        assert not os.path.exists(f"/proc/{pid}")  # ended and reaped  # noqa: ASYNC240
        assert runner.resident_mb() is None and engine.process_pid is None
        assert runner.engine is not engine  # the next load starts a new one
    finally:
        await pool.close()
