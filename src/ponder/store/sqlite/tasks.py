"""Task records in SQLite: the ``tasks`` and ``idempotency`` tables."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any

import aiosqlite

from ponder.config import NUM_PRIORITIES
from ponder.errors import IdempotencyConflict, QueueFull
from ponder.ids import sort_key
from ponder.states import is_terminal
from ponder.store.base import queue_deadline
from ponder.store.contract import TaskRecords
from ponder.store.deliveries import task_deliveries
from ponder.store.records import (
    Admission,
    Claim,
    Notice,
    check_new_task,
    check_page,
    check_priorities,
)
from ponder.store.sqlite.base import PURGE_INTERVAL_S, SqliteBase, first
from ponder.store.sqlite.outbox import add_deliveries
from ponder.store.sqlite.schema import LIVE
from ponder.types import Task, TaskStatus

__all__ = ["SqliteTaskRecords"]

_IN_CHUNK = 500  # ids per IN (...) query, well under SQLite's variable limit


async def _backlog(db: aiosqlite.Connection, *, batch: bool) -> int:
    """Pending tasks of one lane: batch lines, or every other task."""
    lane = "lane = 'batch'" if batch else "lane IS NULL"
    row = await first(db, f"SELECT COUNT(*) FROM tasks WHERE status = 'pending' AND {lane}")
    return int(row[0])


class SqliteTaskRecords(SqliteBase, TaskRecords):
    """:class:`TaskRecords` in SQLite: pending figures are counted from the tasks table."""

    # --- api side ---------------------------------------------------------------------
    async def create_task(self, task: Task, admission: Admission) -> tuple[Task, bool]:
        check_new_task(task)
        now = time.time()
        key, body_hash = admission.idempotency_key, admission.body_hash or ""
        async with self._tx() as db:
            if key is not None:
                # a key whose task has expired is free again
                row = await first(
                    db,
                    "SELECT i.body_hash, t.data FROM idempotency i JOIN tasks t ON t.id = i.task_id"
                    " WHERE i.owner = ? AND i.key = ? AND i.expires_at > ?"
                    " AND (t.expires_at IS NULL OR t.expires_at > ?)",
                    (task.owner, key, now, now),
                )
                if row is not None:
                    if row[0] != body_hash:
                        raise IdempotencyConflict(
                            "the Idempotency-Key was used with another request body"
                        )
                    return Task.from_storage(row[1]), False
            if await _backlog(db, batch=admission.batch) >= admission.max_pending:
                raise QueueFull(admission.max_pending)
            await db.execute(
                "INSERT INTO tasks (id, owner, status, priority, sort_key, rev, data, lane,"
                " model, deadline) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (task.id, task.owner, task.status.value, task.priority, sort_key(task.id),
                 task.rev, task.to_storage(), "batch" if admission.batch else None,
                 task.model, queue_deadline(task)),
            )  # fmt: skip
            await db.execute(
                "INSERT INTO queue (task_id, priority, model) VALUES (?, ?, ?)",
                (task.id, task.priority, task.model),
            )
            await db.execute(
                "INSERT INTO events (task_id, event, data) VALUES (?, 'status', ?)",
                (task.id, json.dumps({"status": task.status.value})),
            )
            if key is not None:
                await db.execute(
                    "INSERT OR REPLACE INTO idempotency VALUES (?, ?, ?, ?, ?)",
                    (task.owner, key, body_hash, task.id, now + self._ttl),
                )
            if now - self._purged_at > PURGE_INTERVAL_S:
                await self._purge(db, now)
        self._queued.fire()
        return task, True

    async def get_task(self, task_id: str) -> Task | None:
        async with self._conn() as db:
            row = await first(
                db, f"SELECT data FROM tasks WHERE id = ? AND {LIVE}", (task_id, time.time())
            )
        return None if row is None else Task.from_storage(row[0])

    async def get_tasks(self, task_ids: Sequence[str]) -> list[Task | None]:
        found: dict[str, Task] = {}
        now = time.time()
        async with self._conn() as db:
            for start in range(0, len(task_ids), _IN_CHUNK):
                chunk = list(task_ids[start : start + _IN_CHUNK])
                marks = ",".join("?" * len(chunk))
                rows = await db.execute_fetchall(
                    f"SELECT id, data FROM tasks WHERE id IN ({marks}) AND {LIVE}", [*chunk, now]
                )
                found |= {row[0]: Task.from_storage(row[1]) for row in rows}
        return [found.get(task_id) for task_id in task_ids]

    async def list_tasks(
        self, owner: str, *, status: TaskStatus | None, limit: int, cursor: str | None
    ) -> tuple[list[Task], str | None]:
        check_page(limit, cursor)
        sql = f"SELECT data FROM tasks WHERE owner = ? AND {LIVE}"
        params: list[Any] = [owner, time.time()]
        if status is not None:
            sql += " AND status = ?"
            params.append(status.value)
        if cursor is not None:
            sql += " AND sort_key < ?"
            params.append(sort_key(cursor))
        sql += " ORDER BY sort_key DESC LIMIT ?"
        params.append(limit + 1)  # one more tells whether another page follows
        async with self._conn() as db:
            rows = await db.execute_fetchall(sql, params)
        tasks = [Task.from_storage(r[0]) for r in rows]
        if len(tasks) > limit:
            return tasks[:limit], tasks[limit - 1].id
        return tasks, None

    async def pending_count(self) -> int:
        return sum((await self.queue_depths()).values())

    async def batch_pending_count(self) -> int:
        async with self._conn() as db:
            return await _backlog(db, batch=True)

    async def queue_depths(self, model: str | None = None) -> dict[int, int]:
        sql = "SELECT priority, COUNT(*) FROM tasks WHERE status = 'pending'"
        params: tuple[str, ...] = ()
        if model is not None:
            sql, params = sql + " AND model = ?", (model,)
        async with self._conn() as db:
            rows = await db.execute_fetchall(sql + " GROUP BY priority", params)
        return _levels() | {int(p): int(n) for p, n in rows}

    async def queue_depths_by_model(self) -> dict[str, dict[int, int]]:
        async with self._conn() as db:
            rows = await db.execute_fetchall(
                "SELECT model, priority, COUNT(*) FROM tasks WHERE status = 'pending'"
                " GROUP BY model, priority"
            )
        depths: dict[str, dict[int, int]] = {}
        for model, p, n in rows:
            depths.setdefault(model, _levels())[int(p)] = int(n)
        return depths

    async def expire_due(self, limit: int = 100) -> list[str]:
        """The pending rows' deadlines are an index of their own (``tasks_by_deadline``,
        partial: a row leaves it when its status leaves ``pending``)."""
        async with self._conn() as db:
            rows = await db.execute_fetchall(
                # (named: without statistics the planner takes tasks_by_status and sorts)
                "SELECT id FROM tasks INDEXED BY tasks_by_deadline WHERE status = 'pending'"
                " AND deadline IS NOT NULL AND deadline <= ? ORDER BY deadline LIMIT ?",
                (time.time(), max(0, limit)),
            )
        return [row[0] for row in rows]

    # --- both -------------------------------------------------------------------------
    async def update_task(
        self,
        task: Task,
        events: Sequence[tuple[str, dict[str, Any]]] = (),
        *,
        ack: Claim | None = None,
    ) -> bool:
        now = time.time()
        new_rev = task.rev + 1
        async with self._tx() as db:
            row = await first(
                db,
                f"SELECT status FROM tasks WHERE id = ? AND rev = ? AND {LIVE}",
                (task.id, task.rev, now),
            )
            if row is None:
                return False
            await db.execute(
                "UPDATE tasks SET status = ?, rev = ?, data = ?, expires_at = ? WHERE id = ?",
                (
                    task.status.value,
                    new_rev,
                    task.to_storage(rev=new_rev),
                    now + self._ttl if is_terminal(task.status) else None,
                    task.id,
                ),
            )
            added = await add_deliveries(db, task_deliveries(task, events), now, self._ttl)
            await db.executemany(
                "INSERT INTO events (task_id, event, data) VALUES (?, ?, ?)",
                [(task.id, name, json.dumps(data)) for name, data in events],
            )
            if ack is not None:
                await db.execute("DELETE FROM queue WHERE id = ?", (int(ack.receipt),))
        task.rev = new_rev
        if events and (signal := self._events.get(task.id)) is not None:
            signal.fire()
        if task.status is TaskStatus.cancelled and row[0] != TaskStatus.cancelled:
            self._notices[Notice.cancel].post(task.id)
        if added:
            self._notices[Notice.outbox].post(str(added))
        return True

    async def hand_over(
        self, task: Task, claim: Claim, events: Sequence[tuple[str, dict[str, Any]]] = ()
    ) -> bool:
        if task.status is not TaskStatus.running:
            raise ValueError("only a running task is handed over to another model")
        check_priorities([task.priority])
        now = time.time()
        new_rev = task.rev + 1
        async with self._tx() as db:
            cur = await db.execute(
                "UPDATE tasks SET status = ?, rev = ?, data = ?, priority = ?, model = ?"
                f" WHERE id = ? AND rev = ? AND {LIVE}",
                (task.status.value, new_rev, task.to_storage(rev=new_rev), task.priority,
                 task.model, task.id, task.rev, now),
            )  # fmt: skip
            if cur.rowcount != 1:
                return False
            added = await add_deliveries(db, task_deliveries(task, events), now, self._ttl)
            await db.executemany(
                "INSERT INTO events (task_id, event, data) VALUES (?, ?, ?)",
                [(task.id, name, json.dumps(data)) for name, data in events],
            )
            await db.execute("DELETE FROM queue WHERE id = ?", (int(claim.receipt),))
            await db.execute(
                "INSERT INTO queue (task_id, priority, model) VALUES (?, ?, ?)",
                (task.id, task.priority, task.model),
            )
        task.rev = new_rev
        self._queued.fire()
        if events and (signal := self._events.get(task.id)) is not None:
            signal.fire()
        if added:
            self._notices[Notice.outbox].post(str(added))
        return True


def _levels() -> dict[int, int]:
    return dict.fromkeys(range(NUM_PRIORITIES), 0)
