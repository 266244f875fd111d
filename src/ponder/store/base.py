"""The store + queue interface: one contract, two implementations (Redis, SQLite).

The store keeps task records, the per-priority queues of task ids, each task's event log,
the webhook outbox, the workers' liveness and the OpenAI-compatible APIs' objects. Every
state change is a compare-and-set on the record's revision (``Task.rev``), so a cancel by
the API and a worker's update can never overwrite each other; both implementations are
checked by one contract test suite.

The contract is split by concern (:mod:`ponder.store.contract`); :class:`TaskStore` is
every part together, and what callers hold. The records it trades in live in
:mod:`ponder.store.records`; both are importable from here, as before the split.
"""

from __future__ import annotations

from ponder.outbox import OutboxEntry
from ponder.store.contract import (
    EventLog,
    Lifecycle,
    Liveness,
    ObjectStore,
    Outbox,
    TaskQueue,
    TaskRecords,
    WorkQueue,
)
from ponder.store.records import (
    Admission,
    Claim,
    Event,
    HostRoom,
    Notice,
    StoredObject,
    check_new_task,
    check_priorities,
)

__all__ = [
    "Admission",
    "Claim",
    "Event",
    "EventLog",
    "HostRoom",
    "Lifecycle",
    "Liveness",
    "Notice",
    "ObjectStore",
    "Outbox",
    "OutboxEntry",
    "StoredObject",
    "TaskQueue",
    "TaskRecords",
    "TaskStore",
    "WorkQueue",
    "check_new_task",
    "check_priorities",
]


class TaskStore(Lifecycle, TaskQueue, ObjectStore, Outbox, Liveness):
    """Tasks, queues, events, the outbox, worker liveness and the OpenAI objects.

    Contract (checked by the ``tests/store/test_contract_*.py`` files against every
    implementation, one file per part):

    - :class:`TaskRecords`: :meth:`create_task` is atomic: admission (pending <
      ``max_pending``), the idempotency check, the record, the queue entry and the first
      event happen together or not at all. :meth:`update_task` writes only over the
      revision the task was read at; on success it bumps ``task.rev``. Leaving
      ``pending`` frees a backlog slot; reaching a terminal state sets the record's
      time-to-live. In the same atomic step it adds the webhook deliveries the write
      causes (:func:`ponder.outbox.task_deliveries`) to the outbox and, when the task
      becomes ``cancelled``, a :attr:`Notice.cancel`.
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
    - Every method raises :class:`~ponder.errors.StoreUnavailable` when the backend
      cannot be reached within the configured timeout.
    """
