"""The embedded SQLite store: one process (``ponder serve``), no server to run.

One connection, WAL journal. Every operation runs under one asyncio.Lock, and each that
writes more than one row runs in one ``BEGIN IMMEDIATE`` transaction, so it is atomic
and later readers on the same connection never see half of it.

Waiting is in-process: :meth:`claim` waits on a signal fired by :meth:`create_task` and
:meth:`release`, :meth:`read_events` on one fired by :meth:`update_task` for that task,
and notices (cancels, new webhook deliveries) live in memory only. Hence the
single-process rule: another process writing the same file would not wake these waiters
(claims and events would still be correct, only slower, up to ``block_ms``; notices
would not reach it).

The pending figures are counted from the tasks table (indexed), so they cannot drift.
A batch line's row has ``lane`` = ``batch``: other tasks are admitted against the pending
rows without a lane, batch lines against those with one.
Expired tasks are invisible at once and deleted (with their events and queue entries)
on :meth:`start` and at most once a minute while tasks are created.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
import time
from collections import deque
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import aiosqlite

from ponder.config import NUM_PRIORITIES, Settings
from ponder.errors import IdempotencyConflict, QueueFull, StoreUnavailable
from ponder.ids import parse_task_id, sort_key
from ponder.outbox import OutboxEntry, task_deliveries
from ponder.states import is_terminal
from ponder.store.base import (
    Claim,
    Event,
    Notice,
    StoredObject,
    TaskStore,
    check_new_task,
    check_priorities,
)
from ponder.types import Task, TaskStatus

__all__ = ["SqliteStore"]

PURGE_INTERVAL_S = 60.0
#: notices kept per topic
NOTICES_KEPT = 1000
#: rows looked at per claim of deliveries, beyond the limit (some may be for busy hosts)
_DELIVERY_SCAN = 64
#: a due delivery whose host is at its limit waits this long before it is looked at again
_BUSY_HOST_DEFER_S = 1.0

_SCHEMA = """
CREATE TABLE IF NOT EXISTS tasks (
    id TEXT PRIMARY KEY,
    owner TEXT NOT NULL,
    status TEXT NOT NULL,
    priority INTEGER NOT NULL,
    sort_key TEXT NOT NULL,
    rev INTEGER NOT NULL,
    data TEXT NOT NULL,
    expires_at REAL
);
CREATE INDEX IF NOT EXISTS tasks_by_owner ON tasks (owner, sort_key);
CREATE INDEX IF NOT EXISTS tasks_by_status ON tasks (status, priority);
CREATE INDEX IF NOT EXISTS tasks_by_expiry ON tasks (expires_at) WHERE expires_at IS NOT NULL;
CREATE TABLE IF NOT EXISTS queue (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    task_id TEXT NOT NULL,
    priority INTEGER NOT NULL,
    consumer TEXT,
    claimed_at REAL
);
CREATE INDEX IF NOT EXISTS queue_ready ON queue (priority, id) WHERE consumer IS NULL;
CREATE INDEX IF NOT EXISTS queue_claimed ON queue (claimed_at) WHERE consumer IS NOT NULL;
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    task_id TEXT NOT NULL,
    event TEXT NOT NULL,
    data TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS events_by_task ON events (task_id, id);
CREATE TABLE IF NOT EXISTS idempotency (
    owner TEXT NOT NULL,
    key TEXT NOT NULL,
    body_hash TEXT NOT NULL,
    task_id TEXT NOT NULL,
    expires_at REAL NOT NULL,
    PRIMARY KEY (owner, key)
);
CREATE TABLE IF NOT EXISTS workers (id TEXT PRIMARY KEY, expires_at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS outbox (
    id TEXT PRIMARY KEY,
    host TEXT NOT NULL,
    due_at REAL NOT NULL,
    owner TEXT,
    data TEXT NOT NULL,
    expires_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS outbox_due ON outbox (due_at);
CREATE TABLE IF NOT EXISTS outbox_once (id TEXT PRIMARY KEY, expires_at REAL NOT NULL);
"""

_LIVE = "(expires_at IS NULL OR expires_at > ?)"
_EXPIRED = "SELECT id FROM tasks WHERE expires_at <= ?"


@contextmanager
def _unavailable() -> Iterator[None]:
    """Turn failures to use the database file (locked, unreadable) into StoreUnavailable."""
    try:
        yield
    except sqlite3.OperationalError as e:
        raise StoreUnavailable(f"the SQLite store is unavailable: {e}") from e


class _Notices:
    """One notice topic: the last :data:`NOTICES_KEPT` notices, numbered from 1."""

    def __init__(self) -> None:
        self.kept: deque[tuple[int, str]] = deque(maxlen=NOTICES_KEPT)
        self.last = 0
        self.posted = _Signal()

    def post(self, value: str) -> None:
        self.last += 1
        self.kept.append((self.last, value))
        self.posted.fire()

    def after(self, seq: int) -> list[tuple[int, str]]:
        return [(n, v) for n, v in self.kept if n > seq]


class _Signal:
    """Wakes every waiter; taking :meth:`waiter` before checking means no wakeup is lost."""

    def __init__(self) -> None:
        self._event = asyncio.Event()
        self.users = 0  # readers of a task's events; the last one drops the signal

    def waiter(self) -> asyncio.Event:
        return self._event

    def fire(self) -> None:
        self._event.set()
        self._event = asyncio.Event()


async def _rollback(db: aiosqlite.Connection) -> None:
    with contextlib.suppress(sqlite3.OperationalError):  # no transaction is active
        await db.execute("ROLLBACK")


async def _first(db: aiosqlite.Connection, sql: str, params: Sequence[Any] = ()) -> Any:
    """The first row of a query, or None."""
    return next(iter(await db.execute_fetchall(sql, params)), None)


async def _wait(event: asyncio.Event, deadline: float) -> bool:
    """Wait for ``event`` until the loop-clock ``deadline``; False on timeout."""
    try:
        async with asyncio.timeout_at(deadline):
            await event.wait()
    except TimeoutError:
        return False
    return True


class SqliteStore(TaskStore):
    """:class:`TaskStore` in one SQLite file (see the module docstring)."""

    def __init__(self, settings: Settings) -> None:
        self._path = Path(settings.sqlite_path).expanduser()
        self._ttl = settings.task_ttl_s
        self._timeout = settings.store_timeout_s
        self._db: aiosqlite.Connection | None = None
        self._lock = asyncio.Lock()
        self._queued = _Signal()
        self._events: dict[str, _Signal] = {}
        self._notices = {topic: _Notices() for topic in Notice}
        self._purged_at = 0.0

    # --- plumbing ---------------------------------------------------------------------
    @asynccontextmanager
    async def _conn(self) -> AsyncIterator[aiosqlite.Connection]:
        """The connection, held alone: for single statements."""
        async with self._lock:
            if self._db is None:
                raise StoreUnavailable(f"the SQLite store at {self._path} is not open")
            with _unavailable():
                yield self._db

    @asynccontextmanager
    async def _tx(self) -> AsyncIterator[aiosqlite.Connection]:
        """One write transaction: committed at the end of the block, rolled back on error.

        A cancel can land while BEGIN still runs in aiosqlite's thread (it runs to its end
        whatever the awaiting coroutine does): the rollback is queued behind it, shielded,
        and tolerates "no transaction is active" (some errors roll back by themselves)."""
        async with self._conn() as db:
            try:
                await db.execute("BEGIN IMMEDIATE")
                yield db
            except BaseException:
                await asyncio.shield(_rollback(db))
                raise
            await db.execute("COMMIT")

    async def _purge(self, db: aiosqlite.Connection, now: float) -> None:
        for table in ("events", "queue"):
            await db.execute(f"DELETE FROM {table} WHERE task_id IN ({_EXPIRED})", (now,))
        for table in ("tasks", "idempotency", "workers", "outbox", "outbox_once"):
            await db.execute(f"DELETE FROM {table} WHERE expires_at <= ?", (now,))
        await _purge_objects(db, now)
        self._purged_at = now

    # --- lifecycle --------------------------------------------------------------------
    async def start(self) -> None:
        """Open the file, create the schema, purge expired rows and release every claim.

        Claims are released because this process is the store's only user: whatever a
        previous run had claimed was abandoned when it stopped (a webhook being sent is
        due again at once; scheduled ones keep their time).
        """
        if self._db is not None:
            return
        await asyncio.to_thread(self._path.parent.mkdir, parents=True, exist_ok=True)
        with _unavailable():
            db = await aiosqlite.connect(self._path, timeout=self._timeout, isolation_level=None)
            try:
                await db.execute("PRAGMA journal_mode=WAL")
                await db.execute("PRAGMA synchronous=NORMAL")
                await db.executescript(_SCHEMA)
                await _add_objects_schema(db)
            except BaseException:
                await db.close()
                raise
        self._db = db
        async with self._tx() as db:
            now = time.time()
            await self._purge(db, now)
            await db.execute("UPDATE queue SET consumer = NULL, claimed_at = NULL")
            await db.execute(
                "UPDATE outbox SET owner = NULL, due_at = ? WHERE owner IS NOT NULL", (now,)
            )

    def describe(self) -> str:
        return f"the SQLite store at {self._path}"

    async def close(self) -> None:
        async with self._lock:
            db, self._db = self._db, None
            if db is not None:
                await db.close()

    async def ping(self) -> bool:
        try:
            async with self._conn() as db:
                await db.execute("SELECT 1")
        except StoreUnavailable:
            return False
        return True

    # --- api side ---------------------------------------------------------------------
    async def create_task(
        self,
        task: Task,
        *,
        max_pending: int,
        idempotency_key: str | None = None,
        body_hash: str | None = None,
        batch: bool = False,
    ) -> tuple[Task, bool]:
        check_new_task(task)
        now = time.time()
        async with self._tx() as db:
            if idempotency_key is not None:
                # a key whose task has expired is free again
                row = await _first(
                    db,
                    "SELECT i.body_hash, t.data FROM idempotency i JOIN tasks t ON t.id = i.task_id"
                    " WHERE i.owner = ? AND i.key = ? AND i.expires_at > ?"
                    " AND (t.expires_at IS NULL OR t.expires_at > ?)",
                    (task.owner, idempotency_key, now, now),
                )
                if row is not None:
                    if row[0] != (body_hash or ""):
                        raise IdempotencyConflict(
                            "the Idempotency-Key was used with another request body"
                        )
                    return Task.from_storage(row[1]), False
            if await _backlog(db, batch=batch) >= max_pending:
                raise QueueFull(max_pending)
            await db.execute(
                "INSERT INTO tasks (id, owner, status, priority, sort_key, rev, data)"
                " VALUES (?, ?, ?, ?, ?, ?, ?)",
                (task.id, task.owner, task.status.value, task.priority, sort_key(task.id),
                 task.rev, task.to_storage()),
            )  # fmt: skip
            if batch:
                await db.execute("UPDATE tasks SET lane = 'batch' WHERE id = ?", (task.id,))
            await db.execute(
                "INSERT INTO queue (task_id, priority) VALUES (?, ?)", (task.id, task.priority)
            )
            await db.execute(
                "INSERT INTO events (task_id, event, data) VALUES (?, 'status', ?)",
                (task.id, json.dumps({"status": task.status.value})),
            )
            if idempotency_key is not None:
                await db.execute(
                    "INSERT OR REPLACE INTO idempotency VALUES (?, ?, ?, ?, ?)",
                    (task.owner, idempotency_key, body_hash or "", task.id, now + self._ttl),
                )
            if now - self._purged_at > PURGE_INTERVAL_S:
                await self._purge(db, now)
        self._queued.fire()
        return task, True

    async def get_task(self, task_id: str) -> Task | None:
        async with self._conn() as db:
            row = await _first(
                db, f"SELECT data FROM tasks WHERE id = ? AND {_LIVE}", (task_id, time.time())
            )
        return None if row is None else Task.from_storage(row[0])

    async def list_tasks(
        self, owner: str, *, status: TaskStatus | None, limit: int, cursor: str | None
    ) -> tuple[list[Task], str | None]:
        """Newest first; the cursor is the id of the page's last task.

        Raises ValueError for a cursor this store did not hand out.
        """
        if limit < 1:
            raise ValueError("limit must be at least 1")
        sql = f"SELECT data FROM tasks WHERE owner = ? AND {_LIVE}"
        params: list[Any] = [owner, time.time()]
        if status is not None:
            sql += " AND status = ?"
            params.append(status.value)
        if cursor is not None:
            if parse_task_id(cursor) is None:
                raise ValueError(f"invalid cursor {cursor!r}")
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

    async def queue_depths(self) -> dict[int, int]:
        async with self._conn() as db:
            rows = await db.execute_fetchall(
                "SELECT priority, COUNT(*) FROM tasks WHERE status = 'pending' GROUP BY priority"
            )
        return {p: 0 for p in range(NUM_PRIORITIES)} | {int(p): int(n) for p, n in rows}

    # --- both -------------------------------------------------------------------------
    async def update_task(
        self, task: Task, events: Sequence[tuple[str, dict[str, Any]]] = ()
    ) -> bool:
        now = time.time()
        new_rev = task.rev + 1
        async with self._tx() as db:
            row = await _first(
                db,
                f"SELECT status FROM tasks WHERE id = ? AND rev = ? AND {_LIVE}",
                (task.id, task.rev, now),
            )
            if row is None:
                return False
            await db.execute(
                "UPDATE tasks SET status = ?, rev = ?, data = ?, expires_at = ? WHERE id = ?",
                (
                    task.status.value,
                    new_rev,
                    task.model_copy(update={"rev": new_rev}).to_storage(),
                    now + self._ttl if is_terminal(task.status) else None,
                    task.id,
                ),
            )
            added = await self._add_deliveries(db, task_deliveries(task, events), now)
            await db.executemany(
                "INSERT INTO events (task_id, event, data) VALUES (?, ?, ?)",
                [(task.id, name, json.dumps(data)) for name, data in events],
            )
        task.rev = new_rev
        if events and (signal := self._events.get(task.id)) is not None:
            signal.fire()
        if task.status is TaskStatus.cancelled and row[0] != TaskStatus.cancelled:
            self._notices[Notice.cancel].post(task.id)
        if added:
            self._notices[Notice.outbox].post(str(added))
        return True

    # --- worker side ------------------------------------------------------------------
    async def claim(self, consumer: str, priorities: Sequence[int], block_ms: int) -> Claim | None:
        check_priorities(priorities)
        deadline = asyncio.get_running_loop().time() + block_ms / 1000
        while True:
            woken = self._queued.waiter()
            async with self._conn() as db:
                for p in priorities:
                    rows = await db.execute_fetchall(
                        "UPDATE queue SET consumer = ?, claimed_at = ? WHERE id ="
                        " (SELECT id FROM queue WHERE consumer IS NULL AND priority = ?"
                        "  ORDER BY id LIMIT 1)"
                        " RETURNING id, task_id",
                        (consumer, time.time(), p),
                    )
                    for receipt, task_id in rows:
                        return Claim(task_id, p, str(receipt))
            if block_ms <= 0 or not await _wait(woken, deadline):
                return None

    async def reclaim(self, consumer: str, min_idle_s: float, limit: int = 10) -> list[Claim]:
        """A consumer is dead when it is not in the workers table with an expiry ahead."""
        now = time.time()
        async with self._conn() as db:
            rows = await db.execute_fetchall(
                "UPDATE queue SET consumer = ?, claimed_at = ? WHERE id IN"
                " (SELECT id FROM queue WHERE consumer IS NOT NULL AND (claimed_at <= ? OR"
                "   (consumer != ? AND consumer NOT IN"
                "    (SELECT id FROM workers WHERE expires_at > ?)))"
                "  ORDER BY priority, id LIMIT ?)"
                " RETURNING id, task_id, priority",
                (consumer, now, now - min_idle_s, consumer, now, limit),
            )
        return [Claim(t, int(p), str(i)) for i, t, p in sorted(rows, key=lambda r: (r[2], r[0]))]

    async def renew(self, consumer: str, claims: Sequence[Claim]) -> None:
        """Renews the leases ``consumer`` still holds; claims taken over by another are skipped."""
        now = time.time()
        async with self._conn() as db:
            await db.executemany(
                "UPDATE queue SET claimed_at = ? WHERE id = ? AND consumer = ?",
                [(now, int(c.receipt), consumer) for c in claims],
            )

    async def ack(self, claim: Claim) -> None:
        async with self._conn() as db:
            await db.execute("DELETE FROM queue WHERE id = ?", (int(claim.receipt),))

    async def release(self, claim: Claim) -> None:
        """The entry keeps its place in the queue (ahead of later ones of its level)."""
        async with self._conn() as db:
            await db.execute(
                "UPDATE queue SET consumer = NULL, claimed_at = NULL WHERE id = ?",
                (int(claim.receipt),),
            )
        self._queued.fire()

    # --- events -----------------------------------------------------------------------
    async def read_events(
        self, task_id: str, after: str | None, block_ms: int = 0, limit: int = 100
    ) -> list[Event]:
        """Event ids are decimal row ids; an ``after`` that is not one reads from the start."""
        last = int(after) if after is not None and after.isdigit() else 0
        deadline = asyncio.get_running_loop().time() + block_ms / 1000
        signal = self._events.setdefault(task_id, _Signal())
        signal.users += 1
        try:
            while True:
                woken = signal.waiter()
                async with self._conn() as db:
                    rows = await db.execute_fetchall(
                        "SELECT id, event, data FROM events WHERE task_id = ? AND id > ?"
                        " ORDER BY id LIMIT ?",
                        (task_id, last, limit),
                    )
                if rows or block_ms <= 0 or not await _wait(woken, deadline):
                    return [Event(str(i), e, json.loads(d)) for i, e, d in rows]
        finally:
            signal.users -= 1
            if not signal.users:
                del self._events[task_id]

    # --- streamed text (delta events) -------------------------------------------------
    async def append_events(
        self, task_id: str, events: Sequence[tuple[str, dict[str, Any]]]
    ) -> bool:
        if not events:
            return True
        async with self._tx() as db:
            running = await _first(
                db,
                f"SELECT 1 FROM tasks WHERE id = ? AND status = 'running' AND {_LIVE}",
                (task_id, time.time()),
            )
            if running is None:
                return False
            await db.executemany(
                "INSERT INTO events (task_id, event, data) VALUES (?, ?, ?)",
                [(task_id, name, json.dumps(data)) for name, data in events],
            )
        if (signal := self._events.get(task_id)) is not None:
            signal.fire()
        return True

    # --- notices ----------------------------------------------------------------------
    async def read_notices(
        self, topic: Notice, after: str | None, block_ms: int
    ) -> tuple[str, list[str]]:
        """The cursor is the notice's number in this process; None starts after the last."""
        notices = self._notices[topic]
        last = notices.last if after is None else int(after)
        deadline = asyncio.get_running_loop().time() + block_ms / 1000
        while True:
            woken = notices.posted.waiter()
            got = notices.after(last)
            if got or block_ms <= 0 or not await _wait(woken, deadline):
                break
        return (str(got[-1][0]) if got else str(last)), [v for _, v in got]

    # --- webhook outbox ---------------------------------------------------------------
    async def _add_deliveries(
        self, db: aiosqlite.Connection, entries: Sequence[OutboxEntry], now: float
    ) -> int:
        """Add each entry whose id was never added (within the ttl); how many were."""
        added = 0
        for entry in entries:
            once = await db.execute(
                "INSERT OR IGNORE INTO outbox_once VALUES (?, ?)",
                (entry.webhook_id, now + self._ttl),
            )
            if once.rowcount != 1:
                continue
            await db.execute(
                "INSERT OR REPLACE INTO outbox (id, host, due_at, data, expires_at)"
                " VALUES (?, ?, ?, ?, ?)",
                (entry.webhook_id, entry.host, now, entry.to_storage(), now + self._ttl),
            )
            added += 1
        return added

    async def enqueue_deliveries(self, entries: Sequence[OutboxEntry]) -> None:
        if not entries:
            return
        async with self._tx() as db:
            added = await self._add_deliveries(db, entries, time.time())
        if added:
            self._notices[Notice.outbox].post(str(added))

    async def claim_deliveries(
        self,
        consumer: str,
        limit: int,
        lease_s: float,
        *,
        host_room: Mapping[str, int],
        per_host: int,
    ) -> tuple[list[OutboxEntry], float | None]:
        if limit < 1:
            return [], None
        now = time.time()
        room = dict(host_room)
        taken: list[OutboxEntry] = []
        async with self._tx() as db:
            due = await db.execute_fetchall(
                "SELECT id, host, data FROM outbox WHERE due_at <= ? AND expires_at > ?"
                " ORDER BY due_at, id LIMIT ?",
                (now, now, limit + _DELIVERY_SCAN),
            )
            for webhook_id, host, data in due:
                left = room.get(host, per_host)
                if left > 0 and len(taken) < limit:
                    room[host] = left - 1
                    taken.append(OutboxEntry.from_storage(data))
                    await db.execute(
                        "UPDATE outbox SET due_at = ?, owner = ? WHERE id = ?",
                        (now + lease_s, consumer, webhook_id),
                    )
                elif left <= 0:  # let other hosts by
                    await db.execute(
                        "UPDATE outbox SET due_at = ? WHERE id = ?",
                        (now + _BUSY_HOST_DEFER_S, webhook_id),
                    )
            first = await _first(db, "SELECT MIN(due_at) FROM outbox")
        return taken, None if first[0] is None else first[0] - now

    async def retry_delivery(self, consumer: str, entry: OutboxEntry, delay_s: float) -> bool:
        async with self._conn() as db:
            cur = await db.execute(
                "UPDATE outbox SET data = ?, owner = NULL, due_at = ? WHERE id = ? AND owner = ?",
                (entry.to_storage(), time.time() + delay_s, entry.webhook_id, consumer),
            )
        return cur.rowcount == 1

    async def finish_delivery(self, webhook_id: str) -> None:
        async with self._conn() as db:
            await db.execute("DELETE FROM outbox WHERE id = ?", (webhook_id,))

    async def outbox_depth(self) -> int:
        async with self._conn() as db:
            row = await _first(db, "SELECT COUNT(*) FROM outbox")
        return int(row[0])

    # --- liveness ---------------------------------------------------------------------
    async def register_worker(self, worker_id: str, ttl_s: float) -> None:
        async with self._conn() as db:
            await db.execute(
                "INSERT OR REPLACE INTO workers VALUES (?, ?)", (worker_id, time.time() + ttl_s)
            )

    async def unregister_worker(self, worker_id: str) -> None:
        async with self._conn() as db:
            await db.execute("DELETE FROM workers WHERE id = ?", (worker_id,))

    async def live_workers(self) -> int:
        async with self._conn() as db:
            row = await _first(
                db, "SELECT COUNT(*) FROM workers WHERE expires_at > ?", (time.time(),)
            )
        return int(row[0])

    # --- the OpenAI-compatible APIs: files, batches, responses --------------------------
    async def batch_pending_count(self) -> int:
        async with self._conn() as db:
            return await _backlog(db, batch=True)

    async def get_tasks(self, task_ids: Sequence[str]) -> list[Task | None]:
        found: dict[str, Task] = {}
        now = time.time()
        async with self._conn() as db:
            for start in range(0, len(task_ids), _IN_CHUNK):
                chunk = list(task_ids[start : start + _IN_CHUNK])
                marks = ",".join("?" * len(chunk))
                rows = await db.execute_fetchall(
                    f"SELECT id, data FROM tasks WHERE id IN ({marks}) AND {_LIVE}", [*chunk, now]
                )
                found |= {row[0]: Task.from_storage(row[1]) for row in rows}
        return [found.get(task_id) for task_id in task_ids]

    async def create_object(self, obj: StoredObject, *, ttl_s: float) -> bool:
        now = time.time()
        async with self._tx() as db:
            await db.execute(
                "DELETE FROM objects WHERE kind = ? AND id = ? AND expires_at <= ?",
                (obj.kind, obj.id, now),
            )
            cur = await db.execute(
                "INSERT OR IGNORE INTO objects VALUES (?, ?, ?, ?, 0, ?, ?, ?)",
                (
                    obj.kind,
                    obj.id,
                    obj.owner,
                    obj.sort_key,
                    int(obj.active),
                    json.dumps(obj.data),
                    now + ttl_s,
                ),
            )
        if cur.rowcount == 1:
            obj.rev = 0
        return cur.rowcount == 1

    async def get_object(self, kind: str, obj_id: str) -> StoredObject | None:
        async with self._conn() as db:
            row = await _first(
                db,
                f"SELECT {_OBJECT_COLUMNS} FROM objects"
                " WHERE kind = ? AND id = ? AND expires_at > ?",
                (kind, obj_id, time.time()),
            )
        return None if row is None else _object(row)

    async def update_object(self, obj: StoredObject, *, ttl_s: float | None = None) -> bool:
        now = time.time()
        async with self._conn() as db:
            cur = await db.execute(
                "UPDATE objects SET data = ?, rev = rev + 1, active = ?,"
                " expires_at = COALESCE(?, expires_at)"
                " WHERE kind = ? AND id = ? AND rev = ? AND expires_at > ?",
                (
                    json.dumps(obj.data),
                    int(obj.active),
                    None if ttl_s is None else now + ttl_s,
                    obj.kind,
                    obj.id,
                    obj.rev,
                    now,
                ),
            )
        if cur.rowcount == 1:
            obj.rev += 1
        return cur.rowcount == 1

    async def delete_object(self, kind: str, obj_id: str) -> bool:
        async with self._conn() as db:
            cur = await db.execute(
                "DELETE FROM objects WHERE kind = ? AND id = ? AND expires_at > ?",
                (kind, obj_id, time.time()),
            )
        return cur.rowcount == 1

    async def list_objects(
        self, kind: str, owner: str, *, after: str | None, limit: int
    ) -> tuple[list[StoredObject], bool]:
        if limit < 1:
            raise ValueError("limit must be at least 1")
        sql = (
            f"SELECT {_OBJECT_COLUMNS} FROM objects WHERE kind = ? AND owner = ? AND expires_at > ?"
        )
        params: list[Any] = [kind, owner, time.time()]
        if after is not None:
            last = await self.get_object(kind, after)
            if last is None or last.owner != owner:
                raise ValueError(f"unknown cursor {after!r}")
            sql += " AND sort_key < ?"
            params.append(last.sort_key)
        sql += " ORDER BY sort_key DESC LIMIT ?"
        params.append(limit + 1)
        async with self._conn() as db:
            rows = await db.execute_fetchall(sql, params)
        objects = [_object(row) for row in rows]
        return objects[:limit], len(objects) > limit

    async def active_objects(self, kind: str) -> list[str]:
        async with self._conn() as db:
            rows = await db.execute_fetchall(
                "SELECT id FROM objects WHERE kind = ? AND active = 1 AND expires_at > ?"
                " ORDER BY sort_key",
                (kind, time.time()),
            )
        return [row[0] for row in rows]

    async def put_blob(self, key: str, data: str, *, ttl_s: float) -> None:
        async with self._conn() as db:
            await db.execute(
                "INSERT OR REPLACE INTO blobs VALUES (?, ?, ?)", (key, data, time.time() + ttl_s)
            )

    async def get_blob(self, key: str) -> str | None:
        async with self._conn() as db:
            row = await _first(
                db, "SELECT data FROM blobs WHERE key = ? AND expires_at > ?", (key, time.time())
            )
        return None if row is None else str(row[0])

    async def delete_blob(self, key: str) -> None:
        async with self._conn() as db:
            await db.execute("DELETE FROM blobs WHERE key = ?", (key,))

    async def put_part(self, key: str, index: int, data: str, *, ttl_s: float) -> None:
        async with self._conn() as db:
            await db.execute(
                "INSERT OR REPLACE INTO parts VALUES (?, ?, ?, ?)",
                (key, index, data, time.time() + ttl_s),
            )

    async def get_parts(self, key: str) -> dict[int, str]:
        async with self._conn() as db:
            rows = await db.execute_fetchall(
                "SELECT idx, data FROM parts WHERE key = ? AND expires_at > ?", (key, time.time())
            )
        return {int(i): str(data) for i, data in rows}

    async def delete_parts(self, key: str) -> None:
        async with self._conn() as db:
            await db.execute("DELETE FROM parts WHERE key = ?", (key,))

    async def acquire_lease(self, name: str, holder: str, ttl_s: float) -> bool:
        now = time.time()
        async with self._conn() as db:
            cur = await db.execute(
                "INSERT INTO leases VALUES (?, ?, ?) ON CONFLICT (name) DO UPDATE SET"
                " holder = excluded.holder, expires_at = excluded.expires_at"
                " WHERE leases.holder = excluded.holder OR leases.expires_at <= ?",
                (name, holder, now + ttl_s, now),
            )
        return cur.rowcount == 1

    async def release_lease(self, name: str, holder: str) -> None:
        async with self._conn() as db:
            await db.execute("DELETE FROM leases WHERE name = ? AND holder = ?", (name, holder))


_IN_CHUNK = 500  # ids per IN (...) query, well under SQLite's variable limit

_OBJECTS_SCHEMA = """
CREATE TABLE IF NOT EXISTS objects (
    kind TEXT NOT NULL,
    id TEXT NOT NULL,
    owner TEXT NOT NULL,
    sort_key TEXT NOT NULL,
    rev INTEGER NOT NULL,
    active INTEGER NOT NULL,
    data TEXT NOT NULL,
    expires_at REAL NOT NULL,
    PRIMARY KEY (kind, id)
);
CREATE INDEX IF NOT EXISTS objects_by_owner ON objects (kind, owner, sort_key);
CREATE INDEX IF NOT EXISTS objects_active ON objects (kind, sort_key) WHERE active = 1;
CREATE TABLE IF NOT EXISTS blobs (
    key TEXT PRIMARY KEY,
    data TEXT NOT NULL,
    expires_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS parts (
    key TEXT NOT NULL,
    idx INTEGER NOT NULL,
    data TEXT NOT NULL,
    expires_at REAL NOT NULL,
    PRIMARY KEY (key, idx)
);
CREATE TABLE IF NOT EXISTS leases (
    name TEXT PRIMARY KEY,
    holder TEXT NOT NULL,
    expires_at REAL NOT NULL
);
"""
_OBJECT_COLUMNS = "kind, id, owner, sort_key, rev, active, data"


async def _add_objects_schema(db: aiosqlite.Connection) -> None:
    """The tables of the OpenAI-compatible APIs, and the tasks' ``lane`` column (added to
    a file made before it existed)."""
    await db.executescript(_OBJECTS_SCHEMA)
    columns = {row[1] for row in await db.execute_fetchall("PRAGMA table_info(tasks)")}
    if "lane" not in columns:
        await db.execute("ALTER TABLE tasks ADD COLUMN lane TEXT")


async def _purge_objects(db: aiosqlite.Connection, now: float) -> None:
    for table in ("objects", "blobs", "parts", "leases"):
        await db.execute(f"DELETE FROM {table} WHERE expires_at <= ?", (now,))


async def _backlog(db: aiosqlite.Connection, *, batch: bool) -> int:
    """Pending tasks of one lane: batch lines, or every other task."""
    lane = "lane = 'batch'" if batch else "lane IS NULL"
    row = await _first(db, f"SELECT COUNT(*) FROM tasks WHERE status = 'pending' AND {lane}")
    return int(row[0])


def _object(row: Sequence[Any]) -> StoredObject:
    kind, obj_id, owner, key, rev, active, data = row
    return StoredObject(kind, obj_id, owner, key, json.loads(data), int(rev), bool(active))
