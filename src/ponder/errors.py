"""The exception hierarchy of ponder.

Recoverable failures (a sample can be retried, a store call can be tried again later)
derive from :class:`RecoverableError`; the rest are fatal for the operation at hand.
"""

from __future__ import annotations

__all__ = [
    "BatcherFull",
    "ConfigError",
    "EngineBusy",
    "EngineDeadError",
    "EngineError",
    "IdempotencyConflict",
    "InvalidTransition",
    "PonderError",
    "QueueFull",
    "RecoverableError",
    "StoreUnavailable",
]


class PonderError(Exception):
    """Base class of every error ponder raises on purpose."""


class RecoverableError(PonderError):
    """A failure worth retrying later (the store is down, the batcher is full)."""


class ConfigError(PonderError):
    """A setting is wrong; the message names it and says what to change."""


class StoreUnavailable(RecoverableError):
    """The store (Redis or SQLite) cannot be reached."""


class QueueFull(RecoverableError):
    """The backlog of pending tasks is at its limit."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"the backlog of pending tasks is at its limit ({limit}); retry later")
        self.limit = limit


class EngineBusy(RecoverableError):
    """A queue in front of the engine is at its limit; the caller should back off and retry."""


class BatcherFull(EngineBusy):
    """The static batcher's buffer is at its limit; the caller should back off and retry."""


class IdempotencyConflict(PonderError):
    """An Idempotency-Key was reused with a different request body."""


class InvalidTransition(PonderError):
    """A task state transition that the state machine does not allow."""


class EngineError(RecoverableError):
    """One generation failed; other requests and later calls may still succeed."""


class EngineDeadError(PonderError):
    """The engine cannot serve any more requests: its model thread ended, it was closed,
    or its upstream refuses its credentials. Every waiting and later request fails."""
