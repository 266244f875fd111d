"""The store + queue interface: one contract, two implementations (Redis, SQLite).

The store keeps task records, the per-priority queues of task ids, each task's event log
and the workers' liveness. Every state change is a compare-and-set on the record's
revision (``Task.rev``), so a cancel by the API and a worker's update can never overwrite
each other; both implementations are checked by one contract test suite.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from ponder.config import NUM_PRIORITIES
from ponder.outbox import OutboxEntry
from ponder.types import Task, TaskStatus

__all__ = [
    "Claim",
    "Event",
    "Notice",
    "OutboxEntry",
    "StoredObject",
    "TaskStore",
    "check_new_task",
    "check_priorities",
]


def check_priorities(priorities: Sequence[int]) -> None:
    """ValueError unless ``priorities`` is a non-empty list of levels 0..5."""
    if not priorities or any(not 0 <= p < NUM_PRIORITIES for p in priorities):
        raise ValueError(f"priorities must be levels 0..{NUM_PRIORITIES - 1}, at least one")


def check_new_task(task: Task) -> None:
    """ValueError unless ``task`` can be created: pending, with a valid priority."""
    if task.status is not TaskStatus.pending:
        raise ValueError("a new task must be pending")
    check_priorities([task.priority])


@dataclass(frozen=True)
class Claim:
    """A queue entry handed to one worker. ``receipt`` identifies it for ack and renew."""

    task_id: str
    priority: int
    receipt: str


@dataclass(frozen=True)
class Event:
    """One entry of a task's event log (the SSE / WebSocket stream)."""

    id: str
    event: str
    data: dict[str, Any]


class Notice(StrEnum):
    """The store's notice topics: wake-ups that cross processes (:meth:`TaskStore.read_notices`)."""

    #: a task was cancelled; the notice carries its id (workers stop running it)
    cancel = "cancel"
    #: webhook deliveries were added to the outbox (delivery loops look for due ones)
    outbox = "outbox"


@dataclass
class StoredObject:
    """A record of the OpenAI-compatible APIs (a file, a batch, a response).

    ``sort_key`` (no spaces) orders an owner's objects (newest last); ``rev`` is the revision the
    record was read at (:meth:`TaskStore.update_object` writes only over it); an
    ``active`` object is one that :meth:`TaskStore.active_objects` lists (work left).
    """

    kind: str
    id: str
    owner: str
    sort_key: str
    data: dict[str, Any]
    rev: int = 0
    active: bool = False


class TaskStore(ABC):
    """Tasks, queues, events and worker liveness.

    Contract (checked by ``tests/store/test_contract.py`` against every implementation):

    - :meth:`create_task` is atomic: admission (pending < ``max_pending``), the
      idempotency check, the record, the queue entry and the first event happen together
      or not at all.
    - :meth:`update_task` writes only over the revision the task was read at; on success
      it bumps ``task.rev``. Leaving ``pending`` frees a backlog slot; reaching a
      terminal state sets the record's time-to-live. In the same atomic step it adds the
      webhook deliveries the write causes (:func:`ponder.outbox.task_deliveries`) to the
      outbox and, when the task becomes ``cancelled``, a :attr:`Notice.cancel`.
    - A claimed entry stays owned by its consumer until :meth:`ack`; an entry whose lease
      was not renewed for ``min_idle_s`` is handed out again by :meth:`reclaim`, and so is
      every entry of a consumer that is no longer a live worker (:meth:`register_worker`).
    - An outbox entry is handed to one delivery loop at a time (:meth:`claim_deliveries`,
      a lease); it stays until :meth:`finish_delivery`, its schedule kept across restarts.
    - Every method raises :class:`~ponder.errors.StoreUnavailable` when the backend
      cannot be reached within the configured timeout.
    """

    # --- lifecycle --------------------------------------------------------------------
    def describe(self) -> str:
        """What the store is, for messages: ``Redis at redis://host:6379/0``."""
        return type(self).__name__

    @abstractmethod
    async def start(self) -> None:
        """Connect (and create schema / consumer groups). Idempotent."""

    @abstractmethod
    async def close(self) -> None:
        """Release connections. Idempotent."""

    @abstractmethod
    async def ping(self) -> bool:
        """True when the backend answers."""

    # --- api side ---------------------------------------------------------------------
    @abstractmethod
    async def create_task(
        self,
        task: Task,
        *,
        max_pending: int,
        idempotency_key: str | None = None,
        body_hash: str | None = None,
        batch: bool = False,
    ) -> tuple[Task, bool]:
        """Store and enqueue ``task``; return ``(task, True)``.

        With an ``idempotency_key`` already used by the same owner: the stored task and
        ``False`` when ``body_hash`` matches, else :class:`IdempotencyConflict`.
        Raises :class:`QueueFull` (storing nothing) when ``max_pending`` tasks are pending.

        ``batch``: the task is a line of a batch (the Batch API). Batch lines have a
        backlog of their own: a batch line is admitted while fewer than ``max_pending``
        batch lines are pending, and pending batch lines never count toward the backlog
        that other tasks are admitted against, so they cannot make those see QueueFull.
        """

    @abstractmethod
    async def get_task(self, task_id: str) -> Task | None:
        """The task, or ``None`` if unknown or expired."""

    @abstractmethod
    async def list_tasks(
        self, owner: str, *, status: TaskStatus | None, limit: int, cursor: str | None
    ) -> tuple[list[Task], str | None]:
        """The owner's tasks, newest first, and the cursor of the next page (or None)."""

    @abstractmethod
    async def pending_count(self) -> int:
        """How many tasks are ``pending`` (the backpressure figure)."""

    @abstractmethod
    async def queue_depths(self) -> dict[int, int]:
        """Pending tasks by priority level."""

    # --- both -------------------------------------------------------------------------
    @abstractmethod
    async def update_task(
        self, task: Task, events: Sequence[tuple[str, dict[str, Any]]] = ()
    ) -> bool:
        """Write ``task`` if the stored revision is still ``task.rev``; append ``events``.

        Returns False (writing nothing) when the record changed since it was read or is
        gone. The caller has checked the transition with :func:`ponder.states.check_transition`;
        the store reads the previous status from its own record: to keep the backlog count
        right, and to post the cancel notice only on the write that enters ``cancelled``.
        """

    # --- worker side ------------------------------------------------------------------
    @abstractmethod
    async def claim(self, consumer: str, priorities: Sequence[int], block_ms: int) -> Claim | None:
        """Take the next entry, trying the priority levels in the order given.

        Waits up to ``block_ms`` for an entry when every level is empty (woken by new
        entries, not by polling where the backend allows it); returns None on timeout.
        """

    @abstractmethod
    async def reclaim(self, consumer: str, min_idle_s: float, limit: int = 10) -> list[Claim]:
        """Take over up to ``limit`` entries, most urgent level first: at once every entry
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
        woken as for :meth:`update_task`. Returns False (appending nothing) when the task
        is gone or not ``running`` — so nothing follows a task's terminal event.
        """

    # --- notices ----------------------------------------------------------------------
    @abstractmethod
    async def read_notices(
        self, topic: Notice, after: str | None, block_ms: int
    ) -> tuple[str, list[str]]:
        """Notices of ``topic`` after cursor ``after`` (None: from now on) and the cursor to
        pass next. Waits up to ``block_ms`` for one when there are none (woken by the
        notice, not by polling). Recent notices are kept (about a thousand), so a reader
        that comes back after an outage reads what it missed."""

    # --- webhook outbox ---------------------------------------------------------------
    @abstractmethod
    async def enqueue_deliveries(self, entries: Sequence[OutboxEntry]) -> None:
        """Add ``entries``, due at once, and post a :attr:`Notice.outbox`. An id is added
        once: one added before (within ``task_ttl_s``) is left as it is, even if it was
        sent meanwhile. For deliveries no task write causes; a task's own are added by
        :meth:`update_task`."""

    @abstractmethod
    async def claim_deliveries(
        self,
        consumer: str,
        limit: int,
        lease_s: float,
        *,
        host_room: Mapping[str, int],
        per_host: int,
    ) -> tuple[list[OutboxEntry], float | None]:
        """Take up to ``limit`` due entries, oldest due first, for ``lease_s`` seconds (then
        they are due again, for another loop, unless finished or rescheduled).

        ``host_room`` is how many more attempts each busy host may get (the caller's own
        attempts in flight), ``per_host`` the room of any other host; a due entry of a host
        without room waits a second, letting other hosts by. Returns the entries and the
        seconds until the next entry is due (None: the outbox is empty).
        """

    @abstractmethod
    async def retry_delivery(self, consumer: str, entry: OutboxEntry, delay_s: float) -> bool:
        """Store ``entry`` (its attempt count) and make it due in ``delay_s`` seconds, if
        ``consumer`` still holds it; False when another loop has taken it over."""

    @abstractmethod
    async def finish_delivery(self, webhook_id: str) -> None:
        """Remove an entry for good (delivered, or given up)."""

    @abstractmethod
    async def outbox_depth(self) -> int:
        """Entries in the outbox (due, scheduled or being sent)."""

    # --- liveness ---------------------------------------------------------------------
    @abstractmethod
    async def register_worker(self, worker_id: str, ttl_s: float) -> None:
        """Mark the worker alive for ``ttl_s`` seconds."""

    @abstractmethod
    async def unregister_worker(self, worker_id: str) -> None:
        """Mark the worker gone (clean shutdown)."""

    @abstractmethod
    async def live_workers(self) -> int:
        """How many workers are alive."""

    # --- the OpenAI-compatible APIs: files, batches, responses --------------------------
    # (api/files.py, api/batches.py, api/responses.py, batch_feeder.py)
    @abstractmethod
    async def batch_pending_count(self) -> int:
        """How many pending tasks are batch lines (``create_task(batch=True)``)."""

    @abstractmethod
    async def get_tasks(self, task_ids: Sequence[str]) -> list[Task | None]:
        """Several tasks in one round trip, in the order asked (None: unknown or expired)."""

    @abstractmethod
    async def create_object(self, obj: StoredObject, *, ttl_s: float) -> bool:
        """Store a new object that expires after ``ttl_s``; False (writing nothing) when
        one of that kind and id exists."""

    @abstractmethod
    async def get_object(self, kind: str, obj_id: str) -> StoredObject | None:
        """The object, or None if unknown or expired."""

    @abstractmethod
    async def update_object(self, obj: StoredObject, *, ttl_s: float | None = None) -> bool:
        """Write ``obj`` if the stored revision is still ``obj.rev`` (then bump it).

        ``ttl_s`` given: the object now expires that long from now (else it keeps its
        expiry). False (writing nothing) when it changed since it was read, or is gone.
        """

    @abstractmethod
    async def delete_object(self, kind: str, obj_id: str) -> bool:
        """Remove the object; False if there was none."""

    @abstractmethod
    async def list_objects(
        self, kind: str, owner: str, *, after: str | None, limit: int
    ) -> tuple[list[StoredObject], bool]:
        """The owner's objects of ``kind``, newest first, starting after the object with
        id ``after``; and whether more follow. ValueError for an unknown ``after``."""

    @abstractmethod
    async def active_objects(self, kind: str) -> list[str]:
        """Ids of the live objects of ``kind`` stored with ``active=True``, oldest first."""

    @abstractmethod
    async def put_blob(self, key: str, data: str, *, ttl_s: float) -> None:
        """Store a text (a file's content) under ``key`` for ``ttl_s`` seconds."""

    @abstractmethod
    async def get_blob(self, key: str) -> str | None:
        """The text stored under ``key``, or None."""

    @abstractmethod
    async def delete_blob(self, key: str) -> None:
        """Remove the text under ``key`` (nothing if none)."""

    @abstractmethod
    async def put_part(self, key: str, index: int, data: str, *, ttl_s: float) -> None:
        """Set part ``index`` of the collection ``key`` (written again: replaced); each
        part is kept at least ``ttl_s`` after it was written."""

    @abstractmethod
    async def get_parts(self, key: str) -> dict[int, str]:
        """Every part of the collection ``key``."""

    @abstractmethod
    async def delete_parts(self, key: str) -> None:
        """Remove the collection ``key``."""

    @abstractmethod
    async def acquire_lease(self, name: str, holder: str, ttl_s: float) -> bool:
        """Take the named lease for ``ttl_s`` seconds, or renew it if ``holder`` has it;
        False while another holder's lease runs."""

    @abstractmethod
    async def release_lease(self, name: str, holder: str) -> None:
        """Give the lease up if ``holder`` has it."""
