"""Event logs and notices in SQLite: the ``events`` table; notices live in memory only."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from typing import Any

from ponder.store.contract import EventLog
from ponder.store.records import Event, Notice
from ponder.store.sqlite.base import Signal, SqliteBase, first, wait
from ponder.store.sqlite.schema import LIVE

__all__ = ["SqliteEventLog"]


class SqliteEventLog(SqliteBase, EventLog):
    """:class:`EventLog` in SQLite: event ids are row ids, notice cursors are numbers."""

    # --- events -----------------------------------------------------------------------
    async def read_events(
        self, task_id: str, after: str | None, block_ms: int = 0, limit: int = 100
    ) -> list[Event]:
        """Event ids are decimal row ids; an ``after`` that is not one reads from the start."""
        last = int(after) if after is not None and after.isdigit() else 0
        deadline = asyncio.get_running_loop().time() + block_ms / 1000
        signal = self._events.setdefault(task_id, Signal())
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
                if rows or block_ms <= 0 or not await wait(woken, deadline):
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
            running = await first(
                db,
                f"SELECT 1 FROM tasks WHERE id = ? AND status = 'running' AND {LIVE}",
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
    async def post_notice(self, topic: Notice, value: str) -> None:
        self._notices[topic].post(value)

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
            if got or block_ms <= 0 or not await wait(woken, deadline):
                break
        return (str(got[-1][0]) if got else str(last)), [v for _, v in got]
