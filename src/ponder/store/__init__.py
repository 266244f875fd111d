"""Stores: choose the implementation from the settings in one place; start one patiently."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from ponder.config import Settings
from ponder.errors import StoreUnavailable
from ponder.store.base import Claim, Event, Notice, OutboxEntry, TaskStore

__all__ = [
    "Claim",
    "Event",
    "Notice",
    "OutboxEntry",
    "TaskStore",
    "create_store",
    "start_store",
]

log = logging.getLogger("ponder.store")

_RETRY_S = (0.1, 5.0)  # first and longest wait between attempts


def create_store(settings: Settings) -> TaskStore:
    """Redis when ``PONDER_REDIS_URL`` is set, else the embedded SQLite store."""
    if settings.redis_url:
        from ponder.store.redis import RedisStore

        return RedisStore(settings)
    from ponder.store.sqlite import SqliteStore

    return SqliteStore(settings)


async def start_store(
    store: TaskStore, *, attempts: int | None = None, stop: asyncio.Event | None = None
) -> bool:
    """Start ``store``, retrying with back-off while it cannot be reached.

    Logs one line per failed attempt ("waiting for Redis at redis://…: <why>"), no
    traceback. True once started; False after ``attempts`` failures, or when ``stop`` is
    set first (a shutdown during the wait).
    """
    delay_s = _RETRY_S[0]
    failed = 0
    while True:
        try:
            await store.start()
        except StoreUnavailable as e:
            failed += 1
            log.warning("waiting for %s: %s", store.describe(), e.__cause__ or e)
        else:
            if failed:
                log.info("%s answers", store.describe())
            return True
        if attempts is not None and failed >= attempts:
            return False
        if stop is None:
            await asyncio.sleep(delay_s)
        else:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), delay_s)
            if stop.is_set():
                return False
        delay_s = min(delay_s * 2, _RETRY_S[1])
