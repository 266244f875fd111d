"""Stores: choose the implementation from the settings in one place."""

from __future__ import annotations

from ponder.config import Settings
from ponder.store.base import Claim, Event, TaskStore

__all__ = ["Claim", "Event", "TaskStore", "create_store"]


def create_store(settings: Settings) -> TaskStore:
    """Redis when ``PONDER_REDIS_URL`` is set, else the embedded SQLite store."""
    if settings.redis_url:
        from ponder.store.redis import RedisStore

        return RedisStore(settings)
    from ponder.store.sqlite import SqliteStore

    return SqliteStore(settings)
