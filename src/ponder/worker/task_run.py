"""One task's run: its samples on the engine, the budget, the usage, its end.

A :class:`TaskRun` reads the claimed task, starts it (pending → running), runs its
samples the strategy's wave at a time (each sample one row handed to the engine through a
:class:`SampleRunner`), stops them at the vote's early stop, the token budget or the task
deadline, and writes the end state with the vote's result. Every write is a
compare-and-set on the task's revision: a conflict with a client cancel or a takeover by
another worker abandons the run (:class:`TaskAbandoned`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol, TypeVar

from ponder import metrics
from ponder.config import Settings
from ponder.deltas import DeltaPublisher
from ponder.engines.base import SampleOutput, SampleRequest
from ponder.enhance import escalation
from ponder.enhance.strategy import StopReason, Strategy, create_strategy
from ponder.errors import EngineBusy, EngineDeadError, EngineError, StoreUnavailable
from ponder.states import check_transition, is_terminal
from ponder.store.base import Claim, Liveness, TaskEvents
from ponder.types import (
    EventName,
    Result,
    Sample,
    SampleStatus,
    Task,
    TaskError,
    TaskStatus,
    Tokens,
    utcnow,
)
from ponder.worker.expiry import mark_expired, past_queue_deadline

__all__ = ["BACKOFF_MAX_S", "SampleRunner", "TaskAbandoned", "TaskRun"]

_R = TypeVar("_R")

log = logging.getLogger("ponder.worker")

#: the longest wait between retries (the engine's full queue, the store's outages)
BACKOFF_MAX_S = 2.0
#: compare-and-set retries of one task write when only webhook records changed under it
_SAVE_RETRIES = 5
#: after a task's deadline (or the early stop), how long its stopped samples get to return
#: their text so far
_DEADLINE_GRACE_S = 2.0


class SampleRunner(Protocol):
    """What the worker needs from the engine (or the static batcher): run one row."""

    async def submit(self, request: SampleRequest) -> SampleOutput: ...


class RunStore(TaskEvents, Liveness, Protocol):
    """A task run's store: the task's record and log, the workers' model states."""


class TaskAbandoned(Exception):
    """The task was cancelled, or taken over by another worker, while this one ran it."""


class TaskRun:
    """Runs one claimed task to an end state.

    ``runner`` runs its samples' rows; ``followed``: a client follows the task's text
    already (its deltas are written from the start).
    """

    def __init__(
        self,
        store: RunStore,
        runner: SampleRunner,
        settings: Settings,
        claim: Claim,
        *,
        followed: bool = False,
    ) -> None:
        self.store = store
        self.runner = runner
        self.settings = settings
        self.claim = claim
        self.task: Task
        self._stored: tuple[TaskStatus, int] = (TaskStatus.pending, 0)
        #: the engine rows of the running samples, by sample index
        self._rows: dict[int, SampleRequest] = {}
        self._deadline_passed = False
        self.strategy: Strategy
        #: tokens spent outside the samples (the clarifying question)
        self._extra = Tokens()
        #: the running samples' max_new_tokens, by index (what the token budget reserves)
        self._reserved: dict[int, int] = {}
        #: the samples not started yet, in plan order (:meth:`_run_samples`)
        self._queued: list[Sample] = []
        #: why sampling ended (Result.stop_reason)
        self._stop_reason: StopReason = "complete"
        #: events of the last sample boundary, written with the task's end (one write less)
        self._last_events: list[tuple[str, dict[str, Any]]] = []
        self._deltas = DeltaPublisher(
            self.store,
            claim.task_id,
            self.settings.delta_interval_ms / 1000,
            followed=followed,
        )
        #: the queue entry was acked with the task's terminal write
        self.acked = False

    def follow(self) -> None:
        """A client follows the task's text: write its deltas (:mod:`ponder.deltas`)."""
        self._deltas.follow()

    async def keep_usage(self) -> None:
        """After a client cancel stopped the run: write the tokens its samples generated
        (and their text so far) into the cancelled task, as OpenAI counts a cancelled
        response's usage. A compare-and-set over the cancel's write; the status stays."""
        task = getattr(self, "task", None)
        if task is None:
            return  # cancelled before the task was read: nothing ran
        self._count()
        mine = {s.index: s for s in task.samples}
        for _ in range(_SAVE_RETRIES):
            fresh = await self.store.get_task(task.id)
            if fresh is None or fresh.status != TaskStatus.cancelled or fresh.usage == task.usage:
                return
            fresh.usage = task.usage.model_copy()
            for sample in fresh.samples:
                ran = mine.get(sample.index)
                if ran is not None and ran.tokens.completion > sample.tokens.completion:
                    sample.tokens, sample.text = ran.tokens, ran.text
            if await self.store.update_task(fresh, []):
                return

    async def run(self) -> bool:
        """Run the task; True when it reached a terminal state (the entry may be acked)."""
        record = self.claim.record  # read with the claim when the store could
        if record is not None:
            task: Task | None = Task.from_storage(record)
        else:
            task = await self.store.get_task(self.claim.task_id)
        if task is None:
            return True
        self.task = task
        self._stored = (task.status, task.attempts)
        if is_terminal(task.status):
            return True  # cancelled while pending, or its worker died before the ack
        try:
            if past_queue_deadline(task):
                await self._expire()
                return True
            calibration = escalation.model_calibration(task, self.settings)
            self.strategy = create_strategy(task, self.settings, calibration=calibration)
            if task.attempts >= self.settings.max_deliveries:
                await self._finish_failed(
                    "too_many_attempts",
                    f"the task was started {task.attempts} times without finishing",
                )
                return True
            await self._start()
            await self._run_samples()
            await self._finish()
        except TaskAbandoned:
            fresh = await self.store.get_task(self.claim.task_id)
            return fresh is None or is_terminal(fresh.status)
        except (asyncio.CancelledError, StoreUnavailable, EngineDeadError):
            raise
        except Exception as e:  # an unexpected bug must still end the task
            log.exception("task %s failed unexpectedly", self.task.id)
            await asyncio.shield(self._finish_failed("internal", f"worker error: {e}"))
        finally:
            await self._deltas.idle()
        return True

    async def _save(
        self, events: Sequence[tuple[str, dict[str, Any]]] = (), *, hand_over: bool = False
    ) -> None:
        """Write the task over the revision last read or written (``hand_over``: and move
        it to its new model's queue, :meth:`_hand_over`).

        A conflict is either a client cancel or a takeover by another worker (the run is
        abandoned), or a webhook delivery recording its attempt on the running task: then
        the stored delivery records are kept and the write is tried again.
        """
        await self._deltas.idle()  # a delta in flight lands before the events below
        # the terminal write and the hand-over also ack the queue entry (a round trip less)
        ack = self.claim if is_terminal(self.task.status) else None

        def write() -> Awaitable[bool]:
            if hand_over:
                return self.store.hand_over(self.task, self.claim, events)
            return self.store.update_task(self.task, events, ack=ack)

        for _ in range(_SAVE_RETRIES):
            if await self._through_outage(write):
                self._stored = (self.task.status, self.task.attempts)
                self.acked = ack is not None or hand_over
                return
            fresh = await self._through_outage(lambda: self.store.get_task(self.task.id))
            if fresh is None or (fresh.status, fresh.attempts) != self._stored:
                raise TaskAbandoned(self.task.id)
            self.task.callback = fresh.callback
            self.task.rev = fresh.rev
        raise TaskAbandoned(self.task.id)

    async def _through_outage(self, call: Callable[[], Awaitable[_R]]) -> _R:
        """Run a store call, retrying with back-off while the store is unreachable, for up
        to one lease (after that another worker may own the task: give it up)."""
        deadline = time.monotonic() + self.settings.lease_s
        delay_s = 0.05
        while True:
            try:
                return await call()
            except StoreUnavailable:
                if time.monotonic() + delay_s > deadline:
                    raise
                log.warning("task %s: store unavailable, retrying the write", self.task.id)
                await asyncio.sleep(delay_s)
                delay_s = min(delay_s * 2, BACKOFF_MAX_S)

    async def _start(self) -> None:
        task = self.task
        if task.status == TaskStatus.pending:
            check_transition(task.status, TaskStatus.running)
            task.status = TaskStatus.running
            task.started_at = utcnow()
        if not self._own():  # a new task, or one an earlier model handed over
            task.task_type = self.strategy.task_type
            task.samples += escalation.plan_on_model(self.strategy, task)
        for sample in self._own():  # a reclaimed task reruns only unfinished samples
            if sample.status != SampleStatus.done:
                sample.status = SampleStatus.queued
        task.attempts += 1
        await self._save([(EventName.status, {"status": task.status.value})])

    def _own(self) -> list[Sample]:
        """The samples of the task's current model: the ones its vote counts."""
        return escalation.own_samples(self.task.samples, self.task.model)

    def _deadline(self) -> float:
        started = self.task.started_at or utcnow()
        elapsed = (utcnow() - started).total_seconds()
        return time.monotonic() + max(0.0, self.task.timeout_s - elapsed)

    async def _run_samples(self) -> None:
        """Run the queued samples, the strategy's wave of them at a time, until they end,
        the vote is decided, the budget is spent or the deadline passes; save after every
        finished sample (the last boundary's events are written with the task's end,
        :meth:`_end`)."""
        task, strategy = self.task, self.strategy
        deadline = self._deadline()
        self._queued = [s for s in task.samples if s.status == SampleStatus.queued]
        jobs: dict[asyncio.Task[None], Sample] = {}
        self._launch(jobs, strategy.wave(self._own()) - self._ran())
        if not jobs:  # a reclaimed task whose first wave had already ended
            self._launch(jobs, strategy.wave(self._own()))
        if not jobs and self._queued:
            self._skip_queued("budget")
        stopped: list[asyncio.Task[None]] = []  # cancelled by the early stop
        try:
            while jobs and (remaining := deadline - time.monotonic()) > 0:
                done, _ = await asyncio.wait(
                    jobs, timeout=remaining, return_when=asyncio.FIRST_COMPLETED
                )
                if not done:
                    break
                await self._boundary(jobs, stopped)
        finally:
            await self._end_jobs(jobs)
            await _settle(stopped)
        for sample in task.samples:  # the task deadline passed before these ended
            if sample.status in (SampleStatus.queued, SampleStatus.running):
                sample.status = SampleStatus.timeout
                sample.error = TaskError(code="timeout", message="the task deadline passed")
                self._stop_reason = "deadline"

    async def _boundary(
        self, jobs: dict[asyncio.Task[None], Sample], stopped: list[asyncio.Task[None]]
    ) -> None:
        """A sample boundary (one or more of ``jobs`` ended): their events, the anytime
        answer, then the stop rule: stop the rest (moved to ``stopped``, their rows return
        their text so far), or start more up to a wave; then save."""
        events = self._collect(jobs)
        events += await self._preliminary()
        check = await self._off_loop(self.strategy.stop)
        if check.stop:
            events += self._collect(jobs)  # samples that ended meanwhile still count
            for job, sample in jobs.items():
                # skipped: the engine stops the row and returns what it wrote, whose
                # tokens count in the usage (a row not yet sent is dropped)
                sample.status = SampleStatus.skipped
                row = self._rows.get(sample.index)
                if row is not None:
                    row.cancel()
                else:
                    job.cancel()
            stopped += jobs
            jobs.clear()
            self._skip_queued(check.reason or "complete")
        else:
            # the vote is open: keep a wave's worth of samples running, so a slow (or
            # hanging) sample does not hold back the next ones
            self._launch(jobs, self.strategy.wave(self._own()) - len(jobs))
            if not jobs and self._queued:
                self._skip_queued("budget")
        self._count()
        if jobs or self._queued:
            await self._save(events)
        else:  # the last boundary: its events go with the end's write
            self._last_events = events

    def _launch(self, jobs: dict[asyncio.Task[None], Sample], count: int) -> None:
        """Start up to ``count`` queued samples (into ``jobs``) while the token budget
        leaves room; each may write at most what is left of it."""
        task = self.task
        for sample in self._queued[: max(0, count)]:
            tokens = self._tokens_left()
            if tokens is not None and tokens < 1:
                break  # the token budget is spent: nothing more starts
            sample.status = SampleStatus.running
            cap = task.max_new_tokens if tokens is None else min(task.max_new_tokens, tokens)
            self._reserved[sample.index] = cap
            jobs[asyncio.create_task(self._run_sample(sample, cap))] = sample
            self._queued.remove(sample)

    def _skip_queued(self, reason: StopReason) -> None:
        """Sampling ends for ``reason``: the samples not started are skipped."""
        for sample in self._queued:
            sample.status = SampleStatus.skipped
        self._queued.clear()
        self._stop_reason = reason

    def _tokens_left(self) -> int | None:
        """Completion tokens the task's ``max_total_tokens`` leaves for a new sample: the
        budget less what every sample and the clarifying question used and what the
        running samples may still use (their ``max_new_tokens``); None without a budget."""
        budget = self.task.max_total_tokens
        if budget is None:
            return None
        used = sum(s.tokens.completion for s in self.task.samples if s.index not in self._reserved)
        return budget - used - sum(self._reserved.values()) - self._extra.completion

    async def _end_jobs(self, jobs: dict[asyncio.Task[None], Sample]) -> None:
        """At the task deadline (or when the run is cancelled: a client cancel, a shutdown),
        stop the running rows and keep what they wrote so far.

        Each row is cancelled on the engine, which returns its text so far at the next step;
        the samples end ``timeout`` with that text (``cancelled`` when the run is), their
        tokens counted. Rows that do not return within a grace period are abandoned.
        """
        if not jobs:
            return
        current = asyncio.current_task()
        self._deadline_passed = current is None or not current.cancelling()
        if self._deadline_passed:
            self._stop_reason = "deadline"
        for sample in jobs.values():
            row = self._rows.get(sample.index)
            if row is not None:
                row.cancel()
        await _settle(list(jobs))

    @staticmethod
    def _collect(jobs: dict[asyncio.Task[None], Sample]) -> list[tuple[str, dict[str, Any]]]:
        """Take the finished sample jobs out of ``jobs``; their ``sample`` events."""
        events: list[tuple[str, dict[str, Any]]] = []
        for job in [j for j in jobs if j.done()]:
            job.result()
            events.append((EventName.sample, jobs.pop(job).model_dump(mode="json")))
        return events

    async def _off_loop(self, fn: Callable[..., _R], *args: Any, **kwargs: Any) -> _R:
        """Run a vote function in a thread, on a snapshot of the samples, when it may
        compare answers: equivalence (math-verify) can take a while and must not block the
        event loop. With fewer than two distinct answers there is nothing to compare, and
        the thread's hand-off would cost more than the call (a fast task's every boundary):
        it runs here, on the samples themselves (nothing changes them during the call)."""
        samples = self._own()
        if len({s.answer for s in samples if s.answer is not None}) < 2:
            return fn(samples, *args, **kwargs)
        snapshot = [s.model_copy() for s in samples]
        return await asyncio.to_thread(fn, snapshot, *args, **kwargs)

    def _ran(self) -> int:
        """Samples already finished (a reclaimed task keeps them) count toward the wave."""
        return sum(s.status != SampleStatus.queued for s in self._own())

    async def _preliminary(self) -> list[tuple[str, dict[str, Any]]]:
        """The strategy's anytime answer, when the leader or its confidence changed."""
        result = await self._off_loop(self.strategy.preliminary)
        if result is None:
            return []
        self.task.preliminary = escalation.mark(result, self.task.samples, self.task.model)
        return [(EventName.preliminary, result.model_dump(mode="json"))]

    async def _run_sample(self, sample: Sample, max_new_tokens: int) -> None:
        task = self.task
        request = SampleRequest(
            messages=self.strategy.messages(sample),
            temperature=sample.temperature,
            max_new_tokens=max_new_tokens,
            stop=task.stop,
            seed=sample.seed,
            sample_index=sample.index,
            priority=self.strategy.priority(sample),
            task_id=task.id,
            timeout_s=task.sample_timeout_s,
            on_text=self._deltas.writer(sample.index),
            stream=self._deltas.followed,
            json_schema=fmt.answer_schema() if (fmt := task.response_format) else None,
            strict=fmt.strict if fmt else False,
        )
        self._rows[sample.index] = request
        started = time.monotonic()
        try:
            output = await self._submit(request)
        except EngineError as e:
            sample.status = SampleStatus.error
            sample.error = TaskError(code="engine_error", message=str(e))
        else:
            self._record(sample, output)
            if sample.status == SampleStatus.skipped:
                pass  # stopped by the early stop: its text and tokens kept, not judged
            elif output.finish_reason == "timeout":
                sample.status = SampleStatus.timeout
                sample.error = TaskError(
                    code="timeout",
                    message=f"the sample ran over {task.sample_timeout_s:g}s on the engine",
                )
            elif output.finish_reason == "cancelled" and self._deadline_passed:
                sample.status = SampleStatus.timeout
                sample.error = TaskError(code="timeout", message="the task deadline passed")
            elif output.finish_reason == "cancelled":
                sample.status = SampleStatus.cancelled
            else:
                await self.strategy.judge(sample)
                sample.status = SampleStatus.done
        finally:
            self._rows.pop(sample.index, None)
            self._reserved.pop(sample.index, None)
            self._deltas.end(sample.index)
        latency = time.monotonic() - started
        sample.latency_ms = round(latency * 1000)
        metrics.SAMPLE_LATENCY.observe(latency)

    @staticmethod
    def _record(sample: Sample, output: SampleOutput) -> None:
        """The engine's output on the sample (a timed-out one keeps its text so far)."""
        sample.text = output.text
        sample.tokens = Tokens(prompt=output.prompt_tokens, completion=output.completion_tokens)
        sample.finish_reason = output.finish_reason
        sample.mean_logprob = output.mean_logprob
        metrics.TOKENS_GENERATED.inc(output.completion_tokens)

    async def _submit(self, request: SampleRequest) -> SampleOutput:
        """Hand one row to the engine, backing off while its queue is full.

        The engine enforces ``request.timeout_s`` from the row's start; the task deadline
        (see :meth:`_run_samples`) bounds the rest. CancelledError cancels the row.
        """
        delay_s = 0.01
        while True:
            try:
                return await self.runner.submit(request)
            except EngineBusy:
                await asyncio.sleep(delay_s)
                delay_s = min(delay_s * 2, BACKOFF_MAX_S)

    def _count(self) -> None:
        task = self.task
        task.samples_done = sum(s.status == SampleStatus.done for s in task.samples)
        task.samples_used = sum(
            s.status in (SampleStatus.done, SampleStatus.error, SampleStatus.timeout)
            for s in task.samples
        )
        task.usage.prompt_tokens = sum(s.tokens.prompt for s in task.samples) + self._extra.prompt
        task.usage.completion_tokens = (
            sum(s.tokens.completion for s in task.samples) + self._extra.completion
        )

    async def _finish(self) -> None:
        task = self.task
        self._count()
        fusion = await self._off_loop(self.strategy.fuse)
        if fusion is None:
            await self._no_answer()
            return
        result = fusion.result
        result.samples_saved, result.tokens_saved = self.strategy.saved(self._own())
        result.stop_reason = self._stop_reason
        to = await self._escalation(result)
        if to is not None:
            await self._hand_over(result, to)
            return
        if fusion.contested:
            if self._last_events:  # the question takes a model call: show the samples first
                await self._save(self._last_events)
                self._last_events = []
            result.clarification = await self._clarify(fusion.contested)
        self._count()
        task.result = escalation.mark(result, task.samples, task.model)
        complete = all(s.status in (SampleStatus.done, SampleStatus.skipped) for s in self._own())
        await self._end(TaskStatus.done if complete else TaskStatus.partial_done)

    async def _no_answer(self) -> None:
        """No sample of the task's model finished: the answer of the model that handed the
        task over stands (the task ends partial_done), else the task fails."""
        task, own = self.task, self._own()
        kept = task.preliminary
        if kept is not None and kept.model not in (None, task.model):
            task.result = kept.model_copy(update={"stop_reason": self._stop_reason})
            await self._end(TaskStatus.partial_done)
        elif all(s.status == SampleStatus.timeout for s in own):
            await self._finish_failed("timeout", "no sample finished before its deadline")
        else:
            errors = [s.error.message for s in own if s.error is not None]
            await self._finish_failed("engine_error", errors[0] if errors else "no sample finished")

    async def _escalation(self, result: Result) -> str | None:
        """The model the task continues on (:mod:`ponder.enhance.escalation`), or None: not
        without budget or time left, nor to a model no live worker serves."""
        tokens = self._tokens_left()
        if (tokens is not None and tokens < 1) or self._deadline() <= time.monotonic():
            return None
        target = self.strategy.target_confidence
        to = escalation.escalation_target(self.task, self.settings, result, target)
        if to is None:
            return None
        states = await self._through_outage(self.store.served_models)
        return to if any(state.model == to for state in states) else None

    async def _hand_over(self, result: Result, to: str) -> None:
        """Escalate (:func:`~ponder.enhance.escalation.escalate`): the task, still running,
        moves to model ``to``'s queue in one atomic write that also acks this claim."""
        came_from = self.task.model
        events = [*self._last_events, *escalation.escalate(self.task, result, to)]
        self._last_events = []
        self._count()
        await self._save(events, hand_over=True)
        metrics.ESCALATIONS.labels(from_model=came_from, to_model=to).inc()
        log.info("task %s escalated from model %s to %s", self.task.id, came_from, to)

    async def _clarify(self, contested: list[str]) -> str:
        """One question that would settle the split: the model's, if it writes one (the
        strategy checks it), else the strategy's template. Its tokens count in usage."""
        request = SampleRequest(
            messages=self.strategy.clarification_messages(contested),
            temperature=0.0,
            max_new_tokens=64,
            priority=self.task.priority,
            task_id=self.task.id,
            timeout_s=self.task.sample_timeout_s,
        )
        try:
            output = await self._submit(request)
        except EngineError:
            return self.strategy.clarification(contested, None)
        self._extra.prompt += output.prompt_tokens
        self._extra.completion += output.completion_tokens
        reply = output.text if output.finish_reason in ("stop", "length") else None
        return self.strategy.clarification(contested, reply)

    async def _expire(self) -> None:
        """The task waited in the queue past its deadline: it ends expired and never runs
        (the write acks the claim)."""
        await self._save(mark_expired(self.task))
        metrics.TASKS_FINISHED.labels(status=TaskStatus.expired.value).inc()

    async def _finish_failed(self, code: str, message: str) -> None:
        self.task.error = TaskError(code=code, message=message)
        await self._end(TaskStatus.failed)

    async def _end(self, status: TaskStatus) -> None:
        task = self.task
        if task.status == TaskStatus.pending:  # e.g. too many attempts before a start
            check_transition(task.status, TaskStatus.running)
            task.status = TaskStatus.running
        check_transition(task.status, status)
        task.status = status
        task.finished_at = utcnow()
        events, self._last_events = self._last_events, []
        await self._save([*events, (EventName.result, task.to_public())])
        metrics.TASKS_FINISHED.labels(status=status.value).inc()


async def _settle(jobs: Sequence[asyncio.Task[None]]) -> None:
    """Wait for sample jobs whose rows were stopped on the engine to return their text so
    far; a job not back within a grace period is cancelled (its text is lost)."""
    if not jobs:
        return
    _, late = await asyncio.wait(jobs, timeout=_DEADLINE_GRACE_S)
    for job in late:
        job.cancel()
    await asyncio.gather(*jobs, return_exceptions=True)
