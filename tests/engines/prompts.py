"""Helpers shared by the runner tests."""

from __future__ import annotations

from typing import Any

import pytest

from ponder.engines.runner import ModelRunner, Prefill, Prefix


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
