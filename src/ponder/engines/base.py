"""The engine interface: what every model backend implements.

An engine turns a batch of :class:`SampleRequest` into one :class:`SampleOutput` or one
:class:`~ponder.errors.EngineError` per request, in the same order. Engines are async:
a model that computes on the CPU/GPU must do so in a worker thread or another process so
that the event loop is never blocked.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from ponder.errors import EngineError

__all__ = ["BaseEngine", "BatchResult", "FinishReason", "SampleOutput", "SampleRequest"]

FinishReason = Literal["stop", "length", "cancelled", "error"]


@dataclass(eq=False)
class SampleRequest:
    """One row to generate: a prompt (or chat messages) and its sampling parameters.

    ``cancelled`` is a thread-safe flag: when it is set, the engine may stop spending
    compute on the row and answer it with ``finish_reason="cancelled"``.
    """

    prompt: str | None = None
    messages: list[dict[str, Any]] | None = None
    temperature: float = 0.0
    top_p: float = 1.0
    max_new_tokens: int = 256
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    #: index of the sample inside its task (the scripted engine uses it to pick an answer)
    sample_index: int = 0
    #: 0 is the most urgent
    priority: int = 3
    #: the task this sample belongs to; rows of one task sharing a prompt may share a prefix
    task_id: str = ""
    cancelled: threading.Event = field(default_factory=threading.Event)
    _on_cancel: list[Callable[[], object]] = field(default_factory=list, repr=False)

    def cancel(self) -> None:
        """Mark the row cancelled and run the callbacks registered with :meth:`on_cancel`."""
        if self.cancelled.is_set():
            return
        self.cancelled.set()
        callbacks, self._on_cancel = self._on_cancel, []
        for callback in callbacks:
            callback()

    def on_cancel(self, callback: Callable[[], object]) -> None:
        """Call ``callback`` when the row is cancelled (at once if it already is)."""
        if self.cancelled.is_set():
            callback()
        else:
            self._on_cancel.append(callback)

    @property
    def is_cancelled(self) -> bool:
        return self.cancelled.is_set()

    def prompt_key(self) -> str:
        """A key equal for requests with the same prompt (for shared-prefix grouping)."""
        if self.messages is not None:
            return repr(self.messages)
        return self.prompt or ""


@dataclass
class SampleOutput:
    """What an engine produced for one request."""

    text: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    finish_reason: FinishReason = "stop"
    #: mean log-probability of the generated tokens, when the engine knows it
    mean_logprob: float | None = None


BatchResult = list[SampleOutput | EngineError]


class BaseEngine(ABC):
    """A model backend, chosen by name through :func:`ponder.engines.create_engine`."""

    #: the registry name, e.g. ``"scripted"``
    name: str = ""
    #: the model name reported by ``/v1/models``
    model_name: str = ""

    @abstractmethod
    async def generate(self, batch: Sequence[SampleRequest]) -> BatchResult:
        """Generate every request of ``batch``.

        Returns one entry per request, in order: a :class:`SampleOutput`, or an
        :class:`EngineError` for a request that failed on its own. Raising instead
        (``EngineError``) means the whole batch failed; the batcher then bisects it to
        find the poisonous request. Must never block the event loop.
        """

    def prompt_length(self, request: SampleRequest) -> int:
        """The request's prompt length, in tokens where the engine has a tokenizer.

        Used by the batcher's length buckets. The default counts characters.
        """
        if request.messages is not None:
            return sum(len(str(m.get("content", ""))) for m in request.messages)
        return len(request.prompt or "")

    async def start(self) -> None:  # noqa: B027 - optional hook
        """Load what the engine needs (model weights, connections). Idempotent."""

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release the engine's resources. Idempotent."""
