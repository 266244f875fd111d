"""What the store hands out and takes in, beside tasks: claims, events, notices, objects,
and the terms of a task's admission and of a claim of webhook deliveries."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Literal

from ponder.config import NUM_PRIORITIES
from ponder.config.models import DEFAULT_MODEL
from ponder.ids import parse_task_id
from ponder.types import Task, TaskStatus

__all__ = [
    "Admission",
    "Claim",
    "Event",
    "HostRoom",
    "ModelState",
    "Notice",
    "StoredObject",
    "check_new_task",
    "check_page",
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


def check_page(limit: int, cursor: str | None) -> None:
    """ValueError unless ``limit`` is at least 1 and ``cursor`` (if any) is a task id."""
    if limit < 1:
        raise ValueError("limit must be at least 1")
    if cursor is not None and parse_task_id(cursor) is None:
        raise ValueError(f"invalid cursor {cursor!r}")


@dataclass(frozen=True)
class Admission:
    """How a new task is admitted (:meth:`TaskStore.create_task`): against ``max_pending``
    pending tasks of its lane (``batch``: the batch lines'), once per ``idempotency_key``
    of its owner, the request's ``body_hash`` telling a repeat from a conflict."""

    max_pending: int
    idempotency_key: str | None = None
    body_hash: str | None = None
    batch: bool = False


@dataclass(frozen=True)
class HostRoom:
    """How many more delivery attempts each host may get (:meth:`TaskStore.claim_deliveries`):
    ``busy`` for the hosts the caller is sending to, ``per_host`` for any other."""

    per_host: int
    busy: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Claim:
    """A queue entry handed to one worker. ``receipt`` identifies it for ack and renew.

    ``record`` is a stored record of the task (:meth:`~ponder.types.Task.to_storage`) that
    the store had at hand with the claim (:meth:`WorkQueue.claim` may give one; None: not
    read, or the task is gone): the one stored at the claim, or, on a first delivery, the
    one the task was admitted with, which a change made while it waited (a cancel) has
    replaced since: the worker's first write, a compare-and-set over the record's
    revision, finds that out. It is not part of the claim's identity.
    """

    task_id: str
    priority: int
    receipt: str
    record: str | None = field(default=None, compare=False, repr=False)
    #: the model whose queue the entry is in (:attr:`ponder.types.Task.model`)
    model: str = DEFAULT_MODEL


@dataclass(frozen=True)
class ModelState:
    """A model as one live worker serves it (:meth:`Liveness.register_worker`):
    ``loaded`` (its engine runs), ``loading``, or ``unloaded`` (it loads on its next
    task); ``resident_mb``: the loaded engine's resident memory (None: not measured, or
    a remote server's)."""

    model: str
    worker: str
    state: Literal["loaded", "loading", "unloaded"]
    resident_mb: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "worker": self.worker,
            "state": self.state,
            "resident_mb": self.resident_mb,
        }


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
    #: a client follows a task's text; the notice carries its id (workers write that
    #: task's ``delta`` events: see :mod:`ponder.deltas`)
    follow = "follow"


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
