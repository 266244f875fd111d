"""The transformers engine (the ``hf`` extra): any causal LM transformers loads, with
continuous batching, in float32 on torch. The default engine is OpenVINO GenAI's
(``engines/openvino.py``); this one serves architectures that engine cannot read, and is
the float32 reference that ``bench/engine.py --agreement`` compares every engine with.

``model.generate`` takes one set of sampling parameters per call and runs whole batches;
ponder's rows come and go one at a time with their own parameters, so this engine runs its
own scheduler (:class:`~ponder.engines.continuous.ContinuousEngine`: rows join and leave
the running batch at every decode step) over a :class:`~ponder.engines.runner.ModelRunner`
that does the model work. It gives:

- per-row temperature, top_p, seed, max_new_tokens and stop strings, with per-row seeded
  sampling: a row's text depends on its prompt, seed and parameters alone, never on what
  else joins or leaves the batch;
- **chunked prefill under a per-step budget** (``PONDER_ENGINE_STEP_TOKENS``): newcomers
  are prefilled between decode steps, several short prompts in one pass, a prompt longer
  than the budget in chunks over successive steps, so a long prompt delays the running
  rows by at most one chunk per step;
- **shared-prefix prefill**: rows with the same prompt (the samples of one task) prefill
  it once, and a bounded LRU cache of prompt KV (``PONDER_ENGINE_PREFIX_CACHE_MB``) keeps
  it for the task's later waves (early stopping's second wave is not prefilled again);
- rows that end (end of sequence, stop string, length, cancel, timeout) leave the batch
  and its KV cache at once; cancelled and timed-out rows return the text so far;
- text pieces for streaming (``request.on_text``), decoded incrementally;
- token log-probabilities (under the unscaled logits).

It cannot constrain decoding (``constrains_json`` is False): a structured row
(``request.json_schema``) is generated as free text, as any row; the per-field vote parses
and validates each sample and an invalid one does not vote (no 422 at submit, strict or
not: the prompt asks for the JSON, the vote keeps what holds).

All model work runs in one dedicated thread: one model instance, never two forward passes
at once, and the event loop never blocks. The scheduler and its sampler work on numpy
arrays; torch is imported by the runner alone (``engines/hf.py``).
"""

from __future__ import annotations

import contextlib
import secrets
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from ponder.config import Settings
from ponder.engines.base import SampleOutput, SampleRequest
from ponder.engines.models import load_model
from ponder.engines.textrows import LocalModelEngine, TokenRow
from ponder.errors import ConfigError, EngineError

_NEEDS_MODEL_EXTRA = (
    "the transformers engine needs the hf extra: pip install -e '.[hf]' (or `make install-hf`)"
)

try:
    import numpy

    from ponder.engines.runner import Logits, ModelRunner, Prefill, Prefix
except ImportError as e:  # pragma: no cover - depends on the installation
    raise ConfigError(_NEEDS_MODEL_EXTRA) from e

__all__ = ["TransformersEngine"]

#: a prompt longer than this many tokens over the step budget is prefilled in chunks
_MIN_CHUNK = 16


@dataclass(eq=False)
class _Row(TokenRow):
    """One request in the decode loop."""

    #: what the next prefill computes: the prompt, or for a preempted row its prompt and
    #: tokens so far
    sequence: list[int] = field(default_factory=list)
    #: rows with the same key share their prompt's prefill
    key: tuple[int, ...] = ()
    #: preempted, and waiting to be prefilled again
    resuming: bool = False
    #: None for greedy rows; otherwise the row's own sampling stream
    generator: numpy.random.Generator | None = None


class TransformersEngine(LocalModelEngine["_Row"]):
    """A local causal LM (``settings.model``) with continuous batching in one thread.

    ``start()`` loads the model (converting and caching a GGUF model the first time);
    ``submit()`` starts it on first use. ``close()`` ends the rows in flight (they fail
    with EngineDeadError) and stops the thread. ``share_prefix=False`` prefills every row
    on its own (to measure what sharing saves).
    """

    name = "transformers"
    row_class = _Row

    def __init__(self, settings: Settings, *, share_prefix: bool = True) -> None:
        super().__init__(settings)
        self._share_prefix = share_prefix
        self._step_tokens = settings.engine_step_tokens
        self._runner: ModelRunner | None = None
        max_bytes = int(settings.engine_prefix_cache_mb * 2**20) if share_prefix else 0
        self._prefixes = _PrefixCache(max_bytes)
        #: chunked prefills in progress, by prompt
        self._partial: dict[tuple[int, ...], Prefix] = {}

    # --- set-up (model thread) --------------------------------------------------------
    def _setup(self) -> None:
        runner = _torch_runner(self._settings)
        self._prefixes.max_entries = runner.max_prefixes
        self._use_tokenizer(runner.tokenizer)
        self._runner = runner

    def _teardown(self) -> None:
        if self._runner is not None:
            self._runner.close()
        self._runner = None
        self._tokenizer = None
        self._prefixes.clear()
        self._partial.clear()

    def _context(self) -> contextlib.AbstractContextManager[Any]:
        assert self._runner is not None  # the loop starts once _setup has loaded it
        return self._runner.context()

    @property
    def batch_invariant(self) -> bool:
        """Whether a row's text is the same alone and in any batch (see ModelRunner)."""
        return self._runner is None or self._runner.batch_invariant

    # --- rows -------------------------------------------------------------------------
    def _open(self, row: _Row) -> None:
        assert self._runner is not None
        row.open_text(self._tokenizer, self._runner.context_length)
        row.generator = _generator(row.request)
        row.sequence = row.prompt_ids
        row.key = tuple(row.prompt_ids) if self._share_prefix else (id(row), *row.prompt_ids)

    def _prefill(self, rows: list[_Row], now: float) -> list[_Row]:
        """Prefill what the step budget allows; rows whose prompt is ready join the batch."""
        assert self._runner is not None
        groups: dict[tuple[int, ...], list[_Row]] = {}
        for row in rows:
            groups.setdefault(row.key, []).append(row)
        for key in [k for k in self._partial if k not in groups]:
            del self._partial[key]  # every row of that prompt left
        ready: list[_Row] = []
        budget = self._step_tokens
        items: list[Prefill] = []
        planned: list[tuple[tuple[int, ...], bool]] = []
        for key, group in groups.items():
            resuming = group[0].resuming
            cached = None if resuming else self._prefixes.get(key)
            if cached is not None:
                self.stats.prefix_hits += len(group)
                self._start(group, cached, ready)
                continue
            partial = self._partial.get(key)
            if partial is None and resuming:  # a preempted row: its prompt may be cached
                partial = self._prefixes.get(tuple(group[0].prompt_ids))
            done = partial.length if partial is not None else 0
            prompt = group[0].sequence
            remaining = len(prompt) - done
            if remaining == 0 and partial is not None:
                self._start(group, partial, ready)
                continue
            if remaining <= budget:
                take = remaining
            elif remaining > self._step_tokens and budget >= _MIN_CHUNK:
                take = budget  # a long prompt: one chunk now, the rest in the next steps
            else:
                continue  # a short prompt that does not fit what is left: next step
            items.append(Prefill(tokens=prompt[done : done + take], prefix=partial))
            planned.append((key, take == remaining))
            budget -= take
            if budget < _MIN_CHUNK:
                break
        if not items:
            return ready
        try:
            prefixes = self._runner.prefill(items)
        except Exception as e:
            failed = [row for key, _ in planned for row in groups[key]]
            for key, _ in planned:
                self._partial.pop(key, None)
            self._fail(failed, EngineError(f"prefill failed: {type(e).__name__}: {e}"))
            return ready
        for (key, complete), item, prefix in zip(planned, items, prefixes, strict=True):
            self.stats.prefill_tokens += len(item.tokens)
            if not complete:
                self._partial[key] = prefix
                continue
            self._partial.pop(key, None)
            if not groups[key][0].resuming:
                self._prefixes.put(key, prefix)
            self.stats.prefix_hits += len(groups[key]) - 1
            self._start(groups[key], prefix, ready)
        return ready

    def _suspend(self, row: _Row) -> None:
        """A preempted row resumes from its prompt and all its tokens but the last (the
        next decode step feeds that one), prefilled on its own."""
        row.resuming = True
        row.key = (-1, id(row))
        row.sequence = row.prompt_ids + row.tokens[:-1]

    def _start(self, group: list[_Row], prefix: Prefix, ready: list[_Row]) -> None:
        """Sample each row's first token from the prompt's logits; join the ones that go on."""
        assert self._runner is not None
        if group[0].resuming:  # its next token is known: join as it was
            for row in group:
                row.resuming = False
                self._join(row, prefix, ready)
            return
        logits = numpy.broadcast_to(prefix.logits, (len(group), *prefix.logits.shape))
        tokens, logprobs = _sample(logits, group)
        for row, token, logprob in zip(group, tokens, logprobs, strict=True):
            self._append(row, token, logprob)
            if row.finish is None:
                self._join(row, prefix, ready)

    def _join(self, row: _Row, prefix: Prefix, ready: list[_Row]) -> None:
        """``row`` joins the batch from ``prefix``; it fails when the runner has no room."""
        assert self._runner is not None
        try:
            self._runner.join(prefix)
        except Exception as e:  # e.g. the llama.cpp runner out of sequences
            self._fail([row], EngineError(f"cannot start the row: {type(e).__name__}: {e}"))
            return
        ready.append(row)

    def _step(self, rows: list[_Row]) -> None:
        assert self._runner is not None
        try:
            logits = self._runner.decode([row.tokens[-1] for row in rows])
        except Exception as e:  # the batch's state is unknown: fail every running row
            self._fail(rows, EngineError(f"generation failed: {type(e).__name__}: {e}"))
            return
        tokens, logprobs = _sample(logits, rows)
        for row, token, logprob in zip(rows, tokens, logprobs, strict=True):
            self._append(row, token, logprob)

    def _drop(self, keep: list[int]) -> None:
        assert self._runner is not None
        self._runner.keep(keep)

    def _append(self, row: _Row, token: int, logprob: float) -> None:
        assert self._runner is not None
        row.append(token, logprob, self._runner.eos_ids)

    def _output(self, row: _Row) -> SampleOutput:
        return row.output(self._tokenizer)


def _torch_runner(settings: Settings) -> ModelRunner:
    """transformers' model for ``settings.model`` behind the runner seam (float32, torch)."""
    try:
        import torch

        from ponder.engines.hf import HFRunner
    except ImportError as e:  # pragma: no cover - depends on the installation
        raise ConfigError(_NEEDS_MODEL_EXTRA) from e
    # torch's intra-op thread count is a per-thread setting: set it where the work runs
    if settings.engine_threads > 0:
        torch.set_num_threads(settings.engine_threads)
    model, tokenizer = load_model(settings.model, settings.model_cache_dir)
    return HFRunner(model, tokenizer)


class _PrefixCache:
    """Prompt KV caches by prompt, least recently used evicted first, bounded in bytes
    and, where the runner holds few prefixes (``max_entries``), in count."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.max_entries: int | None = None
        self._entries: OrderedDict[tuple[int, ...], Prefix] = OrderedDict()
        self._bytes = 0

    def get(self, key: tuple[int, ...]) -> Prefix | None:
        prefix = self._entries.get(key)
        if prefix is not None:
            self._entries.move_to_end(key)
        return prefix

    def put(self, key: tuple[int, ...], prefix: Prefix) -> None:
        if prefix.nbytes > self.max_bytes or key in self._entries:
            return
        full = self.max_entries
        while self._entries and (
            self._bytes + prefix.nbytes > self.max_bytes
            or (full is not None and len(self._entries) >= full)
        ):
            _, old = self._entries.popitem(last=False)
            self._bytes -= old.nbytes
        if full == 0:
            return
        self._entries[key] = prefix
        self._bytes += prefix.nbytes

    def clear(self) -> None:
        self._entries.clear()
        self._bytes = 0


def _generator(request: SampleRequest) -> numpy.random.Generator | None:
    """A sampled row's own stream, from ``request.seed`` (else a random seed); None: greedy."""
    if request.temperature <= 0:
        return None
    seed = secrets.randbits(63) if request.seed is None else request.seed % 2**64
    return numpy.random.Generator(numpy.random.PCG64(seed))


def _sample(logits: Logits, rows: list[_Row]) -> tuple[list[int], list[float]]:
    """Each row's next token and its log-probability under the unscaled logits.

    ``logits`` is ``[rows, vocab]`` (read, never written). A greedy row takes the argmax;
    a sampled row draws from its own generator (:func:`_draw`) over its own logits, so
    its choices depend on its seed and its logits alone, never on the other rows.
    """
    chosen = logits.argmax(axis=-1)
    for i, row in enumerate(rows):
        if row.generator is not None:
            request = row.request
            chosen[i] = _draw(logits[i], request.temperature, request.top_p, row.generator)
    # log_softmax at the chosen token: the row's max subtracted, the sum in float64
    shifted = logits - logits.max(axis=-1, keepdims=True)
    total = numpy.exp(shifted).sum(axis=-1, dtype=numpy.float64)
    logprobs = numpy.take_along_axis(shifted, chosen[:, None], axis=-1)[:, 0] - numpy.log(total)
    return chosen.tolist(), logprobs.tolist()


def _draw(
    logits: Logits, temperature: float, top_p: float, generator: numpy.random.Generator
) -> int:
    """One token drawn from the softmax of ``logits / temperature``, cut to its nucleus
    when ``top_p < 1``, by the Gumbel-max trick: the token whose scaled logit plus its own
    noise ``-log(-log(u))`` is largest, with one uniform number ``u`` from ``generator``
    for every entry of the vocabulary (always as many, so the stream stays aligned).

    A row's logits alone and in a batch differ by float32 rounding (~1e-5). This choice
    changes only when the two best noisy scores lie within that of each other. An inverse
    CDF over the vocabulary did not keep a row's text the same: its running sum moves every
    boundary of the long tail by that much, and a uniform number that falls among the
    tail's tiny tokens then picks another one (the engine test's two sampled rows of ten
    tokens, batched and alone, differed in 3 of 128 runs; in none of 80 with this draw).
    """
    # a floor on the temperature keeps logits / temperature finite
    scaled = logits / max(temperature, 1e-4)
    noise = generator.random(len(scaled), dtype=numpy.float32)  # [0, 1)
    with numpy.errstate(divide="ignore"):  # u = 0: log(-log(u)) = inf, never drawn
        numpy.log(noise, out=noise)
        numpy.negative(noise, out=noise)
        numpy.log(noise, out=noise)
    scores = numpy.subtract(scaled, noise, out=noise)
    if top_p < 1:
        # keep the most likely tokens until their mass reaches top_p: a token is dropped
        # when the mass before it already does. Only tokens of probability at least
        # (1 - top_p) / vocab can be kept (the others hold less than 1 - top_p together),
        # so only those are sorted (most likely first, ties by token id)
        probs = numpy.exp(scaled - scaled.max())
        probs /= probs.sum()
        order = numpy.flatnonzero(probs >= (1 - top_p) / len(probs))
        order = order[numpy.argsort(-probs[order], kind="stable")]
        head = probs[order]
        kept = order[numpy.cumsum(head, dtype=numpy.float64) - head < top_p]
        return int(kept[numpy.argmax(scores[kept])])
    return int(numpy.argmax(scores))
