"""The worker against both real stores and the scripted engine (continuous batching, and
the static batcher where a test says so)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from ponder.admission import build_task, cancel_task
from ponder.batcher import DynamicBatcher
from ponder.config import Settings, load_settings
from ponder.engines.base import SampleOutput, SampleRequest
from ponder.engines.scripted import ScriptedEngine
from ponder.ids import IdGenerator
from ponder.schemas import TaskCreate
from ponder.states import is_terminal
from ponder.store import create_store
from ponder.store.base import Admission, TaskStore
from ponder.types import SampleStatus, Task, TaskStatus
from ponder.worker import SampleRunner, Worker
from tests.conftest import until


class RecordingEngine(ScriptedEngine):
    """The scripted engine, remembering every request it was given."""

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings)
        self.requests: list[SampleRequest] = []
        self.arrived = asyncio.Event()

    async def submit(self, request: SampleRequest) -> SampleOutput:
        self.requests.append(request)
        self.arrived.set()
        return await super().submit(request)


@dataclass
class Harness:
    settings: Settings
    store: TaskStore
    engine: RecordingEngine
    runner: SampleRunner
    ids: IdGenerator = field(default_factory=lambda: IdGenerator("t1"))
    workers: list[tuple[Worker, asyncio.Task[None]]] = field(default_factory=list)

    def start_worker(self, **overrides: Any) -> Worker:
        settings = self.settings.model_copy(update=overrides) if overrides else self.settings
        worker = Worker(self.store, self.runner, settings, worker_id=f"w{len(self.workers)}")
        self.workers.append((worker, asyncio.create_task(worker.run())))
        return worker

    async def submit(self, prompt: str, **fields: Any) -> Task:
        req = TaskCreate(prompt=prompt, **fields)
        task = build_task(req, self.settings, task_id=self.ids.new_id(), owner="")
        stored, _ = await self.store.create_task(
            task, Admission(max_pending=self.settings.max_pending)
        )
        return stored

    async def wait(self, task_id: str, timeout_s: float = 10.0) -> Task:
        """Wait on the task's event log (no polling) until it is terminal."""
        after: str | None = None
        async with asyncio.timeout(timeout_s):
            while True:
                task = await self.store.get_task(task_id)
                assert task is not None
                if is_terminal(task.status):
                    return task
                events = await self.store.read_events(task_id, after, block_ms=500)
                if events:
                    after = events[-1].id

    async def stop(self) -> None:
        for worker, _ in self.workers:
            worker.stop()
        await asyncio.gather(*(job for _, job in self.workers))


@pytest.fixture
async def make_harness(settings: Settings) -> AsyncIterator[Callable[..., Any]]:
    made: list[Harness] = []

    async def make(**overrides: Any) -> Harness:
        s = load_settings(**{**settings.model_dump(), **overrides})
        store = create_store(s)
        await store.start()
        engine = RecordingEngine(s)
        await engine.start()
        runner: SampleRunner = engine
        if s.batching == "static":
            runner = DynamicBatcher.from_settings(engine, s)
            await runner.start()
        harness = Harness(s, store, engine, runner)
        made.append(harness)
        return harness

    yield make
    for h in made:
        await h.stop()
        if isinstance(h.runner, DynamicBatcher):
            await h.runner.close()
        await h.engine.close()
        await h.store.close()


@pytest.fixture
async def h(make_harness: Callable[..., Any]) -> Harness:
    harness: Harness = await make_harness()
    return harness


async def test_standard_task_is_voted(h: Harness) -> None:
    h.start_worker()
    task = await h.submit("What is 6*7? [[answers: 42, 17, 42]]")
    done = await h.wait(task.id)
    assert done.status == TaskStatus.done
    assert done.task_type == "math"  # auto, inferred from the prompt
    assert done.samples_planned == 3 and done.samples_done == 3 and done.samples_used == 3
    assert done.result is not None
    assert done.result.answer == "42"
    assert done.result.votes == {"42": 2, "17": 1}
    assert done.result.agreement == pytest.approx(2 / 3, abs=1e-3)
    assert done.result.chosen_sample in (0, 2)
    assert done.usage.completion_tokens > 0
    assert done.started_at is not None and done.finished_at is not None
    assert len({s.seed for s in done.samples}) == 3
    assert all(s.confidence is not None and 0 <= s.confidence <= 1 for s in done.samples)


async def test_early_stop_skips_samples_once_decided(h: Harness) -> None:
    h.start_worker()
    task = await h.submit("What is 6*7? [[answers: 42, 42, 17]]")
    done = await h.wait(task.id)
    assert done.status == TaskStatus.done
    assert [s.status for s in done.samples] == ["done", "done", "skipped"]
    assert done.samples_used == 2
    assert done.result is not None and done.result.votes == {"42": 2}
    assert sorted(r.sample_index for r in h.engine.requests) == [0, 1]


async def test_without_early_stop_every_sample_runs(make_harness: Callable[..., Any]) -> None:
    h: Harness = await make_harness(modes={"standard": {"early_stop": False}})
    h.start_worker()
    task = await h.submit("What is 6*7? [[answers: 42, 42, 17]]")
    done = await h.wait(task.id)
    assert done.samples_used == 3
    assert done.result is not None and done.result.votes == {"42": 2, "17": 1}


async def test_deep_mode_is_progressive_and_multi_path(h: Harness) -> None:
    h.start_worker()
    task = await h.submit("How many legs do 3 cats have? [[answers: 12, 12, 12, 12, 12]]",
                          mode="deep", priority=4)  # fmt: skip
    done = await h.wait(task.id)
    assert done.status == TaskStatus.done
    assert {s.path for s in done.samples} == {"cot", "decompose", "pot"}
    assert done.preliminary is not None and done.preliminary.answer == "12"
    assert done.result is not None and done.result.answer == "12"
    first = [r for r in h.engine.requests if r.sample_index == 0]
    assert first and first[0].priority == 2  # promoted by two levels
    events = await h.store.read_events(task.id, None, limit=100)
    names = [e.event for e in events]
    assert names.index("preliminary") < names.index("result")
    assert done.result.clarification is None


async def test_deep_mode_disagreement_asks_a_question(h: Harness) -> None:
    h.start_worker()
    task = await h.submit("Which one? [[answers: 1, 2, 3, 4, 5]]", mode="deep", task_type="text")
    done = await h.wait(task.id)
    assert done.status == TaskStatus.done
    assert done.result is not None and done.result.clarification


async def test_engine_error_fails_the_task(h: Harness) -> None:
    h.start_worker()
    task = await h.submit("[[fail]]", mode="fast")
    failed = await h.wait(task.id)
    assert failed.status == TaskStatus.failed
    assert failed.error is not None and failed.error.code == "engine_error"
    assert failed.samples[0].status == SampleStatus.error


async def test_some_failed_samples_give_partial_done(h: Harness) -> None:
    h.start_worker()
    task = await h.submit("[[answers: 42, fail, 42]]")
    ended = await h.wait(task.id)
    assert ended.status == TaskStatus.partial_done
    assert ended.samples_used == 3
    assert ended.result is not None and ended.result.answer == "42"
    assert [s.status for s in ended.samples].count(SampleStatus.error) == 1


async def test_sample_timeout_is_partial(make_harness: Callable[..., Any]) -> None:
    h: Harness = await make_harness(modes={"standard": {"sample_timeout_s": 0.3}})
    h.start_worker()
    task = await h.submit("[[answers: 7, hang, 7]]", early_stop=False)
    ended = await h.wait(task.id)
    assert ended.status == TaskStatus.partial_done
    assert [s.status for s in ended.samples] == [
        SampleStatus.done,
        SampleStatus.timeout,
        SampleStatus.done,
    ]
    assert ended.samples[1].finish_reason == "timeout"  # the engine ended the row itself


async def test_a_hanging_sample_does_not_hold_its_task(h: Harness) -> None:
    """Without early stopping, the task deadline (3 s) ends the hanging sample, and the
    other two, which ended at once, give the answer."""
    h.start_worker()
    task = await h.submit("[[answers: 5, hang, 5]]", mode="standard", timeout_s=3, early_stop=False)
    ended = await h.wait(task.id)
    assert ended.status == TaskStatus.partial_done
    assert ended.result is not None and ended.result.answer == "5"
    statuses = [s.status for s in ended.samples]
    assert statuses.count(SampleStatus.done) == 2 and statuses[1] == SampleStatus.timeout
    done_ms = [s.latency_ms or 0 for s in ended.samples if s.status == SampleStatus.done]
    assert max(done_ms) < 2000  # they did not wait for the hanging one


async def test_a_hanging_first_wave_sample_does_not_hold_the_second_wave(h: Harness) -> None:
    """With early stopping (standard's default), the first wave is samples 0 and 1; the
    hanging sample 1 does not keep sample 2 from starting, and once 0 and 2 agree the
    vote is decided: the hanging sample is stopped (skipped) and the task is done."""
    h.start_worker()
    task = await h.submit("[[answers: 5, hang, 5]]", mode="standard", timeout_s=3)
    ended = await h.wait(task.id)
    assert ended.status == TaskStatus.done
    assert ended.result is not None and ended.result.answer == "5"
    statuses = [s.status for s in ended.samples]
    assert statuses == [SampleStatus.done, SampleStatus.skipped, SampleStatus.done]
    assert ended.finished_at is not None and ended.started_at is not None
    assert (ended.finished_at - ended.started_at).total_seconds() < 2


async def test_a_timed_out_sample_keeps_its_text_so_far(make_harness: Callable[..., Any]) -> None:
    h: Harness = await make_harness(
        scripted_step_ms=[20, 0], modes={"fast": {"sample_timeout_s": 0.4}}
    )
    h.start_worker()
    task = await h.submit("[[tokens: 500]]", mode="fast", max_new_tokens=1000)
    ended = await h.wait(task.id)
    assert ended.status == TaskStatus.failed and ended.error is not None
    assert ended.error.code == "timeout"
    (sample,) = ended.samples
    assert sample.status == SampleStatus.timeout and sample.answer is None  # not voted
    assert sample.text and sample.text.startswith("Let me work")
    assert 0 < sample.tokens.completion < 500
    assert ended.usage.completion_tokens == sample.tokens.completion


async def test_the_task_deadline_keeps_running_samples_text(
    make_harness: Callable[..., Any],
) -> None:
    h: Harness = await make_harness(scripted_step_ms=[5, 0])
    h.start_worker()
    task = await h.submit("[[tokens: 2000]]", mode="fast", timeout_s=0.5, max_new_tokens=2000)
    ended = await h.wait(task.id)
    (sample,) = ended.samples
    assert sample.status == SampleStatus.timeout and sample.finish_reason == "cancelled"
    assert sample.text and sample.tokens.completion > 0
    # a vote the deadline ended: partial, its result says so, every token counted
    prompt = "What is 6*7? [[answers: 42]] [[tokens: 10, 2000, 2000]]"
    ended = await h.wait((await h.submit(prompt, timeout_s=0.5, max_new_tokens=2000)).id)
    assert ended.status == TaskStatus.partial_done
    assert [s.status for s in ended.samples] == ["done", "timeout", "timeout"]
    assert ended.result is not None and ended.result.stop_reason == "deadline"
    assert ended.usage.completion_tokens == sum(s.tokens.completion for s in ended.samples) > 10


async def test_static_batching_still_runs_tasks(make_harness: Callable[..., Any]) -> None:
    h: Harness = await make_harness(batching="static", batch_max_size=4)
    h.start_worker()
    tasks = [await h.submit(f"q{i} [[answers: {i}]]", mode="fast") for i in range(6)]
    for i, t in enumerate(tasks):
        ended = await h.wait(t.id)
        assert ended.status == TaskStatus.done and ended.result is not None
        assert ended.result.answer == str(i)


async def test_deadline_with_nothing_finished_fails_with_timeout(h: Harness) -> None:
    h.start_worker()
    task = await h.submit("[[hang]]", timeout_s=0.3)
    ended = await h.wait(task.id)
    assert ended.status == TaskStatus.failed
    assert ended.error is not None and ended.error.code == "timeout"


async def test_cancelled_pending_task_never_runs(h: Harness) -> None:
    task = await h.submit("never [[answers: 1]]")
    cancelled = await cancel_task(h.store, task.id, "")
    assert cancelled.status == TaskStatus.cancelled
    h.start_worker()
    marker = await h.submit("marker [[answers: 2]]", mode="fast")
    await h.wait(marker.id)
    assert all(r.task_id != task.id for r in h.engine.requests)
    final = await h.store.get_task(task.id)
    assert final is not None and final.status == TaskStatus.cancelled


async def test_cancel_running_task_stops_engine_work(h: Harness) -> None:
    h.start_worker()
    task = await h.submit("[[hang]]", mode="fast")
    await asyncio.wait_for(h.engine.arrived.wait(), 5)
    (request,) = h.engine.requests
    stopped = asyncio.Event()
    request.on_cancel(stopped.set)
    await cancel_task(h.store, task.id, "")
    await asyncio.wait_for(stopped.wait(), 5)  # the worker noticed and told the engine
    final = await h.store.get_task(task.id)
    assert final is not None and final.status == TaskStatus.cancelled
    assert final.result is None


async def test_reclaimed_task_reruns_only_missing_samples(make_harness: Callable[..., Any]) -> None:
    h: Harness = await make_harness(lease_s=0.2)
    task = await h.submit("[[answers: 5, 6, 5]]")
    # A worker that dies after one sample: it claimed, started and saved one sample.
    claim = await h.store.claim("dead-worker", [0, 1, 2, 3, 4, 5], 100)
    assert claim is not None and claim.task_id == task.id
    started = await h.store.get_task(task.id)
    assert started is not None
    started.status = TaskStatus.running
    started.attempts = 1
    from ponder.types import Sample

    started.samples = [
        Sample(index=i, temperature=0.5, seed=i, status=SampleStatus.queued) for i in range(3)
    ]
    started.samples[0].status = SampleStatus.done
    started.samples[0].text = "The answer is 5."
    started.samples[0].answer = "5"
    assert await h.store.update_task(started)
    h.start_worker()
    ended = await h.wait(task.id)
    assert ended.status == TaskStatus.done
    assert ended.attempts == 2
    assert sorted(r.sample_index for r in h.engine.requests) == [1, 2]


async def test_a_dead_workers_tasks_go_before_new_ones(make_harness: Callable[..., Any]) -> None:
    """A busy worker frees one slot at a time: while a takeover has filled every free
    slot, the next ones go to the rest of it, not to new entries."""
    h: Harness = await make_harness(worker_max_tasks=2)
    orphans = [await h.submit(f"orphan {i} [[sleep_ms: 100]]", mode="fast") for i in range(6)]
    for _ in orphans:  # claimed by a worker that died before it started them
        assert await h.store.claim("dead-worker", [0, 1, 2, 3, 4, 5], 0) is not None
    fresh = [await h.submit(f"new {i} [[sleep_ms: 100]]", mode="fast") for i in range(4)]
    h.start_worker()
    for t in orphans + fresh:
        assert (await h.wait(t.id)).status == TaskStatus.done
    order = [r.task_id for r in h.engine.requests]
    assert set(order[:6]) == {t.id for t in orphans}, order


async def test_too_many_attempts_fails(make_harness: Callable[..., Any]) -> None:
    h: Harness = await make_harness(max_deliveries=2)
    task = await h.submit("[[answers: 1]]", mode="fast")
    stored = await h.store.get_task(task.id)
    assert stored is not None
    stored.attempts = 2
    assert await h.store.update_task(stored)
    h.start_worker()
    ended = await h.wait(task.id)
    assert ended.status == TaskStatus.failed
    assert ended.error is not None and ended.error.code == "too_many_attempts"
    assert h.engine.requests == []


async def test_a_failing_row_fails_only_its_task(h: Harness) -> None:
    h.start_worker()
    tasks = [await h.submit(f"ok {i} [[answers: {i}]]", mode="fast") for i in range(5)]
    bad = await h.submit("[[fail]]", mode="fast")
    for t in tasks:
        assert (await h.wait(t.id)).status == TaskStatus.done
    ended = await h.wait(bad.id)
    assert ended.status == TaskStatus.failed


async def test_bounded_tasks_in_flight(make_harness: Callable[..., Any]) -> None:
    h: Harness = await make_harness(worker_max_tasks=2)
    h.start_worker()
    seen: list[int] = []
    running: list[SampleRequest] = []
    original = h.engine.submit

    async def spy(request: SampleRequest) -> SampleOutput:
        running.append(request)
        seen.append(len(running))
        try:
            return await original(request)
        finally:
            running.remove(request)

    h.engine.submit = spy  # type: ignore[method-assign]
    tasks = [await h.submit(f"[[sleep_ms: 30]] {i}", mode="fast") for i in range(6)]
    for t in tasks:
        assert (await h.wait(t.id)).status == TaskStatus.done
    assert seen and max(seen) <= 2


async def test_stop_ends_a_worker_whose_every_slot_runs_a_hanging_task(
    make_harness: Callable[..., Any],
) -> None:
    """stop() while all slots are taken (no claim can start): the run ends after the
    grace period, the hanging task released for another worker, not never."""
    h: Harness = await make_harness(worker_max_tasks=1, shutdown_grace_s=0.3)
    worker = h.start_worker()
    task = await h.submit("[[hang]]", mode="fast")
    async with asyncio.timeout(5):
        await h.engine.arrived.wait()
    worker.stop()
    async with asyncio.timeout(5):
        await h.workers[0][1]
    assert worker.in_flight == 0
    h.engine.arrived.clear()
    h.start_worker()  # released, not lost: the next worker runs it again at once
    async with asyncio.timeout(5):
        await h.engine.arrived.wait()
    assert len(h.engine.requests) == 2
    stored = await h.store.get_task(task.id)
    assert stored is not None and stored.attempts == 2


@pytest.mark.parametrize("settings", ["redis"], indirect=True)  # levels are Redis streams
async def test_entries_of_two_levels_with_one_id_both_run(make_harness: Callable[..., Any]) -> None:
    """Each priority level is a stream of its own, so entries added in the same
    millisecond to two levels have the same id: both run at once, neither waits a lease."""
    import redis.asyncio as aioredis

    h: Harness = await make_harness(lease_s=60.0)
    r = aioredis.Redis.from_url(h.settings.redis_url or "")
    try:
        tasks: list[Task] = []
        for _ in range(50):  # until two levels hold one id (at most a few rounds)
            tasks += await asyncio.gather(
                *(h.submit(f"[[answers: {p}]]", mode="fast", priority=p) for p in range(6))
            )
            queues = [f"{h.settings.key_prefix}:q:{p}" for p in range(6)]
            ids = [entry[0] for q in queues for entry in await r.xrange(q)]
            if len(set(ids)) < len(ids):
                break
        else:
            pytest.fail("no two levels got an entry with the same id")
    finally:
        await r.aclose()
    h.start_worker()
    for t in tasks:
        assert (await h.wait(t.id, timeout_s=10)).status == TaskStatus.done


async def test_two_workers_share_the_queue(h: Harness) -> None:
    h.start_worker()
    h.start_worker()
    tasks = [await h.submit(f"q{i} [[sleep_ms: 5]]", mode="fast") for i in range(20)]
    for t in tasks:
        assert (await h.wait(t.id)).status == TaskStatus.done
    counted = [r.task_id for r in h.engine.requests]
    assert sorted(counted) == sorted(t.id for t in tasks)  # each sample computed once


async def test_request_can_turn_early_stop_off(h: Harness) -> None:
    h.start_worker()
    task = await h.submit("What is 6*7? [[answers: 42, 42, 17]]", early_stop=False)
    done = await h.wait(task.id)
    assert done.samples_used == 3 and done.early_stop is False


async def test_stop_sequences_reach_the_engine(h: Harness) -> None:
    h.start_worker()
    task = await h.submit("[[answers: 1]]", mode="fast", stop=["\n\n", "Q:"])
    await h.wait(task.id)
    assert h.engine.requests[0].stop == ["\n\n", "Q:"]


# --- the worker drives the mode's Strategy (issue 12) -------------------------------------


async def test_the_request_target_confidence_reaches_the_stop_rule(h: Harness) -> None:
    """Eight planned, three in flight: three agreeing answers give the leader 15/16 by the
    Beta rule — enough for a 0.9 target, not for 0.99."""
    h.start_worker()
    prompt = "What is 6*7? [[answers: 42]]"
    loose = await h.wait((await h.submit(prompt, samples=8, target_confidence=0.9)).id)
    assert loose.samples_used == 3
    assert loose.result is not None and loose.result.samples_saved == 5
    assert loose.result.tokens_saved > 0
    strict = await h.wait((await h.submit(prompt, samples=8, target_confidence=0.99)).id)
    assert strict.samples_used > 3
    assert strict.samples[0].temperature == 0.0  # the greedy sample first


async def test_standard_mode_gives_anytime_answers(h: Harness) -> None:
    h.start_worker()
    task = await h.submit("Pick one [[answers: 4, 5, 5]]", early_stop=False)
    done = await h.wait(task.id)
    events = await h.store.read_events(task.id, None, limit=100)
    names = [e.event for e in events]
    assert "preliminary" in names and names.index("preliminary") < names.index("result")
    assert done.preliminary is not None


async def test_the_clarification_is_a_question_and_its_tokens_count(h: Harness) -> None:
    h.start_worker()
    task = await h.submit("Which one? [[answers: 1, 2, 3, 4, 5]]", mode="deep", task_type="text")
    done = await h.wait(task.id)
    assert done.result is not None and done.result.clarification is not None
    assert done.result.clarification.endswith("?")
    assert "The answer is" not in done.result.clarification
    sample_tokens = sum(s.tokens.completion for s in done.samples)
    assert done.usage.completion_tokens > sample_tokens  # the question's tokens


async def test_samples_that_state_no_answer_do_not_make_agreement(h: Harness) -> None:
    h.start_worker()
    task = await h.submit("Say something [[answers: nothing here, nothing here]]",
                          task_type="math", samples=2)  # fmt: skip
    done = await h.wait(task.id)
    assert done.result is not None and done.result.answer is None
    assert done.result.agreement == 0.0 and done.result.confidence == 0.0


async def test_auto_mode_ends_at_stage_one_when_the_greedy_answer_is_sure(h: Harness) -> None:
    h.start_worker()
    task = await h.submit("What is 6*7? [[answers: 42, 17]]", mode="auto",
                          target_confidence=0.01, priority=2)  # fmt: skip
    done = await h.wait(task.id)
    assert done.status == TaskStatus.done
    assert [s.status for s in done.samples] == ["done"] + ["skipped"] * 4
    assert done.result is not None and done.result.answer == "42"
    assert (done.result.stage, done.result.escalations) == (1, [])
    assert done.result.stop_reason == "confident" and done.result.samples_saved == 4
    assert [(r.sample_index, r.priority) for r in h.engine.requests] == [(0, 2)]
    events = [e.event for e in await h.store.read_events(task.id, None, limit=100)]
    assert events.index("preliminary") < events.index("result")


async def test_auto_mode_escalates_stage_by_stage(h: Harness) -> None:
    """A target no answer reaches: one sample at a time, stage 1, then stage 2, then deep's
    plan until a sample breaks the tie (the mode's vote target, 0.5), the escalations one
    priority level below the task's, with a preliminary answer after each stage."""
    h.start_worker()
    task = await h.submit("What is 6*7? [[answers: 42, 17, 42, 9, 9]]", mode="auto",
                          target_confidence=1.0, priority=2)  # fmt: skip
    done = await h.wait(task.id)
    assert done.status == TaskStatus.done
    assert [s.path for s in done.samples] == ["cot", "pot", "decompose", "cot", "pot"]
    assert done.result is not None and done.result.answer == "42"
    assert done.result.stage == 3
    assert done.result.escalations == ["second_path", "deep_plan"]
    assert done.result.stop_reason == "confident"
    # one at a time, in the plan's order, until "42" led 2 to 1
    assert [(r.sample_index, r.priority) for r in h.engine.requests] == [(0, 2), (1, 3), (2, 3)]
    assert [s.status for s in done.samples] == ["done"] * 3 + ["skipped"] * 2
    events = await h.store.read_events(task.id, None, limit=200)
    stages = [e.data["stage"] for e in events if e.event == "preliminary"]
    assert stages == [1, 2, 3]


async def test_a_token_budget_ends_sampling_with_the_best_answer(h: Harness) -> None:
    h.start_worker()
    prompt = "What is 6*7? [[answers: 42, 17, 17]] [[tokens: 20]]"
    task = await h.submit(prompt, samples=3, max_total_tokens=30)
    done = await h.wait(task.id)
    assert done.status == TaskStatus.done
    # sample 0 ran alone (it reserved the whole budget), sample 1 got the 10 tokens left
    assert done.usage.completion_tokens == 30
    assert [r.max_new_tokens for r in h.engine.requests] == [30, 10]
    assert [s.status for s in done.samples] == ["done", "done", "skipped"]
    assert done.samples[1].finish_reason == "length"
    assert done.result is not None and done.result.stop_reason == "budget"
    assert done.result.answer == "42"
    # a budget below max_new_tokens caps the sample itself
    tight = await h.wait((await h.submit(prompt, mode="fast", max_total_tokens=5)).id)
    assert tight.usage.completion_tokens == 5 and tight.samples[0].finish_reason == "length"
    assert [r.max_new_tokens for r in h.engine.requests][-1] == 5


async def test_a_sample_budget_ends_an_open_vote_as_budget(h: Harness) -> None:
    h.start_worker()
    task = await h.submit("What is 6*7? [[answers: 42, 17, 9]]", mode="auto",
                          target_confidence=1.0, max_samples=2)  # fmt: skip
    done = await h.wait(task.id)
    assert done.samples_planned == 2 and done.samples_used == 2
    assert done.result is not None and done.result.stop_reason == "budget"
    assert done.result.stage == 2


async def test_a_cancelled_task_counts_the_tokens_it_generated(
    make_harness: Callable[..., Any],
) -> None:
    """OpenAI's semantics: a cancelled task's usage holds what its running sample wrote."""
    h: Harness = await make_harness(scripted_step_ms=[5.0, 0.0])
    h.start_worker()
    task = await h.submit("What is 6*7? [[tokens: 2000]]", mode="fast")
    await until(lambda: h.engine.stats.tokens >= 10, 10, "the sample writing")
    await cancel_task(h.store, task.id, "")

    async def usage_kept() -> Task | None:
        final = await h.store.get_task(task.id)
        return final if final is not None and final.usage.completion_tokens >= 10 else None

    final = await until(usage_kept, 10, "the cancelled task's usage")
    assert final.status == TaskStatus.cancelled and final.result is None
    (sample,) = final.samples
    assert sample.tokens.completion == final.usage.completion_tokens
    assert sample.text is not None and len(sample.text.split()) == sample.tokens.completion


async def test_samples_stopped_by_the_early_stop_count_their_tokens(
    make_harness: Callable[..., Any],
) -> None:
    """Two agreeing samples stop the vote while the third, slower one writes: it is
    skipped, its text so far kept and its tokens counted in the usage."""
    h: Harness = await make_harness(scripted_step_ms=[2.0, 0.0])
    h.start_worker()
    prompt = "What is 6*7? [[answers: 42]] [[tokens: 20, 20, 2000]]"
    done = await h.wait((await h.submit(prompt, samples=5)).id)
    assert [s.status for s in done.samples] == ["done", "done", "skipped", "skipped", "skipped"]
    stopped = done.samples[2]
    assert 20 <= stopped.tokens.completion < 2000 and stopped.text and stopped.answer is None
    assert done.usage.completion_tokens == 40 + stopped.tokens.completion
    assert done.result is not None and done.result.stop_reason == "confident"
    assert done.result.votes == {"42": 2}
