"""Moved to :mod:`ponder.store.deliveries` (the store adds a task's deliveries itself);
importable from here until the last importer has moved."""

from __future__ import annotations

from ponder.store.deliveries import (
    EVENTS,
    PRELIMINARY,
    OutboxEntry,
    task_deliveries,
    terminal_event,
    webhook_id,
)

__all__ = [
    "EVENTS",
    "PRELIMINARY",
    "OutboxEntry",
    "task_deliveries",
    "terminal_event",
    "webhook_id",
]
