"""Queue deadlines: the sweeper that ends ``expired`` the tasks not started in time.

A task with a ``queue_timeout_s`` (its own, else its model's, else
``PONDER_QUEUE_TIMEOUT_S``; resolved when it is created) must start within that many
seconds of ``created_at``. A worker that claims it later does not run it (the claim-time
check); the :class:`ExpirySweeper` ends the ones nobody claims: every
``every_s`` (1 s) it asks the store for the pending tasks past their deadline
(:meth:`~ponder.store.base.TaskRecords.expire_due`, oldest deadline first) and writes each
``expired``: ``finished_at``, ``error`` ``queue_timeout``, and one ``result`` event with
the whole task (the stream's last, as a failed task's) — the write that also puts its
``task.expired`` webhook in the outbox. Each write is a compare-and-set: a task that a
worker started, or a client cancelled, meanwhile is left as it is.

The sweep covers every model's tasks, so a task for a model that no live worker serves
still expires; every worker process runs a sweeper, and two sweepers writing one task
make one write (the other's compare-and-set fails).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from datetime import datetime, timedelta
from typing import Any

from ponder import metrics
from ponder.errors import RecoverableError
from ponder.states import check_transition
from ponder.store.base import TaskRecords
from ponder.types import EventName, Task, TaskError, TaskStatus, utcnow

__all__ = ["ExpirySweeper", "expire", "mark_expired", "past_queue_deadline", "queue_timeout_error"]

log = logging.getLogger("ponder.worker")

#: tasks listed (and written) per store round
_BATCH = 100
_BACKOFF_MAX_S = 5.0


def past_queue_deadline(task: Task, now: datetime | None = None) -> bool:
    """Whether ``task`` is still pending after its queue deadline (``created_at +
    queue_timeout_s``)."""
    if task.status != TaskStatus.pending or task.queue_timeout_s is None:
        return False
    deadline = task.created_at + timedelta(seconds=task.queue_timeout_s)
    return (now or utcnow()) >= deadline


def queue_timeout_error(task: Task) -> TaskError:
    """The error of a task that expired in the queue (code ``queue_timeout``)."""
    limit = "its" if task.queue_timeout_s is None else f"its {task.queue_timeout_s:g}s"
    return TaskError(
        code="queue_timeout",
        message=f"not started within {limit} queue_timeout_s (no worker of model "
        f"{task.model!r} took it in time); it never ran",
    )


def mark_expired(task: Task) -> list[tuple[str, dict[str, Any]]]:
    """Make ``task`` (pending, past its queue deadline) ``expired``, with its error; the
    events its write appends (its end event, as a failed task's)."""
    check_transition(task.status, TaskStatus.expired)
    task.status = TaskStatus.expired
    task.finished_at = utcnow()
    task.error = queue_timeout_error(task)
    return [(EventName.result, task.to_public())]


async def expire(store: TaskRecords, task: Task) -> bool:
    """Write ``task`` (pending, past its queue deadline) ``expired`` with its end event;
    False when it changed since it was read (it started, or was cancelled)."""
    if not await store.update_task(task, mark_expired(task)):
        return False
    metrics.TASKS_FINISHED.labels(status=TaskStatus.expired.value).inc()
    log.info("task %s expired: %s", task.id, task.error and task.error.message)
    return True


class ExpirySweeper:
    """Expires the pending tasks past their queue deadline (module docstring).

    The owner calls :meth:`start` and :meth:`stop` (which waits for the loop to end);
    store outages are logged and waited out with back-off.
    """

    def __init__(self, store: TaskRecords, *, every_s: float = 1.0, limit: int = _BATCH) -> None:
        if every_s <= 0:
            raise ValueError(f"every_s must be positive, got {every_s}")
        self.store = store
        self.every_s = every_s
        self.limit = limit
        self._stopping = asyncio.Event()
        self._loop: asyncio.Task[None] | None = None

    async def start(self) -> None:
        if self._loop is None:
            self._stopping.clear()
            self._loop = asyncio.create_task(self.run(), name="expiry-sweeper")

    async def stop(self) -> None:
        self._stopping.set()
        loop, self._loop = self._loop, None
        if loop is not None:
            await loop

    async def run(self) -> None:
        """Sweep every ``every_s`` until :meth:`stop`."""
        delay_s = self.every_s
        while not self._stopping.is_set():
            try:
                while await self.sweep() >= self.limit and not self._stopping.is_set():
                    pass  # a full round expired: more may be due at once
                delay_s = self.every_s
            except RecoverableError as e:
                log.warning("expiry sweeper: %s; retrying in %.1fs", e, delay_s)
                delay_s = min(delay_s * 2, max(_BACKOFF_MAX_S, self.every_s))
            except Exception:  # a bug must not stop every later expiry
                log.exception("expiry sweeper: unexpected error; retrying in %.1fs", delay_s)
                delay_s = min(delay_s * 2, max(_BACKOFF_MAX_S, self.every_s))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), delay_s)

    async def sweep(self) -> int:
        """One round: expire the due tasks the store lists; how many it expired."""
        ids = await self.store.expire_due(self.limit)
        if not ids:
            return 0
        now, expired = utcnow(), 0
        for task in await self.store.get_tasks(ids):
            # skipped: gone, or started or ended meanwhile (its compare-and-set fails too)
            if task is not None and past_queue_deadline(task, now):
                expired += await expire(self.store, task)
        return expired
