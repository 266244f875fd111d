"""The embedded SQLite store: one process (``ponder serve``), no server to run.

One class per part of the contract (``tasks``, ``queue``, ``events``, ``objects``,
``outbox``, ``liveness``, ``ratelimits``), each over
:class:`~ponder.store.sqlite.base.SqliteBase` (the connection, its lock, the signals and
notices); :class:`SqliteStore` is all of them together. The tables are in
:mod:`ponder.store.sqlite.schema`.

One connection, WAL journal. Every operation runs under one asyncio.Lock, and each that
writes more than one row runs in one ``BEGIN IMMEDIATE`` transaction, so it is atomic
and later readers on the same connection never see half of it.

Waiting is in-process: :meth:`claim` waits on a signal fired by :meth:`create_task` and
:meth:`release`, :meth:`read_events` on one fired by :meth:`update_task` for that task,
and notices (cancels, new webhook deliveries) and the rate-limit buckets live in memory
only. Hence the single-process rule: another process writing the same file would not
wake these waiters (claims and events would still be correct, only slower, up to
``block_ms``; notices would not reach it).

The pending figures are counted from the tasks table (indexed), so they cannot drift.
A queue entry's ``model`` (and the task's) names the model whose queues it is on: a file
made before there were models gets the columns with the default model's name. A task's
queue ``deadline`` is indexed while it is pending (a partial index: leaving ``pending``
takes the row out of it, with no write of its own).
A batch line's row has ``lane`` = ``batch``: other tasks are admitted against the pending
rows without a lane, batch lines against those with one.
Expired tasks are invisible at once and deleted (with their events and queue entries)
on :meth:`start` and at most once a minute while tasks are created.
"""

from __future__ import annotations

from ponder.store.base import TaskStore
from ponder.store.sqlite.base import NOTICES_KEPT, PURGE_INTERVAL_S, SqliteBase
from ponder.store.sqlite.events import SqliteEventLog
from ponder.store.sqlite.liveness import SqliteLiveness
from ponder.store.sqlite.objects import SqliteObjects
from ponder.store.sqlite.outbox import SqliteOutbox
from ponder.store.sqlite.queue import SqliteWorkQueue
from ponder.store.sqlite.ratelimits import SqliteRateLimits
from ponder.store.sqlite.tasks import SqliteTaskRecords

__all__ = ["NOTICES_KEPT", "PURGE_INTERVAL_S", "SqliteBase", "SqliteStore"]


class SqliteStore(
    SqliteTaskRecords,
    SqliteWorkQueue,
    SqliteEventLog,
    SqliteObjects,
    SqliteOutbox,
    SqliteLiveness,
    SqliteRateLimits,
    TaskStore,
):
    """:class:`TaskStore` in one SQLite file (see the module docstring)."""
