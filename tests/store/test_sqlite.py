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
from ponder.errors import StoreUnavailable
from ponder.store.sqlite import SqliteStore
from ponder.types import TaskStatus
from tests.conftest import open_store

from .helpers import ALL, add, advance


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
