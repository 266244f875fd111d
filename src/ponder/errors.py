"""The exception hierarchy of ponder.

Recoverable failures (a sample can be retried, a store call can be tried again later)
derive from :class:`RecoverableError`; the rest are fatal for the operation at hand.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "AdmissionError",
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
    "Refusal",
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


class Refusal(PonderError):
    """A request refused, or one the service cannot serve now, with what its answer says:
    ``status`` (the HTTP status), ``code`` and ``message`` (ponder's error envelope),
    ``headers`` (``Retry-After``, ``WWW-Authenticate``) and ``extra`` (fields beside the
    error, e.g. the task that ended). The task routes answer it with the envelope, the
    OpenAI routes in OpenAI's shape."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        *,
        headers: dict[str, str] | None = None,
        extra: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.headers = headers
        self.extra = extra or {}


class AdmissionError(Refusal):
    """A task request refused, or a task that cannot be read or cancelled
    (:mod:`ponder.admission`)."""


class InvalidTransition(PonderError):
    """A task state transition that the state machine does not allow."""


class EngineError(RecoverableError):
    """One generation failed; other requests and later calls may still succeed."""


class EngineDeadError(PonderError):
    """The engine cannot serve any more requests: its model thread ended, it was closed,
    or its upstream refuses its credentials. Every waiting and later request fails."""
