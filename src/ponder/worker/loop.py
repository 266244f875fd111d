"""The worker loop: claim tasks fairly across priorities, hold their leases, hear notices.

A :class:`Worker` registers, claims queue entries (taking over those of dead or lapsed
workers first), and runs each claimed task in a :class:`~ponder.worker.task_run.TaskRun`
of its own, up to ``worker_max_tasks`` at once. Beside the claim loop it keeps its
registration and its tasks' leases alive (the heartbeat) and listens to the store's
cancel and follow notices, which reach the runs at once. Store outages are waited out.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from ponder import metrics
from ponder.aio import cancel_and_wait
from ponder.config import Settings
from ponder.config.models import DEFAULT_MODEL
from ponder.deltas import FOLLOW_TTL_S
from ponder.errors import EngineDeadError, RecoverableError
from ponder.scheduling import WeightedFairPicker
from ponder.states import is_terminal
from ponder.store.base import Claim, Liveness, ModelState, Notice, TaskQueue
from ponder.worker.task_run import BACKOFF_MAX_S, SampleRunner, TaskRun

__all__ = ["LoadStatus", "Worker"]

log = logging.getLogger("ponder.worker")

_BACKOFF_MIN_S = 0.05
#: longest blocking read of the store's notices (a stop cancels it sooner)
_NOTICE_BLOCK_MS = 5000


@dataclass
class _InFlight:
    """A claimed queue entry and the run of its task."""

    claim: Claim
    job: asyncio.Task[None] | None = None
    #: the run, made when the job starts (a follow notice reaches it here)
    task_run: TaskRun | None = None
    run: asyncio.Task[bool] | None = None
    #: the client cancelled the task (the notice may come before the run has started)
    cancelled: bool = False


class LoadStatus(Protocol):
    """Whether the worker's model is loaded (:class:`ponder.engines.pool.ModelRunner`)."""

    def load_state(self) -> Literal["loaded", "loading", "unloaded"]: ...

    def resident_mb(self) -> float | None: ...

    def changed(self) -> asyncio.Event:
        """An event set at the next change of the load state."""
        ...


class WorkerStore(TaskQueue, Liveness, Protocol):
    """What a worker uses of the store: the queue, the records and events (its task runs'),
    and its registration as a live worker."""


class Worker:
    """Claims and runs one model's tasks until stopped.

    ``model``: the model whose queues it claims from (its runner runs that model's rows);
    ``loads``: where its registration reads the model's load state and resident memory
    (None: a runner that is always loaded, memory not measured).

    ``run()`` owns every background task it starts (claim loop, heartbeat, the watches of
    cancel and follow notices, one job per task) and awaits them all before returning.
    ``stop()`` stops claiming; running tasks get ``shutdown_grace_s`` to finish, then are
    cancelled and their queue entries released for another worker (their finished samples
    are kept).

    Takeover: each claim call first takes over (``reclaim``, at most once a second) as
    many entries as the worker has free slots: every entry of a worker whose
    registration is older than the lease, and entries whose lease lapsed.

    No store error ends the worker: an unreachable store, lost keys or lost consumer
    groups (FLUSHDB, a restart without persistence), LOADING or READONLY are logged, waited
    out with back-off, and what is missing is recreated by the store.
    """

    def __init__(
        self,
        store: WorkerStore,
        runner: SampleRunner,
        settings: Settings,
        *,
        worker_id: str | None = None,
        model: str = DEFAULT_MODEL,
        loads: LoadStatus | None = None,
    ) -> None:
        self.store = store
        self.runner = runner
        self.settings = settings
        self.model = model
        self._loads = loads
        self.worker_id = worker_id or f"{settings.node_id}-w"
        self._picker = WeightedFairPicker(settings.priority_quotas)
        self._slots = asyncio.Semaphore(settings.worker_max_tasks)
        #: by claim: an entry id alone is not unique (each priority level is a queue of its own)
        self._in_flight: dict[Claim, _InFlight] = {}
        self._stopping = asyncio.Event()
        self._reclaim_every_s = min(settings.heartbeat_interval_s, 1.0)
        self._last_reclaim = -math.inf
        #: set by a store error: the first call that works again does not take over
        self._store_was_away = False
        #: the last takeover filled every free slot: there may be more to take at once
        self._more_to_take = False
        #: tasks whose text a client follows: when the follow notice came (monotonic)
        self._followed: dict[str, float] = {}

    # --- lifecycle --------------------------------------------------------------------
    def stop(self) -> None:
        """Stop claiming new tasks (running ones finish within the grace period)."""
        self._stopping.set()

    @property
    def in_flight(self) -> int:
        return len(self._in_flight)

    async def run(self, *, burst: bool = False) -> None:
        """Run until :meth:`stop` (or, with ``burst``, until no task is left to claim)."""
        if not await self._register():
            return  # stopped while waiting for the store
        watchers = [
            asyncio.create_task(self._heartbeat_loop(), name=f"{self.worker_id}-heartbeat"),
            asyncio.create_task(
                self._notice_loop(Notice.cancel, self._cancelled), name=f"{self.worker_id}-cancels"
            ),
            asyncio.create_task(
                self._notice_loop(Notice.follow, self._followed_now),
                name=f"{self.worker_id}-follows",
            ),
        ]
        try:
            await self._claim_loop(burst=burst)
        finally:
            await self._drain()
            await cancel_and_wait(watchers)
            with contextlib.suppress(RecoverableError):
                await self.store.unregister_worker(self.worker_id)

    async def _register(self) -> bool:
        """Register before the first claim (other workers take over the entries of a
        consumer that is not registered); False if stopped while the store is away."""
        delay_s = _BACKOFF_MIN_S
        while not self._stopping.is_set():
            try:
                await self._register_now()
            except RecoverableError as e:
                log.debug("worker %s waits for the store: %s", self.worker_id, e)
                await self._sleep_unless_stopping(delay_s)
                delay_s = min(delay_s * 2, BACKOFF_MAX_S)
            else:
                return True
        return False

    def model_state(self) -> ModelState:
        """The model as this worker serves it now (its registration reports it)."""
        if self._loads is None:
            return ModelState(self.model, self.worker_id, "loaded")
        return ModelState(
            self.model, self.worker_id, self._loads.load_state(), self._loads.resident_mb()
        )

    async def _register_now(self) -> None:
        await self.store.register_worker(
            self.worker_id, self.settings.lease_s, models=[self.model_state()]
        )

    async def _claim_loop(self, *, burst: bool) -> None:
        backoff_s = _BACKOFF_MIN_S
        while await self._free_slot():
            held = 1
            reclaim = self._reclaim_due()
            while reclaim and not self._slots.locked():  # a takeover may fill every free slot
                await self._slots.acquire()
                held += 1
            try:
                claims = await self._next_claims(held, reclaim)
            except RecoverableError as e:
                for _ in range(held):
                    self._slots.release()
                self._store_was_away = True
                log.warning("store unavailable, retrying in %.2fs: %s", backoff_s, e)
                await self._sleep_unless_stopping(backoff_s)
                backoff_s = min(backoff_s * 2, BACKOFF_MAX_S)
                continue
            except BaseException:
                for _ in range(held):
                    self._slots.release()
                raise
            backoff_s = _BACKOFF_MIN_S
            started = sum(self._start_job(claim) for claim in claims)
            for _ in range(held - started):
                self._slots.release()
            if not claims and burst and not self._in_flight:
                return

    async def _free_slot(self) -> bool:
        """Take a free slot; False (holding none) once :meth:`stop` is called, also while
        every slot is held by a run that never ends (stop then reaches the drain)."""
        if self._stopping.is_set():
            return False
        if not self._slots.locked():  # one free now: no waiting, no tasks to start
            await self._slots.acquire()
            return True
        acquire = asyncio.create_task(self._slots.acquire())
        stopping = asyncio.create_task(self._stopping.wait())
        try:
            await asyncio.wait((acquire, stopping), return_when=asyncio.FIRST_COMPLETED)
        finally:
            await cancel_and_wait([acquire, stopping])
        got = acquire.done() and not acquire.cancelled()
        if got and self._stopping.is_set():
            self._slots.release()
            return False
        return got

    def _reclaim_due(self) -> bool:
        """Whether the next claim looks for entries to take over first: at most once per
        ``_reclaim_every_s``, and at once while a takeover fills every free slot (a busy
        worker frees one slot at a time, and the rest of a takeover goes before any new
        entry). After a store outage no takeover for one heartbeat interval: every
        worker's registration and leases may have lapsed meanwhile, and the live ones
        renew them within that time (their heartbeat retries sooner after a failure)."""
        now = time.monotonic()
        if self._store_was_away:
            self._store_was_away = False
            self._more_to_take = False
            self._last_reclaim = now + self.settings.heartbeat_interval_s - self._reclaim_every_s
        return self._more_to_take or now - self._last_reclaim >= self._reclaim_every_s

    async def _next_claims(self, room: int, reclaim: bool) -> list[Claim]:
        """With ``reclaim``, entries taken over from dead or lapsed workers (up to
        ``room``); else, or when there are none, one new entry."""
        if reclaim:
            self._last_reclaim = time.monotonic()
            taken = await self.store.reclaim(
                self.worker_id, self.settings.lease_s, limit=room, model=self.model
            )
            self._more_to_take = len(taken) == room
            if taken:
                metrics.TASKS_RECLAIMED.inc(len(taken))
                log.info("worker %s took over %d task(s)", self.worker_id, len(taken))
                return taken
        claim = await self.store.claim(
            self.worker_id, self._picker.order(), self.settings.claim_block_ms, model=self.model
        )
        return [] if claim is None else [claim]

    def _start_job(self, claim: Claim) -> bool:
        """Start running ``claim``; False when it already runs here (its own lapsed lease,
        taken back: the run goes on)."""
        if claim in self._in_flight:
            return False
        flight = _InFlight(claim=claim)
        flight.job = asyncio.create_task(self._run_claim(flight), name=f"task-{claim.task_id}")
        self._in_flight[claim] = flight

        def finished(t: asyncio.Task[None]) -> None:
            self._in_flight.pop(claim, None)
            self._slots.release()
            if not t.cancelled() and t.exception() is not None:
                log.error("task %s: unexpected error", claim.task_id, exc_info=t.exception())

        flight.job.add_done_callback(finished)
        return True

    async def _drain(self) -> None:
        jobs = [f.job for f in self._in_flight.values() if f.job is not None]
        if not jobs:
            return
        _, still = await asyncio.wait(jobs, timeout=self.settings.shutdown_grace_s)
        await cancel_and_wait(still)

    async def _sleep_unless_stopping(self, delay_s: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), delay_s)

    async def _heartbeat_loop(self) -> None:
        """Keep this worker registered and renew the leases of its running tasks; register
        again at once when the model's load state changes (the console shows it)."""
        delay_s = self.settings.heartbeat_interval_s
        while True:
            changed = asyncio.Event() if self._loads is None else self._loads.changed()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), delay_s)
            try:
                await self._register_now()
                claims = [f.claim for f in self._in_flight.values()]
                if claims:
                    await self.store.renew(self.worker_id, claims)
            except RecoverableError as e:
                log.warning("heartbeat: %s", e)
                delay_s = min(self.settings.heartbeat_interval_s, BACKOFF_MAX_S)
            else:
                delay_s = self.settings.heartbeat_interval_s

    async def _notice_loop(self, topic: Notice, handle: Callable[[list[str]], None]) -> None:
        """Hand the store's notices of ``topic`` to ``handle`` as they come (a blocking
        read, no polling)."""
        cursor: str | None = None
        delay_s = _BACKOFF_MIN_S
        while True:
            try:
                cursor, task_ids = await self.store.read_notices(topic, cursor, _NOTICE_BLOCK_MS)
            except RecoverableError as e:  # the claim loop reports store outages
                log.debug("%s notices: %s", topic.value, e)
                await asyncio.sleep(delay_s)
                delay_s = min(delay_s * 2, BACKOFF_MAX_S)
                continue
            delay_s = _BACKOFF_MIN_S
            if task_ids:
                handle(task_ids)

    def _cancelled(self, task_ids: list[str]) -> None:
        """Stop the runs of tasks the client cancelled."""
        for flight in self._in_flight.values():
            if flight.claim.task_id in task_ids:
                flight.cancelled = True
                if flight.run is not None:
                    flight.run.cancel()

    def _followed_now(self, task_ids: list[str]) -> None:
        """A client follows these tasks' text: their runs here write their deltas, and so
        do runs that start within :data:`~ponder.deltas.FOLLOW_TTL_S`."""
        now = time.monotonic()
        self._followed = {t: at for t, at in self._followed.items() if now - at < FOLLOW_TTL_S}
        self._followed.update(dict.fromkeys(task_ids, now))
        for flight in self._in_flight.values():
            if flight.task_run is not None and flight.claim.task_id in task_ids:
                flight.task_run.follow()

    def is_followed(self, task_id: str) -> bool:
        """Whether a client followed ``task_id``'s text within the last
        :data:`~ponder.deltas.FOLLOW_TTL_S`."""
        at = self._followed.get(task_id)
        return at is not None and time.monotonic() - at < FOLLOW_TTL_S

    # --- one task ---------------------------------------------------------------------
    async def _run_claim(self, flight: _InFlight) -> None:
        """Run the task, then acknowledge its queue entry.

        The entry stays claimed (its lease renewed) while the task runs, so a crash leads
        to a takeover that resumes the work. Webhooks are not sent here: the task's
        terminal write put them in the outbox. A client cancel stops the run (the cancel
        wrote the end state); a shutdown releases the entry for another worker.
        """
        claim = flight.claim
        finished = False
        run = flight.task_run = TaskRun(
            self.store,
            self.runner,
            self.settings,
            claim,
            followed=self.is_followed(claim.task_id),
        )
        try:
            flight.run = asyncio.create_task(run.run(), name=f"run-{claim.task_id}")
            if flight.cancelled:
                flight.run.cancel()
            try:
                finished = await flight.run
            except asyncio.CancelledError:
                job = asyncio.current_task()
                if job is not None and job.cancelling():
                    raise  # shutdown
                finished = True  # stopped by the cancel notice of a cancelled task
                await _quiet(run.keep_usage())
            except EngineDeadError as e:
                # the task is not at fault: release it for a worker whose engine works
                log.error("task %s released: %s; this worker stops claiming", claim.task_id, e)
                self.stop()
        except asyncio.CancelledError:
            task = await _quiet(self.store.get_task(claim.task_id))
            finished = task is None or is_terminal(task.status)
            raise
        except RecoverableError as e:  # the store stayed away for a lease: give it up
            log.warning("task %s: given up for another worker: %s", claim.task_id, e)
        finally:
            if finished:
                if not run.acked:  # the task's last write acks it; else (cancel, gone) here
                    await _quiet(asyncio.shield(self.store.ack(claim)))
            else:
                await _quiet(asyncio.shield(self.store.release(claim)))


async def _quiet(aw: Any) -> Any:
    """Await bookkeeping whose failure must not mask the original outcome."""
    try:
        return await aw
    except RecoverableError as e:
        log.warning("bookkeeping failed: %s", e)
        return None
