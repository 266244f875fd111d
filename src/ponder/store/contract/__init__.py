"""The store contract, one protocol per concern; :class:`ponder.store.base.TaskStore`
is all of them together.

- :class:`Lifecycle`: start, close, ping.
- :class:`TaskQueue`: :class:`TaskRecords` (records, admission, listings),
  :class:`WorkQueue` (claims and leases of queue entries) and :class:`EventLog` (each
  task's events, and the notices that cross processes); :class:`TaskEvents` is a task's
  record and its log.
- :class:`ObjectStore`: the OpenAI-compatible APIs' objects, blobs and parts.
- :class:`Outbox`: webhook deliveries.
- :class:`Liveness`: worker registrations and named leases.
- :class:`RateLimits`: a token bucket per caller.

Each part is a :class:`typing.Protocol` whose methods are abstract: a consumer is typed by
the part (or a protocol of the few parts) it uses, and the stores, which subclass the
parts explicitly, are checked to implement every method.
"""

from __future__ import annotations

from ponder.store.contract.lifecycle import Lifecycle
from ponder.store.contract.liveness import Liveness
from ponder.store.contract.objects import ObjectStore
from ponder.store.contract.outbox import Outbox
from ponder.store.contract.ratelimits import RateLimits
from ponder.store.contract.tasks import EventLog, TaskEvents, TaskQueue, TaskRecords, WorkQueue

__all__ = [
    "EventLog",
    "Lifecycle",
    "Liveness",
    "ObjectStore",
    "Outbox",
    "RateLimits",
    "TaskEvents",
    "TaskQueue",
    "TaskRecords",
    "WorkQueue",
]
