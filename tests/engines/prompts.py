"""Helpers shared by the runner tests."""

from __future__ import annotations

from typing import Any

import pytest

from ponder.engines.runner import ModelRunner, Prefill, Prefix

#: a text of more than 600 tokens: more than one internal prefill pass of either runner
LONG_TEXT = " ".join(f"Item {i}: a line of text about the number {i}." for i in range(60))


def chat(tokenizer: Any, prompt: str) -> list[int]:
    """The token ids of ``prompt`` as one user message under the chat template."""
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=False
    )
    ids: list[int] = tokenizer(text, add_special_tokens=False)["input_ids"]
    return ids


def check_bounds(runner: ModelRunner, prefix: Prefix) -> None:
    """The seam refuses a prompt over the context and a decode of the wrong width."""
    with pytest.raises(ValueError, match="context"):
        runner.prefill([Prefill([1] * (runner.context_length + 1))])
    runner.join(prefix)
    with pytest.raises(ValueError, match=r"2 tokens for 1 (running )?rows"):
        runner.decode([1, 2])
    runner.keep([])


def prefill_in_chunks(runner: ModelRunner, ids: list[int], size: int) -> Prefix:
    """``ids`` prefilled ``size`` tokens at a time, each chunk continuing the last."""
    prefix = None
    for start in range(0, len(ids), size):
        prefix = runner.prefill([Prefill(ids[start : start + size], prefix)])[0]
    assert prefix is not None and prefix.length == len(ids)
    return prefix
