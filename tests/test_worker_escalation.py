"""Escalation to a stronger model in auto mode, and the claim-time queue deadline: the
worker's task runs against both real stores, one Worker per model (each with a runner of
its own), the runners scripted per sample."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

from ponder import metrics
from ponder.admission import build_task
from ponder.config import Settings
from ponder.engines.base import SampleOutput, SampleRequest
from ponder.errors import EngineError
from ponder.ids import IdGenerator
from ponder.schemas import TaskCreate
from ponder.states import is_final
from ponder.store.base import Admission, TaskStore
from ponder.types import EventName, SampleStatus, Task, TaskStatus, utcnow
from ponder.worker import Worker
from ponder.worker.task_run import TaskRun
from tests.conftest import follow_to_end, make_settings, open_store

MODELS = """
[models.weak]
engine = "scripted"
escalate_to = "strong"

[models.strong]
engine = "scripted"
{strong}
"""

QUESTION = "What is 17 * 24?"


@dataclass
class Answers:
    """A runner that answers each sample from ``answer(index)`` (None: the sample fails),
    with a fixed mean log-probability; a program-of-thought sample gets a program that
    prints the answer."""

    answer: Callable[[int], str | None]
    mean_logprob: float = -2.0
    requests: list[SampleRequest] = field(default_factory=list)

    async def submit(self, request: SampleRequest) -> SampleOutput:
        self.requests.append(request)
        value = self.answer(request.sample_index or 0)
        if value is None:
            raise EngineError("the model is down")
        system = str((request.messages or [{}])[0].get("content", ""))
        if "Python program" in system:
            text = f"```python\nprint({value})\n```"
        else:
            text = f"17 * 24 is {value}. The answer is {value}."
        return SampleOutput(
            text=text, prompt_tokens=20, completion_tokens=10, mean_logprob=self.mean_logprob
        )


def disagreeing(index: int) -> str:
    return str(100 + index)


def right(index: int) -> str:
    return "408"


def two_models(tmp_path: Path, store_keys: dict[str, object], strong: str = "") -> Settings:
    path = tmp_path / "models.toml"
    path.write_text(MODELS.format(strong=strong), encoding="utf-8")
    return make_settings(models_file=str(path), **store_keys)


@contextlib.asynccontextmanager
async def workers(
    settings: Settings, runners: dict[str, Answers], *, ids: IdGenerator | None = None
) -> AsyncIterator[TaskStore]:
    """The store, with one Worker per model running until the block ends."""
    async with open_store(settings) as store:
        loops = [
            Worker(store, runner, settings, worker_id=f"test1-{model}-w0", model=model)
            for model, runner in runners.items()
        ]
        jobs = [asyncio.create_task(w.run()) for w in loops]
        try:
            yield store
        finally:
            for w in loops:
                w.stop()
            await asyncio.gather(*jobs)


async def submit(store: TaskStore, settings: Settings, model: str, **fields: object) -> Task:
    req = TaskCreate(prompt=QUESTION, mode="auto", **fields)  # type: ignore[arg-type]
    task = build_task(req, settings, task_id=IdGenerator("t1").new_id(), owner="")
    task.model = model
    stored, _ = await store.create_task(task, Admission(max_pending=settings.max_pending))
    return stored


async def test_an_unsure_weak_model_hands_the_task_to_the_strong_one(
    tmp_path: Path, store_keys: dict[str, object]
) -> None:
    settings = two_models(tmp_path, store_keys)
    weak, strong = Answers(disagreeing), Answers(right, mean_logprob=-0.3)
    labels = {"from_model": "weak", "to_model": "strong"}
    before = metrics.REGISTRY.get_sample_value("ponder_escalations_total", labels) or 0
    async with workers(settings, {"weak": weak, "strong": strong}) as store:
        task = await submit(store, settings, "weak")
        done = await follow_to_end(store, task.id, 20)
        events = await store.read_events(task.id, None, limit=1000)
    assert done.status == TaskStatus.done, done.error
    assert metrics.REGISTRY.get_sample_value("ponder_escalations_total", labels) == before + 1
    assert done.model == "strong" and done.result is not None
    assert (done.result.answer, done.result.model, done.result.escalated_to) == (
        "408",
        "strong",
        "strong",
    )
    assert done.result.escalations[:3] == ["second_path", "deep_plan", "escalate_to:strong"]
    # the weak model's five samples stay, marked; the strong model's follow them
    weak_samples = [s for s in done.samples if s.model == "weak"]
    strong_samples = [s for s in done.samples if s.model == "strong"]
    assert len(weak_samples) == 5 and strong_samples
    assert [s.index for s in done.samples] == list(range(len(done.samples)))
    assert all(s.index >= 5 for s in strong_samples)
    ran = {s.index for s in strong_samples if s.status != SampleStatus.skipped}
    assert {r.sample_index for r in strong.requests} == ran
    weak_ran = {s.index for s in weak_samples if s.status != SampleStatus.skipped}
    assert {r.sample_index for r in weak.requests} == weak_ran
    assert len({s.seed for s in done.samples}) == len(done.samples)
    # only the strong model's samples vote; both models' tokens count
    assert sum(done.result.votes.values()) == sum(
        s.status == SampleStatus.done and s.answer is not None for s in strong_samples
    )
    assert done.usage.completion_tokens == 10 * len(weak.requests + strong.requests)
    assert done.attempts == 1  # the hand-over's start is the strong model's first
    # clients following saw the hand-over: the weak answer as a preliminary, then a
    # status event naming the new model; the stream ends with the result
    kinds = [(e.event, e.data) for e in events]
    hand_over = next(
        i for i, (k, d) in enumerate(kinds) if k == EventName.status and d.get("model")
    )
    assert kinds[hand_over][1] == {"status": "running", "model": "strong", "escalated_from": "weak"}
    prelim = kinds[hand_over - 1]
    assert prelim[0] == EventName.preliminary
    assert (prelim[1]["model"], prelim[1]["escalated_to"]) == ("weak", "strong")
    assert is_final(events[-1]) and sum(map(is_final, events)) == 1


async def test_weak_answers_that_agree_do_not_escalate(
    tmp_path: Path, store_keys: dict[str, object]
) -> None:
    """Stage 1 alone is below the target; stage 2's second path agrees, and the fused
    confidence reaches it."""
    settings = two_models(tmp_path, store_keys)
    weak, strong = Answers(right, mean_logprob=-0.5), Answers(right)
    async with workers(settings, {"weak": weak, "strong": strong}) as store:
        task = await submit(store, settings, "weak", target_confidence=0.5)
        done = await follow_to_end(store, task.id, 20)
    assert done.status == TaskStatus.done and done.result is not None
    assert (done.model, done.result.model, done.result.escalated_to) == ("weak", "weak", None)
    assert (done.result.answer, done.result.stage, done.result.votes) == ("408", 2, {"408": 2})
    assert not any(e.startswith("escalate_to:") for e in done.result.escalations)
    assert {s.model for s in done.samples} == {"weak"} and not strong.requests


async def test_escalation_never_loops_back(tmp_path: Path, store_keys: dict[str, object]) -> None:
    """strong names weak again: a task that ran on weak ends on strong, unsure."""
    settings = two_models(tmp_path, store_keys, strong='escalate_to = "weak"')
    weak, strong = Answers(disagreeing), Answers(disagreeing)
    async with workers(settings, {"weak": weak, "strong": strong}) as store:
        task = await submit(store, settings, "weak")
        done = await follow_to_end(store, task.id, 20)
    assert done.status == TaskStatus.done and done.result is not None
    assert (done.model, done.result.model, done.result.escalated_to) == (
        "strong",
        "strong",
        "strong",
    )
    assert len(done.samples) == 10 and done.result.stage == 3
    assert {r.sample_index for r in weak.requests} <= set(range(5))
    assert {r.sample_index for r in strong.requests} <= set(range(5, 10))
    assert done.result.escalations.count("escalate_to:strong") == 1


async def test_the_hand_over_is_no_takeover_against_max_deliveries(
    tmp_path: Path, store_keys: dict[str, object]
) -> None:
    """One start per model allowed: the strong model's start is its first, not a second."""
    settings = two_models(tmp_path, store_keys).model_copy(update={"max_deliveries": 1})
    async with workers(settings, {"weak": Answers(disagreeing), "strong": Answers(right)}) as store:
        task = await submit(store, settings, "weak")
        done = await follow_to_end(store, task.id, 20)
    assert done.status == TaskStatus.done, done.error
    assert done.result is not None and done.result.escalated_to == "strong"


async def test_the_weak_answer_stands_when_the_strong_model_gives_none(
    tmp_path: Path, store_keys: dict[str, object]
) -> None:
    settings = two_models(tmp_path, store_keys)
    runners = {"weak": Answers(disagreeing), "strong": Answers(lambda i: None)}
    async with workers(settings, runners) as store:
        task = await submit(store, settings, "weak")
        done = await follow_to_end(store, task.id, 20)
    assert done.status == TaskStatus.partial_done and done.result is not None
    assert (done.result.model, done.result.escalated_to) == ("weak", "strong")
    assert done.result.answer in {disagreeing(i) for i in range(5)}
    failed = [s for s in done.samples if s.model == "strong"]
    assert failed and all(s.status == SampleStatus.error for s in failed)


async def test_no_escalation_without_budget_left(
    tmp_path: Path, store_keys: dict[str, object]
) -> None:
    settings = two_models(tmp_path, store_keys)
    weak, strong = Answers(disagreeing), Answers(right)
    async with workers(settings, {"weak": weak, "strong": strong}) as store:
        task = await submit(store, settings, "weak", max_total_tokens=30)
        done = await follow_to_end(store, task.id, 20)
    assert done.status == TaskStatus.done and done.result is not None
    assert done.result.escalated_to is None and not strong.requests
    assert done.usage.completion_tokens == 30  # the budget, all spent on the weak model


async def test_no_escalation_to_a_model_no_live_worker_serves(
    tmp_path: Path, store_keys: dict[str, object]
) -> None:
    """Handed over, the task would wait in the strong model's queue for good."""
    settings = two_models(tmp_path, store_keys)
    async with workers(settings, {"weak": Answers(disagreeing)}) as store:
        task = await submit(store, settings, "weak")
        done = await follow_to_end(store, task.id, 20)
    assert done.status == TaskStatus.done and done.result is not None
    assert (done.model, done.result.model, done.result.escalated_to) == ("weak", "weak", None)
    assert done.result.stage == 3


# --- the claim-time queue deadline --------------------------------------------------------
async def claim_and_run(store: TaskStore, settings: Settings, runner: Answers) -> TaskRun:
    claim = await store.claim("test1-weak-w0", [0, 1, 2, 3, 4], 1000, model="weak")
    assert claim is not None
    run = TaskRun(store, runner, settings, claim)
    assert await run.run()
    return run


async def test_a_task_claimed_after_its_queue_deadline_expires_unrun(
    tmp_path: Path, store_keys: dict[str, object]
) -> None:
    settings = two_models(tmp_path, store_keys)
    runner = Answers(right)
    async with open_store(settings) as store:
        req = TaskCreate(prompt=QUESTION, mode="auto")
        task = build_task(req, settings, task_id=IdGenerator("t1").new_id(), owner="")
        task.model, task.queue_timeout_s = "weak", 5.0
        task.created_at = utcnow() - timedelta(seconds=6)
        await store.create_task(task, Admission(max_pending=settings.max_pending))
        run = await claim_and_run(store, settings, runner)
        ended = await store.get_task(task.id)
        events = await store.read_events(task.id, None, limit=100)
        assert await store.pending_count() == 0
        # acked with the write: nothing is left to take over
        assert await store.reclaim("test1-weak-w1", 0.0, model="weak") == []
    assert run.acked and not runner.requests
    assert ended is not None and ended.status == TaskStatus.expired
    assert ended.error is not None and ended.error.code == "queue_timeout"
    assert "5s" in ended.error.message
    assert ended.finished_at is not None and ended.started_at is None and not ended.samples
    assert events[-1].event == EventName.result and is_final(events[-1])
    assert events[-1].data["status"] == "expired"


async def test_a_task_claimed_in_time_runs(tmp_path: Path, store_keys: dict[str, object]) -> None:
    settings = two_models(tmp_path, store_keys)
    runner = Answers(right, mean_logprob=-0.3)
    async with open_store(settings) as store:
        req = TaskCreate(prompt=QUESTION, mode="auto")
        task = build_task(req, settings, task_id=IdGenerator("t1").new_id(), owner="")
        task.model, task.queue_timeout_s = "weak", 60.0
        await store.create_task(task, Admission(max_pending=settings.max_pending))
        await claim_and_run(store, settings, runner)
        ended = await store.get_task(task.id)
    assert ended is not None and ended.status == TaskStatus.done and runner.requests
