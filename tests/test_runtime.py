"""The worker runtime's composition: the static batcher in front of an engine must fit it;
one process serving two models, each on its own engine loaded on demand."""

from __future__ import annotations

from pathlib import Path

import pytest

from ponder.admission import build_task
from ponder.config import Settings, load_settings
from ponder.engines.base import BaseEngine, SampleOutput, SampleRequest
from ponder.engines.scripted import ScriptedEngine
from ponder.errors import ConfigError
from ponder.ids import IdGenerator
from ponder.runtime import WorkerRuntime
from ponder.schemas import TaskCreate
from ponder.store import create_store
from ponder.store.base import Admission, TaskStore
from ponder.types import Task, TaskStatus
from tests.conftest import follow_to_end, open_store, until


def test_static_batches_must_fit_the_engine(tmp_path: Path) -> None:
    def runtime(**overrides: object) -> WorkerRuntime:
        settings = load_settings(
            engine="scripted", batching="static", batch_max_size=8, batch_max_concurrent=3,
            redis_url=None, sqlite_path=str(tmp_path / "ponder.db"), **overrides,
        )  # fmt: skip
        return WorkerRuntime(settings, create_store(settings))

    # 8 x 3 rows at once, an engine that runs 16: one line naming what to change
    with pytest.raises(
        ConfigError, match=r"more than the engine takes \(PONDER_ENGINE_MAX_ROWS 16"
    ):
        runtime(engine_max_rows=16)
    fits = runtime(engine_max_rows=24)
    assert fits.batcher is not None and fits.batcher.max_concurrent_batches == 3


# --- several models in one process (#45) -----------------------------------------------

TWO_MODELS = """
[models.small]
engine = "scripted"
keep_alive_s = {keep_alive_s}

[models.big]
engine = "scripted"
keep_alive_s = {keep_alive_s}
"""


class _Recorded:
    """An engine factory whose scripted engines remember which model ran which task."""

    def __init__(self) -> None:
        self.rows: list[tuple[str, str]] = []  # (served model, task id)

    def __call__(self, settings: Settings) -> BaseEngine:
        rows = self.rows

        class Recording(ScriptedEngine):
            async def submit(self, request: SampleRequest) -> SampleOutput:
                rows.append((self.served_model, request.task_id))
                return await super().submit(request)

        return Recording(settings)


def _two_models(
    settings: Settings, tmp_path: Path, keep_alive_s: float = 0.3, **overrides: object
) -> Settings:
    path = tmp_path / "models.toml"
    path.write_text(TWO_MODELS.format(keep_alive_s=keep_alive_s))
    return load_settings(
        **{**settings.model_dump(), "models_file": str(path), "lease_s": 3.0, **overrides}
    )


_IDS = IdGenerator("t1")


async def _create(
    store: TaskStore, s: Settings, prompt: str, model: str, queue_timeout_s: float | None = None
) -> Task:
    task = build_task(TaskCreate(prompt=prompt), s, task_id=_IDS.new_id(), owner="")
    task = task.model_copy(update={"model": model, "queue_timeout_s": queue_timeout_s})
    stored, _ = await store.create_task(task, Admission(max_pending=s.max_pending))
    return stored


@pytest.mark.timeout(60)
async def test_one_runtime_serves_two_models_each_on_its_own_engine(
    settings: Settings, tmp_path: Path
) -> None:
    s = _two_models(settings, tmp_path, keep_alive_s=1.5)
    recorded = _Recorded()
    async with open_store(s) as store:
        runtime = WorkerRuntime(s, store, factory=recorded)
        assert [w.worker_id for w in runtime.workers] == ["test1-small-w0", "test1-big-w0"]
        await runtime.start()
        try:
            # nothing loaded before a task: every model loads on demand
            assert {r.name: r.state for r in runtime.runners.values()} == {
                "small": "unloaded",
                "big": "unloaded",
            }
            tasks = [
                await _create(store, s, f"[[answers: {n}]] q{n}", model)
                for n, model in enumerate(["small", "big", "small", "big"])
            ]
            for task in tasks:
                done = await follow_to_end(store, task.id)
                assert done.status is TaskStatus.done and done.model == task.model
                assert done.result is not None and done.result.answer is not None
            # each task's rows ran on its own model's engine, and only there
            by_task = {task_id: model for model, task_id in recorded.rows}
            assert by_task == {t.id: t.model for t in tasks}
            # the registrations say which model each worker serves, and that it is loaded
            states = await until(
                lambda: _states(store, "loaded"), 10, "both models registered loaded"
            )
            assert sorted(states) == ["big", "small"]
            # idle for keep_alive_s: both unloaded, and registered so (at once)
            await until(lambda: _states(store, "unloaded"), 10, "both models unloaded")
            assert runtime.pool.loaded() == []
            figures = runtime.engine_figures()
            assert [(m["model"], m["state"]) for m in figures["models"]] == [
                ("small", "unloaded"),
                ("big", "unloaded"),
            ]
            assert figures["tokens"] > 0 and runtime.engine_down() is None
        finally:
            await runtime.stop()


async def _states(store: TaskStore, state: str) -> list[str] | None:
    served = await store.served_models()
    found = [m.model for m in served if m.state == state]
    return found if len(found) == 2 else None


@pytest.mark.timeout(60)
async def test_a_model_waits_for_the_only_loaded_slot_then_runs(
    sqlite_settings: Settings, tmp_path: Path
) -> None:
    """max_loaded_models 1: a task for big, while small's task holds the only room,
    waits (it does not fail) and runs once small has drained and unloaded."""
    s = _two_models(sqlite_settings, tmp_path, max_loaded_models=1)
    recorded = _Recorded()
    async with open_store(s) as store:
        runtime = WorkerRuntime(s, store, factory=recorded)
        await runtime.start()
        try:
            slow = await _create(store, s, "[[sleep_ms: 800]] [[answers: 1]]", "small")
            await until(lambda: runtime.runners["small"].state == "loaded", 10, "small loaded")
            waiting = await _create(store, s, "[[answers: 2]]", "big")
            done_big = await follow_to_end(store, waiting.id)
            done_small = await follow_to_end(store, slow.id)
            assert done_big.status is TaskStatus.done and done_small.status is TaskStatus.done
            assert done_small.finished_at is not None and done_big.started_at is not None
            # big's row ran only after small's ended: one model loaded at a time
            assert [m for m, _ in recorded.rows] == ["small"] * _rows(recorded, "small") + [
                "big"
            ] * _rows(recorded, "big")
            assert runtime.runners["small"].loads == 1 and runtime.runners["big"].loads == 1
        finally:
            await runtime.stop()


def _rows(recorded: _Recorded, model: str) -> int:
    return sum(m == model for m, _ in recorded.rows)


def test_static_batching_serves_one_model(sqlite_settings: Settings, tmp_path: Path) -> None:
    s = _two_models(sqlite_settings, tmp_path, batching="static")
    with pytest.raises(ConfigError, match=r"static batching \(PONDER_BATCHING=static\) serves "):
        WorkerRuntime(s, create_store(s))
    one = WorkerRuntime(s, create_store(s), models=["big"])
    assert one.batcher is not None and list(one.runners) == ["big"]
    assert one.runners["big"].keep_loaded  # the batcher holds its engine


def test_models_must_be_configured(sqlite_settings: Settings, tmp_path: Path) -> None:
    s = _two_models(sqlite_settings, tmp_path)
    with pytest.raises(ConfigError) as e:
        WorkerRuntime(s, create_store(s), models=["big", "huge"])
    assert str(e.value) == ("--models: no model named 'huge'; the configured models are small, big")


@pytest.mark.timeout(120)
async def test_ponder_worker_models_names_configured_models(tmp_path: Path) -> None:
    from tests.test_cli import run_cli

    path = tmp_path / "models.toml"
    path.write_text(TWO_MODELS.format(keep_alive_s=1))
    env = {"PONDER_MODELS_FILE": str(path), "PONDER_REDIS_URL": "redis://127.0.0.1:1/0"}
    code, out, err = await run_cli("worker", "--models", "big,huge", env=env)
    assert code == 2, (out, err)
    assert err.strip() == (
        "error: --models: no model named 'huge'; the configured models are small, big"
    )
    code, _, err = await run_cli("worker", "--models", " , ", env=env)
    assert code == 2 and err.strip() == (
        "error: --models: give model names, comma-separated (small, big)"
    )
    code, out, _ = await run_cli("worker", "--help", env={"COLUMNS": "200"})
    words = " ".join(out.replace("│", " ").split())  # rich's box, wrapped
    assert code == 0 and "--models" in words and "(default: every model of the file)" in words


@pytest.mark.timeout(60)
async def test_a_task_of_a_model_nobody_serves_expires_through_the_runtime(
    settings: Settings, tmp_path: Path
) -> None:
    """The runtime runs the expiry sweeper: a task for `big`, which this process does not
    serve (`ponder worker --models small`), ends expired at its queue deadline and never
    runs; `small`'s task runs."""
    s = _two_models(settings, tmp_path)
    recorded = _Recorded()
    async with open_store(s) as store:
        runtime = WorkerRuntime(s, store, models=["small"], factory=recorded)
        await runtime.start()
        try:
            stranded = await _create(store, s, "[[answers: 1]]", "big")
            expiring = await _create(store, s, "[[answers: 1]]", "big", queue_timeout_s=0.2)
            served = await _create(store, s, "[[answers: 2]]", "small")
            ended = await follow_to_end(store, expiring.id)
            assert ended.status is TaskStatus.expired and ended.started_at is None
            assert ended.error is not None and ended.error.code == "queue_timeout"
            assert (await follow_to_end(store, served.id)).status is TaskStatus.done
            assert [t for _, t in recorded.rows if t == expiring.id] == []
            still = await store.get_task(stranded.id)  # no deadline: left pending
            assert still is not None and still.status is TaskStatus.pending
        finally:
            await runtime.stop()
