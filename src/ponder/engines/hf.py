"""The generic runner: any Hugging Face causal LM through transformers and torch.

:class:`HFRunner` implements the :class:`~ponder.engines.runner.ModelRunner` seam with the
model's own forward pass and a transformers ``DynamicCache`` (the transformers engine's,
``PONDER_ENGINE=transformers``, with the ``hf`` extra).
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Sequence
from typing import Any

import torch

from ponder.engines.runner import Logits, ModelRunner, Prefill, Prefix

__all__ = ["HFRunner"]


class HFRunner(ModelRunner):
    """The generic runner: any Hugging Face causal LM, its forward pass and a KV cache.

    The running batch is one ``DynamicCache`` whose rows are right-aligned: every row's
    last token sits in the last column, shorter rows are padded on the left (masked out,
    with their own position ids), so one decode step appends one column for all rows.
    A row that joins is padded to the batch's width (or the batch to the row's); rows
    that leave are cut out, and columns that became padding for every row are trimmed.
    Joins are merged lazily, all of one step's joins in one copy.
    """

    def __init__(self, model: Any, tokenizer: Any) -> None:
        from transformers import DynamicCache
        from transformers.cache_utils import DynamicLayer

        self.model = model
        self.tokenizer = tokenizer
        config = model.config
        self.context_length = getattr(config, "max_position_embeddings", 0) or 2048
        eos = model.generation_config.eos_token_id
        eos_ids = set(eos if isinstance(eos, list) else [eos])
        eos_ids.add(tokenizer.eos_token_id)
        self.eos_ids = frozenset(i for i in eos_ids if i is not None)
        pad = tokenizer.pad_token_id
        self.pad_id: int = pad if pad is not None else min(self.eos_ids)
        # transformers 5 renamed forward's `past_key_values` to `cache`; earlier versions
        # know only the old name
        forward = inspect.signature(model.forward).parameters
        self._cache_arg = "cache" if "cache" in forward else "past_key_values"
        self._cache_class: Any = DynamicCache
        self._config = config
        kinds = {type(layer) for layer in self._new_cache().layers}
        if kinds - {DynamicLayer}:
            from ponder.errors import ConfigError

            names = ", ".join(sorted(k.__name__ for k in kinds))
            raise ConfigError(
                f"the model's cache layers ({names}) are not supported by the continuous "
                "engine, which needs plain (full-attention) KV layers"
            )
        self._cache: Any = None  # the running batch's DynamicCache
        self._mask = torch.zeros(0, 0, dtype=torch.long)
        self._positions = torch.zeros(0, dtype=torch.long)
        self._pending: list[Prefix] = []

    @property
    def rows(self) -> int:
        return int(self._mask.shape[0]) + len(self._pending)

    def _new_cache(self, state: list[tuple[torch.Tensor, torch.Tensor]] | None = None) -> Any:
        """A DynamicCache, empty or holding copies of ``state``."""
        return self._cache_class(ddp_cache_data=state, config=self._config)

    def context(self) -> contextlib.AbstractContextManager[Any]:
        return torch.inference_mode()

    def _forward(
        self, input_ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, cache: Any
    ) -> Logits:
        """The last position's logits, ``[batch, vocab]`` (a view of this pass's own output)."""
        out = self.model(
            input_ids=input_ids,
            attention_mask=mask,
            position_ids=positions,
            use_cache=True,
            logits_to_keep=1,
            **{self._cache_arg: cache},
        )
        logits: Logits = out.logits[:, -1, :].float().numpy()
        return logits

    def prefill(self, items: Sequence[Prefill]) -> list[Prefix]:
        results: list[Prefix | None] = [None] * len(items)
        fresh = [i for i, item in enumerate(items) if item.prefix is None]
        if fresh:
            prompts = [list(items[i].tokens) for i in fresh]
            width = max(len(p) for p in prompts)
            input_ids = torch.tensor([[self.pad_id] * (width - len(p)) + p for p in prompts])
            mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
            positions = (mask.cumsum(-1) - 1).clamp(min=0)
            cache = self._new_cache()
            logits = self._forward(input_ids, mask, positions, cache)
            for j, (i, prompt) in enumerate(zip(fresh, prompts, strict=True)):
                start = width - len(prompt)
                state = [
                    (k[j : j + 1, :, start:].clone(), v[j : j + 1, :, start:].clone())
                    for k, v in ((lay.keys, lay.values) for lay in cache.layers)
                ]
                results[i] = _prefix(len(prompt), logits[j].copy(), state)
        for i, item in enumerate(items):
            if item.prefix is None:
                continue
            base, tokens = item.prefix, list(item.tokens)
            # the cache copies the prefix's tensors: the prefix itself stays unchanged
            cache = self._new_cache(base.state)
            total = base.length + len(tokens)
            logits = self._forward(
                torch.tensor([tokens]),
                torch.ones(1, total, dtype=torch.long),
                torch.arange(base.length, total)[None],
                cache,
            )
            state = [(layer.keys, layer.values) for layer in cache.layers]
            results[i] = _prefix(total, logits[0], state)
        out: list[Prefix] = []
        for prefix in results:
            assert prefix is not None  # every item was computed above
            out.append(prefix)
        return out

    def join(self, prefix: Prefix) -> None:
        self._pending.append(prefix)

    def _merge(self) -> None:
        """Merge the pending joins into the batch, padding on the left to one width."""
        if not self._pending:
            return
        pending, self._pending = self._pending, []
        width = int(self._mask.shape[1]) if self._cache is not None else 0
        new_width = max(width, *(p.length for p in pending))
        blocks: list[list[tuple[torch.Tensor, torch.Tensor]]] = []
        masks, positions = [], []
        if self._cache is not None:
            pad = new_width - width
            layers = [(lay.keys, lay.values) for lay in self._cache.layers]
            blocks.append([(_pad_left(k, pad), _pad_left(v, pad)) for k, v in layers])
            masks.append(torch.nn.functional.pad(self._mask, (pad, 0)))
            positions.append(self._positions)
        for prefix in pending:
            pad = new_width - prefix.length
            blocks.append([(_pad_left(k, pad), _pad_left(v, pad)) for k, v in prefix.state])
            masks.append(torch.tensor([[0] * pad + [1] * prefix.length]))
            positions.append(torch.tensor([prefix.length]))
        layers = [
            (torch.cat([b[n][0] for b in blocks]), torch.cat([b[n][1] for b in blocks]))
            for n in range(len(blocks[0]))
        ]
        if self._cache is None:
            self._cache = self._new_cache()
            for layer, (k, v) in zip(self._cache.layers, layers, strict=True):
                layer.lazy_initialization(k, v)
        for layer, (k, v) in zip(self._cache.layers, layers, strict=True):
            layer.keys, layer.values = k, v
        self._mask = torch.cat(masks)
        self._positions = torch.cat(positions)

    def keep(self, rows: Sequence[int]) -> None:
        self._merge()
        if not rows:
            self._cache = None
            self._mask = torch.zeros(0, 0, dtype=torch.long)
            self._positions = torch.zeros(0, dtype=torch.long)
            return
        index = torch.tensor(list(rows))
        mask = self._mask[index]
        # columns that are padding for every remaining row are dropped
        used = int(mask.any(dim=0).nonzero()[0, 0])
        for layer in self._cache.layers:
            layer.keys = layer.keys[index, :, used:]
            layer.values = layer.values[index, :, used:]
        self._mask = mask[:, used:]
        self._positions = self._positions[index]

    def decode(self, tokens: Sequence[int]) -> Logits:
        self._merge()
        if len(tokens) != self._mask.shape[0]:
            raise ValueError(f"{len(tokens)} tokens for {self._mask.shape[0]} running rows")
        self._mask = torch.cat([self._mask, self._mask.new_ones(len(tokens), 1)], dim=1)
        logits = self._forward(
            torch.tensor(list(tokens))[:, None], self._mask, self._positions[:, None], self._cache
        )
        self._positions = self._positions + 1
        return logits


def _pad_left(tensor: torch.Tensor, columns: int) -> torch.Tensor:
    """``[B, H, T, D]`` padded with ``columns`` zero columns before T."""
    if columns == 0:
        return tensor
    return torch.nn.functional.pad(tensor, (0, 0, columns, 0))


def _prefix(length: int, logits: Logits, state: list[tuple[torch.Tensor, torch.Tensor]]) -> Prefix:
    nbytes = sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in state)
    return Prefix(length=length, logits=logits, nbytes=nbytes, state=state)
