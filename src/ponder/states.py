"""The task state machine: the transitions of API.md and nothing else.

::

    pending ──► running ──► done | partial_done | failed
       │  │        │
       │  └────────┴──► cancelled
       └──► expired  (not started within its queue_timeout_s)

Terminal states never change. Only workers move a task forward (``running`` and the
ends); the API creates tasks (``pending``) and cancels them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from ponder.errors import InvalidTransition
from ponder.types import EventName, TaskStatus

__all__ = [
    "STATUS_EVENTS",
    "TERMINAL",
    "TRANSITIONS",
    "check_transition",
    "is_final",
    "is_terminal",
]

TRANSITIONS: dict[TaskStatus, frozenset[TaskStatus]] = {
    TaskStatus.pending: frozenset({TaskStatus.running, TaskStatus.cancelled, TaskStatus.expired}),
    TaskStatus.running: frozenset(
        {TaskStatus.done, TaskStatus.partial_done, TaskStatus.failed, TaskStatus.cancelled}
    ),
    TaskStatus.done: frozenset(),
    TaskStatus.partial_done: frozenset(),
    TaskStatus.failed: frozenset(),
    TaskStatus.cancelled: frozenset(),
    TaskStatus.expired: frozenset(),
}

TERMINAL: frozenset[TaskStatus] = frozenset(s for s, nxt in TRANSITIONS.items() if not nxt)


def is_terminal(status: TaskStatus | str) -> bool:
    return TaskStatus(status) in TERMINAL


#: the kinds of event (of a task's event stream) that carry the task's status
STATUS_EVENTS: tuple[EventName, ...] = (EventName.status, EventName.result)
_TERMINAL_VALUES = frozenset(s.value for s in TERMINAL)


class _Event(Protocol):
    """An event of a task's stream: the store's record, or the SDK's ``TaskEvent``."""

    @property
    def event(self) -> str: ...

    @property
    def data(self) -> Mapping[str, Any]: ...


def is_final(event: _Event) -> bool:
    """True for the event that carries a terminal status: the last of a task's stream."""
    return event.event in STATUS_EVENTS and event.data.get("status") in _TERMINAL_VALUES


def check_transition(old: TaskStatus | str, new: TaskStatus | str) -> None:
    """Raise :class:`InvalidTransition` unless ``old -> new`` is allowed."""
    old, new = TaskStatus(old), TaskStatus(new)
    if new not in TRANSITIONS[old]:
        raise InvalidTransition(f"a task cannot go from {old.value} to {new.value}")


def sources_of(new: TaskStatus) -> frozenset[TaskStatus]:
    """The states from which ``new`` may be reached (used by the stores' atomic updates)."""
    return frozenset(old for old, nxt in TRANSITIONS.items() if new in nxt)
