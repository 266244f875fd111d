"""The store + queue interface: one contract, two implementations (Redis, SQLite).

The store keeps task records, the per-priority queues of task ids, each task's event log,
the webhook outbox, the workers' liveness and the OpenAI-compatible APIs' objects. Every
state change is a compare-and-set on the record's revision (``Task.rev``), so a cancel by
the API and a worker's update can never overwrite each other; both implementations are
checked by one contract test suite.

The contract is split by concern (:mod:`ponder.store.contract`), one protocol per part;
:class:`TaskStore` is every part together, held where the store is created and composed
(the API's state, the worker runtime). A consumer is typed by the part it uses (the
delta writer by :class:`EventLog`, the file store by :class:`ObjectStore`, …) or by a
protocol of the few parts it uses. The records it trades in live in
:mod:`ponder.store.records`, the outbox row in :mod:`ponder.store.deliveries`; all are
importable from here. The store imports nothing of ponder above it (only types, errors,
config, ids).
"""

from __future__ import annotations

from typing import Protocol

from ponder.store.contract import (
    EventLog,
    Lifecycle,
    Liveness,
    ObjectStore,
    Outbox,
    RateLimits,
    TaskEvents,
    TaskQueue,
    TaskRecords,
    WorkQueue,
)
from ponder.store.deliveries import OutboxEntry
from ponder.store.records import (
    Admission,
    Claim,
    Event,
    HostRoom,
    ModelState,
    Notice,
    StoredObject,
    check_new_task,
    check_priorities,
)
from ponder.types import Task

__all__ = [
    "Admission",
    "Claim",
    "Event",
    "EventLog",
    "HostRoom",
    "Lifecycle",
    "Liveness",
    "ModelState",
    "Notice",
    "ObjectStore",
    "Outbox",
    "OutboxEntry",
    "RateLimits",
    "StoredObject",
    "TaskEvents",
    "TaskQueue",
    "TaskRecords",
    "TaskStore",
    "WorkQueue",
    "check_new_task",
    "check_priorities",
    "queue_deadline",
]


class TaskStore(Lifecycle, TaskQueue, ObjectStore, Outbox, Liveness, RateLimits, Protocol):
    """Tasks, queues, events, the outbox, worker liveness, the OpenAI objects and the
    rate-limit buckets.

    Contract (checked by the ``tests/store/test_contract_*.py`` files against every
    implementation, one file per part):

    - :class:`TaskRecords`: :meth:`create_task` is atomic: admission (pending <
      ``max_pending``), the idempotency check, the record, the queue entry and the first
      event happen together or not at all. :meth:`update_task` writes only over the
      revision the task was read at; on success it bumps ``task.rev``. Leaving
      ``pending`` frees a backlog slot; reaching a terminal state sets the record's
      time-to-live. In the same atomic step it adds the webhook deliveries the write
      causes (:func:`ponder.store.deliveries.task_deliveries`) to the outbox and, when
      the task becomes ``cancelled``, a :attr:`Notice.cancel`.
    - :class:`WorkQueue`: a claimed entry stays owned by its consumer until :meth:`ack`;
      an entry whose lease was not renewed for ``min_idle_s`` is handed out again by
      :meth:`reclaim`, and so is every entry of a consumer that is no longer a live
      worker (:meth:`register_worker`).
    - :class:`EventLog`: each task's events, and notices that cross processes.
    - :class:`Outbox`: an outbox entry is handed to one delivery loop at a time
      (:meth:`claim_deliveries`, a lease); it stays until :meth:`finish_delivery`, its
      schedule kept across restarts.
    - :class:`ObjectStore`: objects, blobs and parts of the OpenAI-compatible APIs.
    - :class:`Liveness`: worker registrations and named leases.
    - :class:`RateLimits`: a token bucket per caller (shared by every process on Redis;
      in the process's memory in the embedded store).
    - Every method raises :class:`~ponder.errors.StoreUnavailable` when the backend
      cannot be reached within the configured timeout.
    """


def queue_deadline(task: Task) -> float | None:
    """When ``task`` expires if it is still pending (epoch seconds: ``created_at +
    queue_timeout_s``; the stores' index of deadlines), or None: never."""
    if task.queue_timeout_s is None:
        return None
    return task.created_at.timestamp() + task.queue_timeout_s
