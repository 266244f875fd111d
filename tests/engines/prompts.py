"""Prompts and helpers shared by the local engines' tests."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from ponder.engines.base import BaseEngine, SampleOutput, SampleRequest
from ponder.errors import EngineError

CAPITAL = "What is the capital of France?"
STORY = "Write a long story about a brave dragon."
HAIKU = "Write a haiku about the sea."


def ok(result: SampleOutput | BaseException) -> SampleOutput:
    assert isinstance(result, SampleOutput), repr(result)
    return result


async def run(engine: BaseEngine, *requests: SampleRequest) -> list[SampleOutput]:
    """The rows submitted together; each must succeed."""
    return [ok(r) for r in await engine.generate(list(requests))]


def greedy(prompt: str, max_new_tokens: int = 12, stop: tuple[str, ...] = ()) -> SampleRequest:
    return SampleRequest(prompt=prompt, max_new_tokens=max_new_tokens, stop=list(stop))


def sampled(prompt: str, seed: int, top_p: float = 1.0, max_new_tokens: int = 10) -> SampleRequest:
    return SampleRequest(
        prompt=prompt, temperature=1.0, top_p=top_p, seed=seed, max_new_tokens=max_new_tokens
    )


def same(a: SampleOutput, b: SampleOutput) -> None:
    """Equal text, token counts and finish reason; log-probabilities up to float32 noise
    (a row's logits in another batch differ by rounding: ~1e-5)."""
    assert (a.text, a.completion_tokens, a.finish_reason) == (
        b.text,
        b.completion_tokens,
        b.finish_reason,
    )
    assert a.mean_logprob == pytest.approx(b.mean_logprob, abs=2e-3)


def failed(result: SampleOutput | BaseException) -> EngineError:
    assert isinstance(result, EngineError), repr(result)
    return result


@dataclass(eq=False)
class ActOnCheck(SampleRequest):
    """A row that runs ``action`` (by default, flags itself cancelled, without the
    callbacks) on the n-th check of its cancellation flag.

    The engine checks a row's flag when it is submitted, when it is admitted and once per
    decode step after that, so this acts at a known step.
    """

    checks_left: int = 0
    action: Callable[[], object] | None = None

    @property
    def is_cancelled(self) -> bool:
        self.checks_left -= 1
        if self.checks_left == 0:
            if self.action is None:
                self._cancelled = True
            else:
                self.action()
        return self._cancelled


#: chats whose templated texts and ids the tokenizer tests compare with transformers'
CONVERSATIONS: list[list[dict[str, Any]]] = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [
        {"role": "system", "content": "Answer in one word."},
        {"role": "user", "content": "Colour of the sky?"},
    ],
    [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello! How can I help?"},
        {
            "role": "user",
            "content": "Écris « bonjour » en 日本語, then add 2 + 2 = ?\n\n\tDone. 😀",
        },
    ],
    [{"role": "user", "content": "def f():\n    return 12345  # <|im_end|>"}],
    [{"role": "user", "content": ""}],
]


async def preempted(engine: Any, low: SampleRequest) -> tuple[str, SampleOutput, list[str]]:
    """``low`` (at priority 5) on ``engine`` made to run one row at a time and preempt after
    50 ms: once it streams, an urgent row takes its slot. (Its text before the preemption,
    its output, the pieces it streamed.)"""
    rows, preempt = engine.max_rows, engine.preempt_after_s
    engine.max_rows, engine.preempt_after_s = 1, 0.05
    pieces: list[str] = []
    streaming = asyncio.Event()

    def listen(piece: str) -> None:
        pieces.append(piece)
        streaming.set()

    low.priority, low.on_text = 5, listen
    try:
        background = asyncio.create_task(engine.submit(low))
        await asyncio.wait_for(streaming.wait(), 30)
        head = "".join(pieces)
        before = engine.stats.preempted
        urgent = await engine.submit(SampleRequest(prompt=CAPITAL, max_new_tokens=4, priority=0))
        assert urgent.completion_tokens == 4
        resumed = await asyncio.wait_for(background, 60)
        assert engine.stats.preempted == before + 1
    finally:
        engine.max_rows, engine.preempt_after_s = rows, preempt
    return head, resumed, pieces
