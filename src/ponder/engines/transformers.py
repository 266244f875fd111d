"""The local model engine: a causal LM from transformers, decoded by ponder's own loop.

``model.generate`` takes one set of sampling parameters per call; ponder's batches mix rows
of different tasks, so this engine runs its own decode loop over the model's forward pass
and a KV cache, which gives it:

- per-row temperature, top_p, seed, max_new_tokens and stop strings, with per-row seeded
  sampling that makes a row's text independent of what else is in the batch;
- shared-prefix prefill: rows with the same prompt (the samples of one task) prefill it
  once and each get a copy of its KV cache;
- rows that finish (end of sequence, stop string, length, cancellation) leave the batch
  and its KV cache at once, so they stop costing compute.

All model work runs in one dedicated thread: one model instance, never two forward passes
at once, and the event loop never blocks.
"""

from __future__ import annotations

import asyncio
import copy
import inspect
import secrets
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

from ponder.config import Settings
from ponder.engines.base import BaseEngine, BatchResult, FinishReason, SampleOutput, SampleRequest
from ponder.engines.models import load_model
from ponder.errors import ConfigError, EngineError

try:
    import torch
    from transformers import DynamicCache
except ImportError as e:  # pragma: no cover - depends on the installation
    raise ConfigError(
        "the transformers engine needs the model extra: pip install -e '.[model]' "
        "(or `make install`)"
    ) from e

__all__ = ["DecodeStats", "TransformersEngine", "encode_prompt"]


@dataclass
class DecodeStats:
    """Counters of the model work done, to check (and measure) what the loop saves."""

    #: prompts prefilled: rows of one batch sharing a prompt count once
    prefilled_prompts: int = 0
    #: rows fed to decode steps, summed over the steps: finished rows no longer count
    decoded_rows: int = 0


class TransformersEngine(BaseEngine):
    """A local causal LM (``settings.model``) run in one worker thread.

    ``start()`` loads the model (converting and caching a GGUF model the first time);
    ``generate()`` loads it on first use if ``start()`` was not called. ``close()`` stops
    the rows in flight (they end ``cancelled``) and shuts the worker thread down.
    """

    name = "transformers"

    def __init__(self, settings: Settings, *, share_prefix: bool = True) -> None:
        self.model_name = settings.model
        self._settings = settings
        #: False prefills every row on its own (to measure what sharing saves)
        self._share_prefix = share_prefix
        self._executor: ThreadPoolExecutor | None = None
        self._decoder: _Decoder | None = None
        #: a second tokenizer for prompt_length(), which runs on the event loop's thread:
        #: a fast tokenizer must not be used by two threads at once
        self._length_tokenizer: Any = None
        self._closing = threading.Event()

    @property
    def stats(self) -> DecodeStats:
        """A snapshot of the work counters since the model was loaded."""
        return replace(self._decoder.stats) if self._decoder else DecodeStats()

    async def start(self) -> None:
        """Load the model in the worker thread. Idempotent; ConfigError on a wrong model."""
        if self._executor is None:
            self._closing.clear()
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ponder-model")
        loop = asyncio.get_running_loop()
        # the worker runs one job at a time, so concurrent starts load the model once
        await loop.run_in_executor(self._executor, self._load)

    def _load(self) -> None:
        if self._decoder is not None:
            return
        # torch's intra-op thread count is a per-thread setting: set it where the work runs
        if self._settings.torch_threads > 0:
            torch.set_num_threads(self._settings.torch_threads)
        model, tokenizer = load_model(self._settings.model, self._settings.model_cache_dir)
        self._length_tokenizer = copy.deepcopy(tokenizer)
        self._decoder = _Decoder(model, tokenizer, self._closing, self._share_prefix)

    async def generate(self, batch: Sequence[SampleRequest]) -> BatchResult:
        """See :meth:`BaseEngine.generate`; rows fail alone (EngineError) on a bad prompt."""
        if not batch:
            return []
        await self.start()
        assert self._executor is not None and self._decoder is not None
        loop = asyncio.get_running_loop()
        abort = threading.Event()
        try:
            return await loop.run_in_executor(
                self._executor, self._decoder.generate, list(batch), abort
            )
        except asyncio.CancelledError:
            abort.set()  # the caller gave up on the batch: stop computing it
            raise

    def prompt_length(self, request: SampleRequest) -> int:
        """The templated prompt's length in tokens (characters before the model is loaded)."""
        if self._length_tokenizer is None:
            return super().prompt_length(request)
        try:
            return len(encode_prompt(self._length_tokenizer, request))
        except EngineError:
            return super().prompt_length(request)

    async def close(self) -> None:
        """Stop the rows in flight, wait for the worker thread to end, drop the model."""
        executor, self._executor = self._executor, None
        if executor is None:
            return
        self._closing.set()
        await asyncio.to_thread(executor.shutdown, wait=True)
        self._decoder = None
        self._length_tokenizer = None


def encode_prompt(tokenizer: Any, request: SampleRequest) -> list[int]:
    """The token ids of ``request``'s prompt with the model's chat template applied.

    A plain ``prompt`` is sent as one user message. Without a chat template (a base model),
    a plain prompt is used as raw text and chat messages are refused. EngineError when the
    request cannot be rendered.
    """
    if request.messages is not None:
        messages = request.messages
    elif request.prompt is not None:
        messages = [{"role": "user", "content": request.prompt}]
    else:
        raise EngineError("the request has neither a prompt nor messages")
    if tokenizer.chat_template is None:
        if request.messages is not None:
            raise EngineError("this model has no chat template; send a plain prompt")
        text = request.prompt
    else:
        try:
            text = tokenizer.apply_chat_template(
                messages, add_generation_prompt=True, tokenize=False
            )
        except Exception as e:  # jinja raises many kinds on malformed messages
            raise EngineError(f"cannot apply the chat template: {e}") from e
    # the template already holds the special tokens the model expects
    ids: list[int] = tokenizer(text, add_special_tokens=False)["input_ids"]
    return ids


@dataclass(eq=False)
class _Row:
    """One request in the decode loop."""

    index: int
    request: SampleRequest
    prompt_ids: list[int]
    max_new_tokens: int
    #: None for greedy rows; otherwise the row's own sampling stream
    generator: torch.Generator | None
    tokens: list[int] = field(default_factory=list)
    logprob_sum: float = 0.0
    finish: FinishReason | None = None
    #: the request's non-empty stop strings
    stop: list[str] = field(default_factory=list)
    #: the completion cut before a stop string, once one appeared
    stopped_text: str | None = None

    def output(self, tokenizer: Any) -> SampleOutput:
        assert self.finish is not None  # the decode loop runs every row to its end
        text = self.stopped_text
        if text is None:
            text = tokenizer.decode(self.tokens, skip_special_tokens=True)
        n = len(self.tokens)
        return SampleOutput(
            text=text,
            prompt_tokens=len(self.prompt_ids),
            completion_tokens=n,
            finish_reason=self.finish,
            mean_logprob=self.logprob_sum / n if n else None,
        )


class _Decoder:
    """The model, its tokenizer and the decode loop. Used by the worker thread only."""

    def __init__(
        self, model: Any, tokenizer: Any, closing: threading.Event, share_prefix: bool
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.closing = closing
        self.share_prefix = share_prefix
        config = model.config
        self.context_length: int = getattr(config, "max_position_embeddings", 0) or 2048
        eos = model.generation_config.eos_token_id
        eos_ids = set(eos if isinstance(eos, list) else [eos])
        eos_ids.add(tokenizer.eos_token_id)
        self.eos_ids = {i for i in eos_ids if i is not None}
        self.pad_id: int = tokenizer.pad_token_id
        if self.pad_id is None:
            self.pad_id = min(self.eos_ids)
        self.stats = DecodeStats()
        # transformers 5 renamed forward's `past_key_values` to `cache` (warning on the old
        # name); earlier versions know only the old one
        forward = inspect.signature(model.forward).parameters
        self.cache_arg = "cache" if "cache" in forward else "past_key_values"

    def generate(self, batch: list[SampleRequest], abort: threading.Event) -> BatchResult:
        """Generate ``batch``; when ``abort`` is set, the rows in flight end ``cancelled``."""
        results: list[SampleOutput | EngineError | None] = [None] * len(batch)
        rows: list[_Row] = []
        for index, request in enumerate(batch):
            if request.is_cancelled:
                results[index] = SampleOutput(text="", finish_reason="cancelled")
                continue
            try:
                rows.append(self._row(index, request))
            except EngineError as e:
                results[index] = e
        if rows:
            try:
                with torch.inference_mode():
                    self._decode(rows, abort)
            except Exception as e:  # the batch as a whole failed; the batcher bisects it
                raise EngineError(f"generation failed: {type(e).__name__}: {e}") from e
            for row in rows:
                results[row.index] = row.output(self.tokenizer)
        out: BatchResult = []
        for result in results:
            assert result is not None  # every request got an output, an error or a row
            out.append(result)
        return out

    def _row(self, index: int, request: SampleRequest) -> _Row:
        """Validate and tokenize one request; EngineError fails this row alone."""
        ids = encode_prompt(self.tokenizer, request)
        if len(ids) >= self.context_length:
            raise EngineError(
                f"the prompt is {len(ids)} tokens; the model's context is {self.context_length}"
            )
        if request.max_new_tokens < 1:
            raise EngineError(f"max_new_tokens must be at least 1, not {request.max_new_tokens}")
        if not 0 < request.top_p <= 1 or request.temperature < 0:
            raise EngineError("need temperature >= 0 and 0 < top_p <= 1")
        generator = None
        if request.temperature > 0:
            seed = secrets.randbits(63) if request.seed is None else request.seed % 2**64
            generator = torch.Generator().manual_seed(seed)
        return _Row(
            index=index,
            request=request,
            prompt_ids=ids,
            max_new_tokens=min(request.max_new_tokens, self.context_length - len(ids)),
            generator=generator,
            stop=[s for s in request.stop if s],
        )

    def _decode(self, rows: list[_Row], abort: threading.Event) -> None:
        """Generate every row to its end; results are left on the rows."""
        # prefill each distinct prompt once, left-padded so that every row's last prompt
        # token sits in the last column
        groups: dict[str, int] = {}
        prompts: list[list[int]] = []
        row_group = []
        for row in rows:
            key = row.request.prompt_key() if self.share_prefix else str(row.index)
            if key not in groups:
                groups[key] = len(prompts)
                prompts.append(row.prompt_ids)
            row_group.append(groups[key])
        width = max(len(p) for p in prompts)
        input_ids = torch.tensor([[self.pad_id] * (width - len(p)) + p for p in prompts])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        cache = DynamicCache(config=self.model.config)
        out = self.model(
            input_ids=input_ids,
            attention_mask=mask,
            position_ids=positions,
            **{self.cache_arg: cache},
            use_cache=True,
            logits_to_keep=1,
        )
        self.stats.prefilled_prompts += len(prompts)
        logits = out.logits[:, -1, :]
        next_position = positions[:, -1] + 1
        if len(prompts) < len(rows):
            # each row gets its own copy of its prompt's KV cache
            expand = torch.tensor(row_group)
            cache.batch_select_indices(expand)
            logits, mask, next_position = logits[expand], mask[expand], next_position[expand]

        active = rows
        while True:
            for row, token, logprob in zip(active, *self._sample(logits, active), strict=True):
                self._append(row, token, logprob)
            stopping = abort.is_set() or self.closing.is_set()
            for row in active:
                if row.finish is None and (stopping or row.request.is_cancelled):
                    row.finish = "cancelled"
            keep = [i for i, row in enumerate(active) if row.finish is None]
            if not keep:
                return
            if len(keep) < len(active):
                # finished rows leave the batch and the KV cache: they cost nothing more
                selected = torch.tensor(keep)
                cache.batch_select_indices(selected)
                mask, next_position = mask[selected], next_position[selected]
                active = [active[i] for i in keep]
            mask = torch.cat([mask, mask.new_ones(len(active), 1)], dim=1)
            self.stats.decoded_rows += len(active)
            out = self.model(
                input_ids=torch.tensor([[row.tokens[-1]] for row in active]),
                attention_mask=mask,
                position_ids=next_position[:, None],
                **{self.cache_arg: cache},
                use_cache=True,
            )
            logits = out.logits[:, -1, :]
            next_position = next_position + 1

    def _sample(self, logits: torch.Tensor, rows: list[_Row]) -> tuple[list[int], list[float]]:
        """Each row's next token and its log-probability under the unscaled logits.

        A sampled row draws one uniform number per token from its own generator and picks
        the token by inverse CDF over its own (row-wise computed) distribution, so its
        choices depend on its seed and its logits alone, never on the other rows.
        """
        logits = logits.float()
        chosen = logits.argmax(dim=-1)
        # which path a row takes depends on its own top_p only, never on the other rows
        for nucleus in (True, False):
            picked = [
                i
                for i, row in enumerate(rows)
                if row.generator is not None and (row.request.top_p < 1) == nucleus
            ]
            if picked:
                chosen[picked] = self._draw(logits[picked], [rows[i] for i in picked], nucleus)
        logprobs = torch.log_softmax(logits, dim=-1).gather(1, chosen[:, None])[:, 0]
        return chosen.tolist(), logprobs.tolist()

    @staticmethod
    def _draw(logits: torch.Tensor, rows: list[_Row], nucleus: bool) -> torch.Tensor:
        # a floor on the temperature keeps logits / temperature finite
        temperature = torch.tensor([max(row.request.temperature, 1e-4) for row in rows])
        probs = torch.softmax(logits / temperature[:, None], dim=-1)
        order = None
        if nucleus:
            # keep the most likely tokens until their mass reaches top_p: a token is dropped
            # when the mass before it already does
            probs, order = probs.sort(dim=-1, descending=True)
            top_p = torch.tensor([row.request.top_p for row in rows])
            probs = probs.masked_fill(probs.cumsum(-1) - probs >= top_p[:, None], 0.0)
        cdf = probs.cumsum(-1)
        uniform = torch.stack([torch.rand((), generator=row.generator) for row in rows])
        threshold = (uniform * cdf[:, -1])[:, None]
        index = torch.searchsorted(cdf, threshold, right=True).clamp(max=cdf.shape[-1] - 1)
        return (order.gather(1, index) if order is not None else index)[:, 0]

    def _append(self, row: _Row, token: int, logprob: float) -> None:
        """Add a generated token to the row and decide whether the row is finished."""
        row.tokens.append(token)
        row.logprob_sum += logprob
        if token in self.eos_ids or (row.stop and self._cut_at_stop(row)):
            row.finish = "stop"
        elif len(row.tokens) >= row.max_new_tokens:
            row.finish = "length"

    def _cut_at_stop(self, row: _Row) -> bool:
        """Whether a stop string appeared; if so, keep the text before it."""
        # the whole completion is decoded again because a token may complete a character
        # begun by the previous one; detokenizing is cheap next to a forward pass
        text: str = self.tokenizer.decode(row.tokens, skip_special_tokens=True)
        found = [p for p in (text.find(s) for s in row.stop) if p >= 0]
        if not found:
            return False
        row.stopped_text = text[: min(found)]
        return True
