"""The webhook outbox: what a durable delivery row holds, and which rows a task write adds.

A webhook is not sent by the code that caused it. The write that causes it (a task
reaching a terminal state, a preliminary answer) also writes an :class:`OutboxEntry` in
the same atomic step (one Lua script on Redis, one SQLite transaction), and a delivery
loop (:class:`ponder.webhooks.WebhookSender`, run by every worker process) sends it on the
retry schedule. So a queue entry is acknowledged as soon as its task ends, a dead
receiver holds no worker slot, and a crash at any point loses no webhook: the row stays
until it is delivered or given up, with its attempt count and the time of its next
attempt (the store keeps the schedule).

A row is generic: its event type, the target URL, either a task to build the body from
(``task_id``, attempts are then recorded on the task's ``callback.deliveries``) or a
ready body (``body``, sent as given), an optional secret (else ``PONDER_WEBHOOK_SECRET``)
and its ``webhook_id``, which is also its key: a row is added once per id (for
``task_ttl_s``; adding it again changes nothing), and a receiver de-duplicates on it.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

from pydantic import BaseModel, Field, model_validator

from ponder.types import EventName, Task, TaskStatus

__all__ = [
    "EVENTS",
    "PRELIMINARY",
    "OutboxEntry",
    "task_deliveries",
    "terminal_event",
    "webhook_id",
]

_TERMINAL_EVENTS = {
    TaskStatus.done: "task.completed",
    TaskStatus.partial_done: "task.partial",
    TaskStatus.failed: "task.failed",
    TaskStatus.cancelled: "task.cancelled",
    TaskStatus.expired: "task.expired",
}
PRELIMINARY = "task.preliminary"
#: every event a task's callback receives
EVENTS = frozenset({PRELIMINARY, *_TERMINAL_EVENTS.values()})


def terminal_event(status: TaskStatus | str) -> str:
    """The webhook event of a terminal status (``done`` → ``task.completed``, …)."""
    try:
        return _TERMINAL_EVENTS[TaskStatus(status)]
    except (KeyError, ValueError):
        raise ValueError(f"{status!r} is not a terminal status") from None


def webhook_id(task_id: str, event: str) -> str:
    """The ``webhook-id`` of one event of one task: stable across retries and workers."""
    return f"msg_{task_id}_{event}"


class OutboxEntry(BaseModel):
    """One webhook to send (a row of the outbox). See the module docstring."""

    webhook_id: str = Field(min_length=1, description="Standard Webhooks id; the row's key")
    event: str = Field(min_length=1, description="the body's `type`, e.g. task.completed")
    url: str = Field(description="where to POST; checked by the SSRF guard before each attempt")
    task_id: str | None = Field(
        default=None, description="build the body from this task at send time; record on it"
    )
    body: dict[str, Any] | None = Field(default=None, description="or send this body as given")
    secret: str | None = Field(
        default=None, description="`whsec_…` signing secret; None: PONDER_WEBHOOK_SECRET"
    )
    attempts: int = Field(default=0, ge=0, description="attempts made so far")
    created_at: float = Field(default_factory=time.time, description="epoch seconds")

    @model_validator(mode="after")
    def _one_source(self) -> OutboxEntry:
        if (self.task_id is None) == (self.body is None):
            raise ValueError("an outbox entry needs exactly one of task_id or body")
        return self

    @property
    def host(self) -> str:
        """``host:port`` of the URL: the per-host concurrency limit counts by it."""
        parts = urlsplit(self.url)
        return parts.netloc.rpartition("@")[2].lower()

    def to_storage(self) -> str:
        return self.model_dump_json()

    @classmethod
    def from_storage(cls, raw: str | bytes) -> OutboxEntry:
        return cls.model_validate_json(raw)


def task_deliveries(task: Task, events: Sequence[tuple[str, dict[str, Any]]]) -> list[OutboxEntry]:
    """The webhooks a write of ``task`` (with its log ``events``) causes: the terminal
    event of a terminal task, ``task.preliminary`` when the write carries a preliminary
    answer. The store adds each id once, so only the write that ends the task sends its
    end (not the later ones that record deliveries), and only the first preliminary
    answer of a task is sent."""
    if task.callback is None:
        return []
    url = task.callback.url
    events_sent = [terminal_event(task.status)] if task.status in _TERMINAL_EVENTS else []
    if any(name == EventName.preliminary for name, _ in events):
        events_sent.append(PRELIMINARY)
    return [
        OutboxEntry(webhook_id=webhook_id(task.id, event), event=event, url=url, task_id=task.id)
        for event in events_sent
    ]
