"""The seam of the transformers engine: what a model runner does for its scheduler.

The engine's scheduler (``engines/transformers.py``) decides, between decode steps, which
rows join and leave the running batch; a :class:`ModelRunner` does the model work it asks
for. Every method is called from the engine's one model thread, never concurrently;
``prefill``, ``join``, ``keep`` and ``decode`` inside the runner's
:meth:`ModelRunner.context` (``torch.inference_mode()`` for the torch runners).

Logits cross the seam as numpy float32 arrays (:data:`Logits`), whatever computes them:
the scheduler and its sampler import no torch, so an engine over a runner without torch
(llama.cpp) never loads it. A runner hands over arrays of its own, which the scheduler
only reads: nothing the runner computes later may write into an array it has returned.

The runner holds the **running batch**: an ordered list of rows, each with its own KV
cache and position. Rows are addressed by their index in that list.

- :meth:`ModelRunner.prefill` computes the KV cache of token sequences, each optionally
  continuing a :class:`Prefix` computed before (chunked prefill, a cached prompt, a
  shared system prompt). It never changes the running batch, nor a prefix it is given:
  prefixes are immutable and may be cached and reused by many rows.
- :meth:`ModelRunner.join` appends a row that starts from a prefix (its KV is copied).
- :meth:`ModelRunner.keep` drops rows (finished, cancelled, timed out).
- :meth:`ModelRunner.decode` runs one step: every running row gets its next token and
  the logits of the token after it come back, one row per running row, in order.

A row's logits must not depend on its batch mates beyond floating-point noise: the
scheduler's greedy and seeded rows give the same text alone and in any batch. A runner
that cannot promise it at float32 precision says so (``batch_invariant = False``).
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy
import numpy.typing

__all__ = ["Logits", "ModelRunner", "Prefill", "Prefix"]

#: next-token logits: ``[vocab]`` for one sequence, ``[rows, vocab]`` for a batch
Logits = numpy.typing.NDArray[numpy.float32]


@dataclass(frozen=True, eq=False)
class Prefix:
    """The KV cache of a token sequence and the logits after its last token.

    ``state`` is the runner's own (e.g. per-layer key/value tensors); nobody else reads it.
    """

    #: tokens covered, from position 0
    length: int
    #: next-token logits after the last token, shape ``[vocab]``
    logits: Logits
    #: memory held by ``state`` (for the prefix cache's budget)
    nbytes: int
    state: Any


@dataclass(frozen=True)
class Prefill:
    """One sequence to prefill: ``tokens`` appended to ``prefix`` (None: from position 0)."""

    tokens: Sequence[int]
    prefix: Prefix | None = None


class ModelRunner(ABC):
    """A causal LM's forward passes over a running batch; see the module docstring."""

    #: the model's tokenizer (a transformers tokenizer)
    tokenizer: Any
    #: token ids that end a row
    eos_ids: frozenset[int]
    #: the longest sequence (prompt + completion) the model takes
    context_length: int
    #: whether a row's logits equal its logits alone up to float32 rounding, whatever its
    #: batch mates (then greedy and seeded rows give the same text in any batch)
    batch_invariant: bool = True
    #: how many prefixes the engine may keep cached besides the running rows and the step's
    #: own (None: bounded by its memory budget alone)
    max_prefixes: int | None = None

    @property
    @abstractmethod
    def rows(self) -> int:
        """How many rows the running batch holds."""

    @abstractmethod
    def prefill(self, items: Sequence[Prefill]) -> list[Prefix]:
        """The prefix of each item (``item.prefix`` extended by ``item.tokens``), in order.

        Items may be computed together in one forward pass. Raises on a failure of the
        pass; the running batch is unchanged either way.
        """

    @abstractmethod
    def join(self, prefix: Prefix) -> None:
        """Append a row continuing ``prefix`` to the running batch (``prefix`` unchanged)."""

    @abstractmethod
    def keep(self, rows: Sequence[int]) -> None:
        """Keep only ``rows`` (strictly increasing indices) of the running batch, in order."""

    def close(self) -> None:  # noqa: B027 - most runners hold nothing to free early
        """Free what the runner holds (a native library's memory) now; it is not used again."""

    def context(self) -> contextlib.AbstractContextManager[Any]:
        """The context that ``prefill``, ``join``, ``keep`` and ``decode`` are called in."""
        return contextlib.nullcontext()

    @abstractmethod
    def decode(self, tokens: Sequence[int]) -> Logits:
        """Feed running row *i* the token ``tokens[i]``; the next-token logits, ``[rows, vocab]``.

        On an exception the running batch is in an unknown state: the caller drops every
        row (``keep([])``) before using the runner again.
        """
