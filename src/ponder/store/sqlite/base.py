"""What every part of the SQLite store shares: the connection and its lock, the
transaction, the in-process wake-ups and notices, the lifecycle and the error mapping."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import time
from collections import deque
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import aiosqlite

from ponder.config import Settings
from ponder.errors import StoreUnavailable
from ponder.store.contract import Lifecycle
from ponder.store.records import Notice
from ponder.store.sqlite.schema import create_schema, purge_expired

__all__ = ["NOTICES_KEPT", "PURGE_INTERVAL_S", "SqliteBase"]

PURGE_INTERVAL_S = 60.0
#: notices kept per topic
NOTICES_KEPT = 1000


@contextmanager
def unavailable() -> Iterator[None]:
    """Turn failures to use the database file (locked, unreadable) into StoreUnavailable."""
    try:
        yield
    except sqlite3.OperationalError as e:
        raise StoreUnavailable(f"the SQLite store is unavailable: {e}") from e


class Notices:
    """One notice topic: the last :data:`NOTICES_KEPT` notices, numbered from 1."""

    def __init__(self) -> None:
        self.kept: deque[tuple[int, str]] = deque(maxlen=NOTICES_KEPT)
        self.last = 0
        self.posted = Signal()

    def post(self, value: str) -> None:
        self.last += 1
        self.kept.append((self.last, value))
        self.posted.fire()

    def after(self, seq: int) -> list[tuple[int, str]]:
        return [(n, v) for n, v in self.kept if n > seq]


class Signal:
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


async def first(db: aiosqlite.Connection, sql: str, params: Sequence[Any] = ()) -> Any:
    """The first row of a query, or None."""
    return next(iter(await db.execute_fetchall(sql, params)), None)


async def wait(event: asyncio.Event, deadline: float) -> bool:
    """Wait for ``event`` until the loop-clock ``deadline``; False on timeout."""
    try:
        async with asyncio.timeout_at(deadline):
            await event.wait()
    except TimeoutError:
        return False
    return True


class SqliteBase(Lifecycle):
    """The connection, lock, signals and notices of :class:`~ponder.store.sqlite.SqliteStore`,
    and its lifecycle; each part of the store is a subclass of this one."""

    def __init__(self, settings: Settings) -> None:
        self._path = Path(settings.sqlite_path).expanduser()
        self._ttl = settings.task_ttl_s
        self._timeout = settings.store_timeout_s
        self._db: aiosqlite.Connection | None = None
        self._lock = asyncio.Lock()
        self._queued = Signal()
        self._events: dict[str, Signal] = {}
        self._notices = {topic: Notices() for topic in Notice}
        self._purged_at = 0.0

    # --- plumbing ---------------------------------------------------------------------
    @asynccontextmanager
    async def _conn(self) -> AsyncIterator[aiosqlite.Connection]:
        """The connection, held alone: for single statements."""
        async with self._lock:
            if self._db is None:
                raise StoreUnavailable(f"the SQLite store at {self._path} is not open")
            with unavailable():
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

    async def _changed_one(self, sql: str, params: Sequence[Any]) -> bool:
        """Run one statement alone; whether it changed a row (the writes that change one
        row or none: a compare-and-set, a conditional delete)."""
        async with self._conn() as db:
            cur = await db.execute(sql, params)
        return cur.rowcount == 1

    async def _purge(self, db: aiosqlite.Connection, now: float) -> None:
        await purge_expired(db, now)
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
        with unavailable():
            db = await aiosqlite.connect(self._path, timeout=self._timeout, isolation_level=None)
            try:
                await db.execute("PRAGMA journal_mode=WAL")
                await db.execute("PRAGMA synchronous=NORMAL")
                await create_schema(db)
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
