"""SqliteStore beyond the contract: restarts, expiry, the file itself."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from ponder.config import Settings
from ponder.config.models import DEFAULT_MODEL
from ponder.errors import StoreUnavailable
from ponder.ids import sort_key
from ponder.store.sqlite import SqliteStore
from ponder.types import TaskStatus
from tests.conftest import open_store

from .helpers import ALL, add, advance, make_task


@pytest.fixture
async def store(sqlite_settings: Settings) -> AsyncIterator[SqliteStore]:
    async with open_store(sqlite_settings) as s:
        assert isinstance(s, SqliteStore)
        yield s


def query(settings: Settings, sql: str, *params: object) -> list[tuple[object, ...]]:
    """Read or change the file directly, as another connection would."""
    with sqlite3.connect(settings.sqlite_path) as db:
        rows = db.execute(sql, params).fetchall()
    db.close()
    return rows


async def test_the_file_uses_wal(store: SqliteStore, sqlite_settings: Settings) -> None:
    assert query(sqlite_settings, "PRAGMA journal_mode") == [("wal",)]


async def test_start_and_close_are_idempotent(sqlite_settings: Settings) -> None:
    store = SqliteStore(sqlite_settings)
    await store.start()
    await store.start()
    await store.close()
    await store.close()
    assert not await store.ping()


async def test_tasks_survive_a_restart_and_abandoned_claims_run_again(
    sqlite_settings: Settings,
) -> None:
    first = SqliteStore(sqlite_settings)
    await first.start()
    claimed, queued = await add(first, 1), await add(first, 4)
    claim = await first.claim("w", ALL, 0)
    assert claim is not None and claim.task_id == claimed.id
    await first.close()

    second = SqliteStore(sqlite_settings)
    await second.start()
    try:
        assert await second.get_task(queued.id) == queued
        again = [await second.claim("w2", ALL, 0) for _ in range(3)]
        assert [c.task_id for c in again if c] == [claimed.id, queued.id]
        assert await second.pending_count() == 2
    finally:
        await second.close()


async def test_terminal_tasks_get_an_expiry(store: SqliteStore, sqlite_settings: Settings) -> None:
    task = await add(store)
    expiry = "SELECT expires_at FROM tasks WHERE id = ?"
    await advance(store, task, TaskStatus.running)
    assert query(sqlite_settings, expiry, task.id) == [(None,)]
    before = time.time()
    await advance(store, task, TaskStatus.failed)
    ((expires_at,),) = query(sqlite_settings, expiry, task.id)
    assert isinstance(expires_at, float)
    assert before + sqlite_settings.task_ttl_s <= expires_at <= time.time() + 86_400


async def test_expired_tasks_vanish_and_are_purged_on_start(sqlite_settings: Settings) -> None:
    store = SqliteStore(sqlite_settings)
    await store.start()
    task, kept = await add(store, owner="k"), await add(store, owner="k")
    await advance(store, task, TaskStatus.cancelled)
    query(sqlite_settings, "UPDATE tasks SET expires_at = 1 WHERE id = ?", task.id)
    try:
        assert await store.get_task(task.id) is None
        listed, _ = await store.list_tasks("k", status=None, limit=10, cursor=None)
        assert [t.id for t in listed] == [kept.id]
        assert not await store.update_task(task)
    finally:
        await store.close()

    restarted = SqliteStore(sqlite_settings)
    await restarted.start()
    await restarted.close()
    for table in ("tasks", "events", "queue"):
        sql = f"SELECT COUNT(*) FROM {table} WHERE {'id' if table == 'tasks' else 'task_id'} = ?"
        assert query(sqlite_settings, sql, task.id) == [(0,)]
    assert query(sqlite_settings, "SELECT COUNT(*) FROM tasks") == [(1,)]


async def test_an_unusable_file_raises_store_unavailable(
    sqlite_settings: Settings, tmp_path: Path
) -> None:
    store = SqliteStore(sqlite_settings.model_copy(update={"sqlite_path": str(tmp_path)}))
    with pytest.raises(StoreUnavailable):
        await store.start()
    assert not await store.ping()


async def test_a_write_cancelled_at_any_point_leaves_the_store_usable(store: SqliteStore) -> None:
    """Regression (seen after cancels became notices): a cancel that landed while BEGIN ran
    in aiosqlite's thread left the connection inside a transaction, and every later write
    failed with "cannot start a transaction within a transaction"."""
    task = await add(store)
    for yields in range(12):
        fresh = await store.get_task(task.id)
        assert fresh is not None
        fresh.metadata = {"n": yields}
        write = asyncio.create_task(store.update_task(fresh, [("status", {"n": yields})]))
        for _ in range(yields):
            await asyncio.sleep(0)
        write.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await write
        other = await add(store)  # a write after it still works
        assert await store.get_task(other.id) is not None


# --- several models (#45) ---------------------------------------------------------------
#: the tables that changed, as a file made before there were models has them
OLD_TABLES = """
CREATE TABLE tasks (id TEXT PRIMARY KEY, owner TEXT NOT NULL, status TEXT NOT NULL,
    priority INTEGER NOT NULL, sort_key TEXT NOT NULL, rev INTEGER NOT NULL,
    data TEXT NOT NULL, expires_at REAL, lane TEXT);
CREATE INDEX tasks_by_status ON tasks (status, priority);
CREATE TABLE queue (id INTEGER PRIMARY KEY AUTOINCREMENT, task_id TEXT NOT NULL,
    priority INTEGER NOT NULL, consumer TEXT, claimed_at REAL);
CREATE INDEX queue_ready ON queue (priority, id) WHERE consumer IS NULL;
CREATE TABLE workers (id TEXT PRIMARY KEY, expires_at REAL NOT NULL);
"""


async def test_a_file_from_before_models_is_migrated_and_its_tasks_are_the_default_models(
    sqlite_settings: Settings,
) -> None:
    old = make_task(2)
    with sqlite3.connect(sqlite_settings.sqlite_path) as db:
        db.executescript(OLD_TABLES)
        db.execute(
            "INSERT INTO tasks VALUES (?, '', 'pending', 2, ?, 0, ?, NULL, NULL)",
            (old.id, sort_key(old.id), old.to_storage()),
        )
        db.execute("INSERT INTO queue (task_id, priority) VALUES (?, 2)", (old.id,))
        db.execute("INSERT INTO workers VALUES ('w', 1e12)")
    db.close()
    async with open_store(sqlite_settings) as store:
        assert await store.queue_depths(DEFAULT_MODEL) == {p: int(p == 2) for p in ALL}
        claim = await store.claim("w", ALL, 0)
        assert claim is not None and (claim.task_id, claim.model) == (old.id, DEFAULT_MODEL)
        assert await store.served_models() == []  # a row without model states
        await add(store, 2, model="big")
        assert await store.expire_due() == []
    indexes = {row[0] for row in query(sqlite_settings, "SELECT name FROM sqlite_master")}
    assert {"queue_ready_by_model", "tasks_by_deadline"} <= indexes
    assert "queue_ready" not in indexes


async def test_a_claim_uses_the_index_of_its_models_queue(
    store: SqliteStore, sqlite_settings: Settings
) -> None:
    plan = query(
        sqlite_settings,
        "EXPLAIN QUERY PLAN SELECT id FROM queue WHERE consumer IS NULL AND model = ?"
        " AND priority = ? ORDER BY id LIMIT 1",
        "big",
        2,
    )
    assert any("queue_ready_by_model" in str(row[-1]) for row in plan)
