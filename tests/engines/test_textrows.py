"""A row's text ends on a character boundary (issue #47): a row cut inside a character
whose UTF-8 bytes span several tokens (its budget, a timeout, a cancel) neither streams
nor returns the half character, with the packaged model's real tokenizer."""

from __future__ import annotations

import asyncio

import pytest

from ponder.config import load_settings
from ponder.engines.base import SampleRequest
from ponder.engines.models import engine_files
from ponder.engines.textrows import TokenRow
from ponder.engines.tokenizer import ChatTokenizer

pytestmark = [pytest.mark.model, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def tokenizer() -> ChatTokenizer:
    settings = load_settings()
    return ChatTokenizer(engine_files(settings.model, settings.model_cache_dir, "f16"))


def row_of(tokens: list[int], tokenizer: ChatTokenizer, pieces: list[str]) -> TokenRow:
    """A streamed row that generated ``tokens`` (its budget: their number)."""
    loop = asyncio.new_event_loop()
    try:
        row = TokenRow(
            request=SampleRequest(prompt="Say Z", on_text=pieces.append),
            future=loop.create_future(),
            loop=loop,
            priority=3,
            arrival=0.0,
        )
    finally:
        loop.close()
    row.open_text(tokenizer, 2048)
    row.max_new_tokens = len(tokens)
    for token in tokens:
        row.append(token, -0.1, eos_ids=())
    return row


@pytest.mark.parametrize("text", ["Z\u0338 and more", "naïve 日本語 ok", "emoji 🐉 dragon"])
def test_a_row_cut_inside_a_character_ends_before_it(tokenizer: ChatTokenizer, text: str) -> None:
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    cuts = [n for n in range(1, len(ids)) if tokenizer.decode(ids[:n]).endswith("\ufffd")]
    assert cuts, f"no token boundary of {text!r} falls inside a character"
    for n in cuts:
        row = row_of(ids[:n], tokenizer, [])
        assert row.finish == "length"
        output = row.output(tokenizer)
        assert "\ufffd" not in output.text, (n, output.text)
        assert text.startswith(output.text)
        assert output.completion_tokens == n  # every token still counts
        streamed = "".join(row.pieces)  # what the engine hands to on_text
        assert streamed == output.text and "\ufffd" not in streamed
    # the whole text decodes whole
    whole = row_of(ids, tokenizer, [])
    assert whole.output(tokenizer).text == text == "".join(whole.pieces)
