"""ChatTokenizer against transformers' tokenizer on the packaged model's checkpoint."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from ponder.config import load_settings
from ponder.engines.models import checkpoint_dir, load_tokenizer
from ponder.engines.tokenizer import ChatTokenizer
from ponder.errors import ConfigError
from tests.engines.prompts import CONVERSATIONS

pytestmark = [pytest.mark.model, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def checkpoint() -> Path:
    return checkpoint_dir("smollm2-135m", load_settings().model_cache_dir)


def test_chat_texts_ids_and_decoding_equal_transformers(checkpoint: Path) -> None:
    ours = ChatTokenizer(checkpoint)
    theirs = AutoTokenizer.from_pretrained(checkpoint, local_files_only=True)
    assert ours.eos_token_id == theirs.eos_token_id
    for messages in CONVERSATIONS:
        for generation in (True, False):
            text = ours.apply_chat_template(
                messages, add_generation_prompt=generation, tokenize=False
            )
            assert text == theirs.apply_chat_template(
                messages, add_generation_prompt=generation, tokenize=False
            )
            ids = ours(text, add_special_tokens=False)["input_ids"]
            assert ids == theirs(text, add_special_tokens=False)["input_ids"]
            assert ours.apply_chat_template(messages, add_generation_prompt=generation) == ids
            for skip in (True, False):
                # every prefix, as the incremental detokenizer decodes windows of ids
                for end in range(0, len(ids), 7):
                    assert ours.decode(ids[:end], skip_special_tokens=skip) == theirs.decode(
                        ids[:end], skip_special_tokens=skip
                    )


def test_a_copy_is_independent_and_the_end_ids_match(checkpoint: Path) -> None:
    ours, eos = load_tokenizer(checkpoint, light=True)
    _, their_eos = load_tokenizer(checkpoint)
    assert eos == their_eos and ours.eos_token_id in eos
    twin = copy.deepcopy(ours)
    assert twin._tokenizer is not ours._tokenizer
    assert twin("Hello there")["input_ids"] == ours("Hello there")["input_ids"]


def test_an_unreadable_tokenizer_is_a_config_error(tmp_path: Path) -> None:
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(ConfigError, match="cannot read the tokenizer"):
        ChatTokenizer(tmp_path)
