"""The engine interface: what every model backend implements.

**The contract: one row at a time.** The worker hands the engine one row (a
:class:`SampleRequest`: one sample of one task) with :meth:`BaseEngine.submit` and awaits
that row's :class:`SampleOutput`. A row never waits for another row to end:

- **When rows run.** A row waits in the engine's admission queue until the engine has
  room for it (``PONDER_ENGINE_MAX_ROWS`` running rows for the local engines,
  ``PONDER_OPENAI_MAX_CONCURRENCY`` requests for the OpenAI engine); waiting rows are
  admitted by weighted fair share across priorities (0 most urgent, no level starves).
  The local engines schedule per step: a row joins the running batch at the next decode
  step after its admission and leaves it at the step where it ends, and its output is
  delivered at once.
- **Time limits.** ``request.timeout_s`` counts from the row's start on the engine (its
  admission), not from its time in the queue (the task deadline bounds that). A row over
  its limit ends with ``finish_reason="timeout"`` and the text generated so far.
- **Cancelling.** ``request.cancel()`` (from any thread) ends the row at the next step:
  a queued row never runs; a running row returns what it generated so far with
  ``finish_reason="cancelled"`` and frees its slot. Cancelling the coroutine awaiting
  ``submit`` cancels the row the same way and drops its output.
- **Errors.** :class:`~ponder.errors.EngineError` fails this row alone: a prompt the
  model cannot take, a failed forward pass of the step the row was in, an upstream error
  after retries. :class:`~ponder.errors.EngineBusy` means the admission queue is full: back
  off and submit again. :class:`~ponder.errors.EngineDeadError` means the engine can
  serve no more — its model thread ended, it was closed, or the upstream refuses its
  credentials: every waiting and running row fails with it, and so does every later submit.
- **Streaming.** When ``request.on_text`` is set, it is called on the submitting event
  loop with each new piece of the row's text while the row runs (the pieces joined are
  the text generated so far; the final ``SampleOutput.text`` is authoritative: stop
  strings are cut from it). A local engine has the pieces anyway; a remote one asks its
  server to stream only when ``request.stream`` says the text is followed (parsing a
  streamed answer costs per token).

Engines are async: a model that computes on the CPU/GPU does so in a thread of its own
or another process, so that the event loop is never blocked.
"""

from __future__ import annotations

import asyncio
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from ponder.config.models import DEFAULT_MODEL
from ponder.errors import EngineError

__all__ = ["BaseEngine", "BatchResult", "FinishReason", "SampleOutput", "SampleRequest"]

FinishReason = Literal["stop", "length", "cancelled", "timeout", "error"]


@dataclass(eq=False)
class SampleRequest:
    """One row to generate: a prompt (or chat messages) and its sampling parameters.

    ``is_cancelled`` is safe to read from any thread; see :meth:`cancel`.
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
    #: the row's time limit on the engine, counted from its start there; None: no limit
    timeout_s: float | None = None
    #: called on the submitting event loop with each new piece of text (see the module doc)
    on_text: Callable[[str], object] | None = field(default=None, repr=False)
    #: someone follows the text now: an engine that must ask for a streamed answer to feed
    #: ``on_text`` (the openai engine) does so only then
    stream: bool = True
    #: a structured task's schema (ponder.schema_subset): the row's text must be a JSON
    #: object valid for it; an engine that can constrain decoding does (``strict``: the
    #: caller asked for it), the others leave it to the vote's validation (docs/structured.md)
    json_schema: dict[str, Any] | None = None
    strict: bool = False
    #: set once, under ``_lock``, by :meth:`cancel` (a plain flag: a ``threading.Event``
    #: per row cost more to make than the rest of the request; nothing waits on it)
    _cancelled: bool = field(default=False, init=False, repr=False)
    _on_cancel: list[Callable[[], object]] = field(default_factory=list, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def cancel(self) -> None:
        """Mark the row cancelled and run the callbacks registered with :meth:`on_cancel`."""
        with self._lock:
            if self._cancelled:
                return
            self._cancelled = True
            callbacks, self._on_cancel = self._on_cancel, []
        for callback in callbacks:
            callback()

    def on_cancel(self, callback: Callable[[], object]) -> None:
        """Call ``callback`` when the row is cancelled (at once if it already is)."""
        with self._lock:
            if not self._cancelled:
                self._on_cancel.append(callback)
                return
        callback()

    @property
    def is_cancelled(self) -> bool:
        return self._cancelled

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
    #: the log-probability of each generated token, when the engine knows them
    token_logprobs: list[float] | None = None


BatchResult = list[SampleOutput | EngineError]


class BaseEngine(ABC):
    """A model backend, chosen by name through :func:`ponder.engines.create_engine`."""

    #: the registry name, e.g. ``"scripted"``
    name: str = ""
    #: the model name reported by ``/v1/models``
    model_name: str = ""
    #: the served model (the models file's name) it runs for: its metrics' ``model`` label
    served_model: str = DEFAULT_MODEL
    #: the rows it runs at once; None where it sets no cap of its own (the server behind
    #: the openai engine has its own)
    max_rows: int | None = None
    #: whether it constrains a structured row's decoding to the row's ``json_schema`` (its
    #: text is then valid JSON for the schema unless its token budget cut it); an engine that
    #: cannot (transformers) generates free text and the per-field vote validates each
    #: sample: an invalid one does not vote. ``describe()`` reports it
    constrains_json: bool = False

    @abstractmethod
    async def submit(self, request: SampleRequest) -> SampleOutput:
        """Run one row and return its output; see the module docstring for the contract.

        Raises :class:`EngineError` (this row failed), :class:`EngineBusy` (the admission
        queue is full) or :class:`EngineDeadError` (the engine can serve no more). Must
        never block the event loop.
        """

    async def generate(self, batch: Sequence[SampleRequest]) -> BatchResult:
        """Run a whole batch at once: every row submitted together, all results returned
        together (the static baseline, ``PONDER_BATCHING=static``, calls this through the
        :class:`~ponder.batcher.DynamicBatcher`). A row's EngineError is its entry; an
        EngineDeadError or EngineBusy is raised for the whole batch."""
        results = await asyncio.gather(*(self.submit(r) for r in batch), return_exceptions=True)
        out: BatchResult = []
        for result in results:
            if isinstance(result, SampleOutput | EngineError):
                out.append(result)
            elif isinstance(result, BaseException):
                raise result
        return out

    def prompt_length(self, request: SampleRequest) -> int:
        """The request's prompt length, in tokens where the engine has a tokenizer.

        Used by the static batcher's length buckets. The default counts characters.
        """
        if request.messages is not None:
            return sum(len(str(m.get("content", ""))) for m in request.messages)
        return len(request.prompt or "")

    def describe(self) -> dict[str, Any]:
        """What the engine is doing now (rows running, queued, counters), for operators."""
        return {"constrains_json": self.constrains_json}

    def health(self) -> str | None:
        """Why the engine cannot run rows now (``/readyz`` answers 503 with it), or None
        while it can. Safe to call from any thread."""
        return None

    async def start(self) -> None:  # noqa: B027 - optional hook
        """Load what the engine needs (model weights, connections). Idempotent."""

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release the engine's resources. Idempotent."""
