"""What the store hands out and takes in, beside tasks: claims, events, notices, objects."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from ponder.config import NUM_PRIORITIES
from ponder.types import Task, TaskStatus

__all__ = [
    "Claim",
    "Event",
    "Notice",
    "StoredObject",
    "check_new_task",
    "check_priorities",
]


def check_priorities(priorities: Sequence[int]) -> None:
    """ValueError unless ``priorities`` is a non-empty list of levels 0..5."""
    if not priorities or any(not 0 <= p < NUM_PRIORITIES for p in priorities):
        raise ValueError(f"priorities must be levels 0..{NUM_PRIORITIES - 1}, at least one")


def check_new_task(task: Task) -> None:
    """ValueError unless ``task`` can be created: pending, with a valid priority."""
    if task.status is not TaskStatus.pending:
        raise ValueError("a new task must be pending")
    check_priorities([task.priority])


@dataclass(frozen=True)
class Claim:
    """A queue entry handed to one worker. ``receipt`` identifies it for ack and renew."""

    task_id: str
    priority: int
    receipt: str


@dataclass(frozen=True)
class Event:
    """One entry of a task's event log (the SSE / WebSocket stream)."""

    id: str
    event: str
    data: dict[str, Any]


class Notice(StrEnum):
    """The store's notice topics: wake-ups that cross processes (:meth:`TaskStore.read_notices`)."""

    #: a task was cancelled; the notice carries its id (workers stop running it)
    cancel = "cancel"
    #: webhook deliveries were added to the outbox (delivery loops look for due ones)
    outbox = "outbox"


@dataclass
class StoredObject:
    """A record of the OpenAI-compatible APIs (a file, a batch, a response).

    ``sort_key`` (no spaces) orders an owner's objects (newest last); ``rev`` is the revision the
    record was read at (:meth:`TaskStore.update_object` writes only over it); an
    ``active`` object is one that :meth:`TaskStore.active_objects` lists (work left).
    """

    kind: str
    id: str
    owner: str
    sort_key: str
    data: dict[str, Any]
    rev: int = 0
    active: bool = False
