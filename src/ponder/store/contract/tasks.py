"""The task side of the store: records, the work queue, and the logs readers follow.

:class:`TaskQueue` is the three together (:class:`TaskRecords`, :class:`WorkQueue`,
:class:`EventLog`): what the API and the workers share about tasks; :class:`TaskEvents`
is a task's record and its log.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sequence
from typing import Any, Protocol

from ponder.config.models import DEFAULT_MODEL
from ponder.store.records import Admission, Claim, Event, Notice
from ponder.types import Task, TaskStatus

__all__ = ["EventLog", "TaskEvents", "TaskQueue", "TaskRecords", "WorkQueue"]


class TaskRecords(Protocol):
    """Task records: admission, reads, listings, the compare-and-set write, backlog figures.

    - :meth:`create_task` is atomic: admission (pending < ``max_pending``), the
      idempotency check, the record, the queue entry and the first event happen together
      or not at all.
    - :meth:`update_task` writes only over the revision the task was read at; on success
      it bumps ``task.rev``. Leaving ``pending`` frees a backlog slot; reaching a
      terminal state sets the record's time-to-live. In the same atomic step it adds the
      webhook deliveries the write causes
      (:func:`ponder.store.deliveries.task_deliveries`) to the outbox and, when the task
      becomes ``cancelled``, a :attr:`Notice.cancel`.
    """

    # --- api side ---------------------------------------------------------------------
    @abstractmethod
    async def create_task(self, task: Task, admission: Admission) -> tuple[Task, bool]:
        """Store and enqueue ``task``; return ``(task, True)``.

        With an ``admission.idempotency_key`` already used by the same owner: the stored
        task and ``False`` when ``admission.body_hash`` matches, else
        :class:`IdempotencyConflict`. Raises :class:`QueueFull` (storing nothing) when
        ``admission.max_pending`` tasks are pending.

        ``admission.batch``: the task is a line of a batch (the Batch API). Batch lines
        have a backlog of their own: a batch line is admitted while fewer than
        ``max_pending`` batch lines are pending, and pending batch lines never count
        toward the backlog that other tasks are admitted against, so they cannot make
        those see QueueFull.
        """

    @abstractmethod
    async def get_task(self, task_id: str) -> Task | None:
        """The task, or ``None`` if unknown or expired."""

    @abstractmethod
    async def get_tasks(self, task_ids: Sequence[str]) -> list[Task | None]:
        """Several tasks in one round trip, in the order asked (None: unknown or expired)."""

    @abstractmethod
    async def list_tasks(
        self, owner: str, *, status: TaskStatus | None, limit: int, cursor: str | None
    ) -> tuple[list[Task], str | None]:
        """The owner's tasks, newest first, and the cursor of the next page (or None): the
        id of the page's last task.

        Raises ValueError for a ``limit`` below 1 or a cursor this store did not hand out.
        """

    @abstractmethod
    async def pending_count(self) -> int:
        """How many tasks are ``pending`` (the backpressure figure)."""

    @abstractmethod
    async def batch_pending_count(self) -> int:
        """How many pending tasks are batch lines (``Admission(batch=True)``)."""

    @abstractmethod
    async def queue_depths(self, model: str | None = None) -> dict[int, int]:
        """Pending tasks by priority level: of ``model``'s queue, or (None) of all models."""

    @abstractmethod
    async def queue_depths_by_model(self) -> dict[str, dict[int, int]]:
        """Pending tasks by model, then priority level (models with none may be left out)."""

    @abstractmethod
    async def expire_due(self, limit: int = 100) -> list[str]:
        """Ids of up to ``limit`` tasks whose queue deadline (``created_at +
        queue_timeout_s``) has passed while they were ``pending``, oldest deadline first.

        The store keeps an index of the deadlines of pending tasks (written by
        :meth:`create_task` for a task with ``queue_timeout_s``, left when the task leaves
        ``pending``); listing does not change it: the caller writes each task
        ``expired`` with :meth:`update_task` (a compare-and-set: a task started meanwhile
        is not touched), which drops it from the index.
        """

    # --- both -------------------------------------------------------------------------
    @abstractmethod
    async def update_task(
        self,
        task: Task,
        events: Sequence[tuple[str, dict[str, Any]]] = (),
        *,
        ack: Claim | None = None,
    ) -> bool:
        """Write ``task`` if the stored revision is still ``task.rev``; append ``events``;
        with ``ack``, acknowledge that queue entry in the same atomic step
        (:meth:`WorkQueue.ack`: a worker's last write of a task it ran, one round trip
        less).

        Returns False (writing nothing, acking nothing) when the record changed since it
        was read or is gone. The caller has checked the transition with
        :func:`ponder.states.check_transition`; the store reads the previous status from its
        own record: to keep the backlog count right, and to post the cancel notice only on
        the write that enters ``cancelled``.
        """

    @abstractmethod
    async def hand_over(
        self, task: Task, claim: Claim, events: Sequence[tuple[str, dict[str, Any]]] = ()
    ) -> bool:
        """Move a running task to another model's queue (an escalation): in one atomic
        step write ``task`` (still ``running``, its ``model`` changed) over its revision,
        append ``events``, acknowledge ``claim`` and add an entry for the task to the queue
        of ``task.model`` at ``task.priority`` (its record readable with the claim, as on
        admission). False (changing nothing) when the record changed since it was read.
        """


class WorkQueue(Protocol):
    """The per-model, per-priority queues of task ids, as the workers see them.

    A task is queued on its model's queue (:attr:`ponder.types.Task.model`) at its
    priority. The default model's queues (``ponder``, a deployment without a models file)
    keep the keys they had before there were models.

    A claimed entry stays owned by its consumer until :meth:`ack`; an entry whose lease
    was not renewed for ``min_idle_s`` is handed out again by :meth:`reclaim`, and so is
    every entry of a consumer that is no longer a live worker
    (:meth:`~ponder.store.contract.liveness.Liveness.register_worker`).
    """

    @abstractmethod
    async def claim(
        self, consumer: str, priorities: Sequence[int], block_ms: int, *, model: str = DEFAULT_MODEL
    ) -> Claim | None:
        """Take the next entry of ``model``'s queues, trying the priority levels in the
        order given (each model has a queue per priority level: a worker serves one model's
        tasks, :attr:`Claim.model`).

        Waits up to ``block_ms`` for an entry when every level is empty (woken by new
        entries, not by polling where the backend allows it); returns None on timeout.
        The claim may carry the task's record read in the same step (:attr:`Claim.record`),
        which saves the worker a read.
        """

    @abstractmethod
    async def reclaim(
        self, consumer: str, min_idle_s: float, limit: int = 10, *, model: str = DEFAULT_MODEL
    ) -> list[Claim]:
        """Take over up to ``limit`` entries of ``model``'s queues, most urgent level
        first: at once every entry
        of a consumer that is not a live worker (never registered, unregistered, or its
        registration older than its ttl), then entries whose lease was not renewed for
        ``min_idle_s`` seconds. Consumers found dead and left with no entries are removed.
        """

    @abstractmethod
    async def renew(self, consumer: str, claims: Sequence[Claim]) -> None:
        """Renew the leases of ``claims`` (resets their idle time)."""

    @abstractmethod
    async def ack(self, claim: Claim) -> None:
        """Remove a finished entry from its queue for good."""

    @abstractmethod
    async def release(self, claim: Claim) -> None:
        """Give an entry back so another worker takes it at once (graceful shutdown)."""


class EventLog(Protocol):
    """What readers follow: each task's event log, and the notices that cross processes."""

    # --- events -----------------------------------------------------------------------
    @abstractmethod
    async def read_events(
        self, task_id: str, after: str | None, block_ms: int = 0, limit: int = 100
    ) -> list[Event]:
        """Events of the task after event id ``after`` (None: from the start), oldest first.

        When there are none and ``block_ms`` > 0, waits up to that long for one.
        """

    # --- streamed text (delta events) -------------------------------------------------
    @abstractmethod
    async def append_events(
        self, task_id: str, events: Sequence[tuple[str, dict[str, Any]]]
    ) -> bool:
        """Append ``events`` to the log of a *running* task without touching its record.

        For what is published between state changes (the ``delta`` events of running
        samples): the record's revision is unchanged, readers of :meth:`read_events` are
        woken as for :meth:`~TaskRecords.update_task`. Returns False (appending nothing)
        when the task is gone or not ``running`` — so nothing follows a task's terminal event.
        """

    # --- notices ----------------------------------------------------------------------
    @abstractmethod
    async def post_notice(self, topic: Notice, value: str) -> None:
        """Post ``value`` to the readers of ``topic`` (the notices the store does not post
        itself with a state change: :attr:`Notice.follow`)."""

    @abstractmethod
    async def read_notices(
        self, topic: Notice, after: str | None, block_ms: int
    ) -> tuple[str, list[str]]:
        """Notices of ``topic`` after cursor ``after`` (None: from now on) and the cursor to
        pass next. Waits up to ``block_ms`` for one when there are none (woken by the
        notice, not by polling). Recent notices are kept (about a thousand), so a reader
        that comes back after an outage reads what it missed."""


class TaskEvents(TaskRecords, EventLog, Protocol):
    """A task's record and its log: what following a task (the event routes) and running
    one (a worker's task run) use."""


class TaskQueue(TaskRecords, WorkQueue, EventLog, Protocol):
    """Tasks, their queues and their logs: the part of the store that tasks live in."""
