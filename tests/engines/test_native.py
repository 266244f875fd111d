"""The native runner on the real SmolLM2-135M model: its forward pass, KV cache and weights."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy
import pytest
import torch

from ponder.config import load_settings
from ponder.engines.models import checkpoint_dir, load_model
from ponder.engines.native import (
    NativeRunner,
    Weights,
    prepared_weights,
    select_runner,
    supports,
)
from ponder.engines.runner import Logits, Prefill
from ponder.errors import ConfigError
from tests.engines import prompts

pytestmark = [pytest.mark.model, pytest.mark.timeout(300)]

MODEL = "smollm2-135m"
PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Hi",
    "List three prime numbers.",
]


@pytest.fixture(scope="module", params=["int8", "fp32"])
def runner(request: pytest.FixtureRequest) -> Iterator[NativeRunner]:
    weights: Weights = request.param
    torch.set_num_threads(1)
    yield NativeRunner.load(MODEL, load_settings().model_cache_dir, weights)


def chat(runner: NativeRunner, prompt: str) -> list[int]:
    return prompts.chat(runner.tokenizer, prompt)


def greedy(
    runner: NativeRunner, prompts: list[list[int]], steps: int, leave: dict[int, int] | None = None
) -> tuple[list[list[int]], list[list[Logits]]]:
    """Greedy tokens and logits of each prompt, all rows in one batch.

    ``leave`` maps a step to a row that leaves the batch after it (its tokens so far
    are kept).
    """
    runner.keep([])
    with runner.context():
        prefixes = runner.prefill([Prefill(p) for p in prompts])
        for prefix in prefixes:
            runner.join(prefix)
        tokens = [[int(p.logits.argmax())] for p in prefixes]
        logits = [[p.logits] for p in prefixes]
        running = list(range(len(prompts)))
        for step in range(steps):
            out = runner.decode([tokens[i][-1] for i in running])
            for i, row_logits in zip(running, out, strict=True):
                tokens[i].append(int(row_logits.argmax()))
                logits[i].append(row_logits)  # the runner never writes to it again
            if leave and step in leave:
                gone = running.index(leave[step])
                runner.keep([k for k in range(len(running)) if k != gone])
                running.pop(gone)
        runner.keep([])
    return tokens, logits


def test_fp32_greedy_tokens_equal_the_transformers_model() -> None:
    cache = load_settings().model_cache_dir
    runner = NativeRunner.load(MODEL, cache, "fp32")
    model, _ = load_model(MODEL, cache)
    prompts = [chat(runner, p) for p in PROMPTS]
    ours, _ = greedy(runner, prompts, steps=15)
    with torch.inference_mode():
        for ids, mine in zip(prompts, ours, strict=True):
            out = model.generate(torch.tensor([ids]), max_new_tokens=16, do_sample=False)
            theirs = out[0, len(ids) :].tolist()
            # transformers stops at the end of sequence; the runner goes on
            assert mine[: len(theirs)] == theirs
            assert len(theirs) >= 5


def test_a_row_is_bit_identical_alone_and_in_any_batch(runner: NativeRunner) -> None:
    """int8 rows are bit-identical; float32 ones (BLAS sums vary with the batch) greedy-equal."""
    exact = runner.model.head.__class__.__name__ == "_Int8Linear"
    prompts = [chat(runner, p) for p in PROMPTS]
    alone = [greedy(runner, [p], steps=10) for p in prompts]
    # all rows at once, two of them leaving midway (their slots are refilled by others)
    together = greedy(runner, prompts, steps=10, leave={3: 0, 6: 2})
    reversed_batch = greedy(runner, prompts[::-1], steps=10)
    for i, (tokens, logits) in enumerate(alone):
        cut = {0: 5, 2: 8}.get(i, 11)
        assert together[0][i] == tokens[0][:cut]
        if exact:
            assert all(
                numpy.array_equal(a, b) for a, b in zip(together[1][i], logits[0], strict=False)
            )
        assert reversed_batch[0][len(prompts) - 1 - i] == tokens[0]


# float32 matrix products vary with their row count: bit-identity is an int8 property
@pytest.mark.parametrize("runner", ["int8"], indirect=True)
def test_a_prompt_prefilled_in_chunks_gives_the_same_cache(runner: NativeRunner) -> None:
    ids = runner.tokenizer(prompts.LONG_TEXT)["input_ids"]
    assert len(ids) > 600  # longer than one internal prefill pass
    with runner.context():
        whole = runner.prefill([Prefill(ids)])[0]
        for size in (37, 256):
            prefix = prompts.prefill_in_chunks(runner, ids, size)
            assert numpy.array_equal(prefix.logits, whole.logits)
            for (k1, v1), (k2, v2) in zip(prefix.state, whole.state, strict=True):
                assert torch.equal(k1, k2) and torch.equal(v1, v2)


def test_a_prefix_is_left_unchanged_and_shared_by_rows(runner: NativeRunner) -> None:
    ids = chat(runner, PROMPTS[0])
    with runner.context():
        prefix = runner.prefill([Prefill(ids)])[0]
        before = [(k.clone(), v.clone()) for k, v in prefix.state]
        logits = prefix.logits.copy()
        runner.join(prefix)
        runner.join(prefix)
        first = runner.decode([5, 5])
        assert first.dtype == numpy.float32 and first.shape == (2, len(logits))
        assert numpy.array_equal(first[0], first[1])
        runner.decode([6, 7])
        assert runner.rows == 2
        runner.keep([])
        assert runner.rows == 0
        for (k, v), (k0, v0) in zip(prefix.state, before, strict=True):
            assert torch.equal(k, k0) and torch.equal(v, v0)
        assert numpy.array_equal(prefix.logits, logits)
        # an empty continuation is the prefix itself; the seam's bounds are checked
        assert runner.prefill([Prefill([], prefix)])[0] is prefix
        prompts.check_bounds(runner, prefix)


def test_int8_weights_are_prepared_once_and_a_stale_format_again(tmp_path: Path) -> None:
    checkpoint = checkpoint_dir(MODEL, load_settings().model_cache_dir)
    cache = tmp_path / "cache"
    messages: list[str] = []
    first = prepared_weights(str(checkpoint), cache, progress=messages.append)
    stamp = (first / "weights.safetensors").stat().st_mtime_ns
    assert prepared_weights(str(checkpoint), cache, progress=messages.append) == first
    assert (first / "weights.safetensors").stat().st_mtime_ns == stamp
    assert len(messages) == 1 and "preparing int8 weights" in messages[0]
    assert (first / "tokenizer.json").is_file() and (first / "config.json").is_file()
    # an entry of an older layout is prepared again
    (first / "weights.safetensors").write_bytes(b"\x02\x00\x00\x00\x00\x00\x00\x00{}")
    assert prepared_weights(str(checkpoint), cache, progress=messages.append) == first
    assert len(messages) == 2


def test_an_unknown_architecture_falls_back_or_is_refused(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"]}))
    assert supports(tmp_path) is not None
    auto = load_settings(model=str(tmp_path), model_runner="auto")
    assert select_runner(auto) is None  # the generic runner takes it
    native = load_settings(model=str(tmp_path), model_runner="native")
    with pytest.raises(ConfigError, match="PONDER_MODEL_RUNNER=auto or hf") as info:
        select_runner(native)
    assert "\n" not in str(info.value)
    assert select_runner(load_settings(model=str(tmp_path), model_runner="hf")) is None
    for runner in ("auto", "hf"):  # int8 weights exist in the native runner only
        settings = load_settings(model=str(tmp_path), model_runner=runner, model_weights="int8")
        with pytest.raises(ConfigError, match="PONDER_MODEL_WEIGHTS"):
            select_runner(settings)


def test_the_settings_choose_the_runner_and_its_weights() -> None:
    default = select_runner(load_settings(model=MODEL))
    assert default is not None and default.model.head.__class__.__name__ == "_Linear"
    int8 = select_runner(load_settings(model=MODEL, model_weights="int8"))
    assert int8 is not None and int8.model.head.__class__.__name__ == "_Int8Linear"
    assert select_runner(load_settings(model=MODEL, model_runner="hf")) is None
