"""Event logs and notices on Redis: one stream per task, one per notice topic."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from ponder.store.contract import EventLog
from ponder.store.records import Event, Notice
from ponder.store.redis.base import RedisBase, unavailable

__all__ = ["RedisEventLog"]

_STREAM_ID = re.compile(r"^\d+(-\d+)?$")


class RedisEventLog(RedisBase, EventLog):
    """:class:`EventLog` on Redis Streams: event ids and notice cursors are stream ids."""

    # --- events -----------------------------------------------------------------------
    async def read_events(
        self, task_id: str, after: str | None, block_ms: int = 0, limit: int = 100
    ) -> list[Event]:
        """Event ids are stream ids; an ``after`` that is not one reads from the start.

        A blocking read is one XREAD BLOCK: it answers at once when events follow
        ``after``, so no XRANGE goes first."""
        key = self._events_key(task_id)
        if after is not None and not _STREAM_ID.match(after):
            after = None
        async with unavailable(self._blocking(block_ms)):
            if block_ms > 0:
                entries = await self._read_stream(key, after or "0-0", limit, block_ms)
            else:
                entries = await self._r.xrange(
                    key, "-" if after is None else f"({after}", "+", limit
                )
        return [Event(i, f["event"], json.loads(f["data"])) for i, f in entries]

    async def _read_stream(self, key: str, after: str, limit: int, block_ms: int) -> Any:
        reply: Any = await self._rb.xread({key: after}, count=limit, block=block_ms)
        return [entry for _, stream_entries in reply for entry in stream_entries]

    # --- streamed text (delta events) -------------------------------------------------
    async def append_events(
        self, task_id: str, events: Sequence[tuple[str, dict[str, Any]]]
    ) -> bool:
        if not events:
            return True
        args = [part for name, data in events for part in (name, json.dumps(data))]
        keys = [self._task_key(task_id), self._events_key(task_id)]
        async with unavailable(self._timeout):
            return bool(await self._append(keys=keys, args=args))

    # --- notices ----------------------------------------------------------------------
    async def post_notice(self, topic: Notice, value: str) -> None:
        key = self._notice_key(topic)
        async with unavailable(self._timeout):
            await self._lane.call("XADD", key, "MAXLEN", "~", 1000, "*", "v", value)

    async def read_notices(
        self, topic: Notice, after: str | None, block_ms: int
    ) -> tuple[str, list[str]]:
        """The cursor is a stream id; None starts after the newest notice."""
        key = self._notice_key(topic)
        async with unavailable(self._blocking(block_ms)):
            if after is None:
                newest: Any = await self._r.xrevrange(key, "+", "-", count=1)
                after = newest[0][0] if newest else "0-0"
            entries: Any
            if block_ms > 0:
                entries = await self._read_stream(key, after, 100, block_ms)
            else:
                entries = await self._r.xrange(key, f"({after}", "+", 100)
        if not entries:
            return after, []
        return entries[-1][0], [fields["v"] for _, fields in entries]
