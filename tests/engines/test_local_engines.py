"""The per-row contract of the local engines (:mod:`ponder.engines.base`) on the real
SmolLM2-135M model, short generations only.

Every test runs on the default engine (OpenVINO GenAI's pipeline in its engine process);
the cheap ones run on the transformers engine too (``[transformers]``). What is one
engine's own mechanics is tested in ``test_openvino.py`` and ``test_transformers.py``.
"""

from __future__ import annotations

import asyncio
import copy
import math
from typing import TYPE_CHECKING

import pytest

from ponder.engines.base import SampleRequest
from ponder.engines.textrows import encode_prompt
from tests.engines.prompts import (
    CAPITAL,
    HAIKU,
    STORY,
    ActOnCheck,
    failed,
    greedy,
    ok,
    run,
    same,
    sampled,
)

if TYPE_CHECKING:
    from ponder.engines.openvino import OpenVINOEngine
    from ponder.engines.transformers import TransformersEngine

    Engine = OpenVINOEngine | TransformersEngine

pytestmark = pytest.mark.model


@pytest.fixture(
    params=[
        pytest.param("model_engine", id="openvino"),
        pytest.param("hf_engine", id="transformers"),
    ]
)
def engine(request: pytest.FixtureRequest) -> Engine:
    """Each local engine in turn (the session's, loaded once)."""
    loaded: Engine = request.getfixturevalue(request.param)
    return loaded


async def test_greedy_rows_in_a_batch_equal_rows_alone(engine: Engine) -> None:
    prompts = [CAPITAL, HAIKU, "Hi"]  # different prompt lengths
    alone = [(await run(engine, greedy(p)))[0] for p in prompts]
    together = await run(engine, *(greedy(p) for p in prompts))
    for a, b in zip(alone, together, strict=True):
        same(a, b)
        assert a.text and a.prompt_tokens > 0
        assert a.mean_logprob is not None
        assert math.isfinite(a.mean_logprob) and a.mean_logprob < 0
        assert a.token_logprobs is not None and len(a.token_logprobs) == a.completion_tokens
    assert "Paris" in alone[0].text


async def test_a_seed_gives_the_same_text_whatever_the_batch(engine: Engine) -> None:
    assert engine.batch_invariant
    first = await run(engine, sampled(HAIKU, 7), sampled(CAPITAL, 8, top_p=0.9))
    second = await run(
        engine,
        greedy(STORY, 4),
        sampled(CAPITAL, 8, top_p=0.9),
        sampled(STORY, 3, top_p=0.5),
        sampled(HAIKU, 7),
    )
    same(first[0], second[3])
    same(first[1], second[1])


async def test_different_seeds_give_different_samples(engine: Engine) -> None:
    outputs = await run(engine, *(sampled(HAIKU, seed) for seed in range(4)))
    assert len({o.text for o in outputs}) > 1
    for o in outputs:
        assert o.mean_logprob is not None and math.isfinite(o.mean_logprob)


async def test_a_stop_string_ends_the_row_before_it(engine: Engine) -> None:
    free, stopped = await run(engine, greedy(CAPITAL), greedy(CAPITAL, stop=("Paris",)))
    assert "Paris" in free.text
    assert stopped.text == free.text[: free.text.index("Paris")]
    assert stopped.finish_reason == "stop"
    assert stopped.completion_tokens < free.completion_tokens


async def test_max_new_tokens_ends_the_row_with_length(engine: Engine) -> None:
    short, longer = await run(engine, greedy(STORY, 3), greedy(STORY, 7))
    assert (short.completion_tokens, short.finish_reason) == (3, "length")
    assert (longer.completion_tokens, longer.finish_reason) == (7, "length")
    assert longer.text.startswith(short.text)


async def test_the_chat_template_is_applied(engine: Engine) -> None:
    tokenizer = engine._length_tokenizer
    ids = encode_prompt(tokenizer, SampleRequest(prompt="hi"))
    templated = tokenizer.decode(ids)
    assert "<|im_start|>user\nhi<|im_end|>" in templated
    assert templated.endswith("<|im_start|>assistant\n")  # the model answers next
    assert engine.prompt_length(SampleRequest(prompt="hi")) == len(ids)

    messages = [
        {"role": "system", "content": "You answer in one word."},
        {"role": "user", "content": CAPITAL},
    ]
    as_chat = encode_prompt(tokenizer, SampleRequest(messages=messages))
    assert "<|im_start|>system\nYou answer in one word.<|im_end|>" in tokenizer.decode(as_chat)
    (answer,) = await run(engine, SampleRequest(messages=messages, max_new_tokens=8))
    assert "Paris" in answer.text
    assert answer.prompt_tokens == len(as_chat)


async def test_cancelling_a_row_mid_generation_stops_it_alone(engine: Engine) -> None:
    # checked at submit, at admission, then once per step (the openvino engine's rows of
    # one prompt wait one step for the first's prefill): the fifth check is mid-generation
    cancelled = ActOnCheck(prompt=STORY, max_new_tokens=12, checks_left=5)
    outputs = await run(engine, greedy(STORY), cancelled, greedy(HAIKU))
    assert outputs[1].finish_reason == "cancelled"
    assert 0 < outputs[1].completion_tokens < 12
    assert outputs[1].text and outputs[0].text.startswith(outputs[1].text)
    assert [outputs[0].finish_reason, outputs[2].finish_reason] == ["length", "length"]
    assert outputs[0].completion_tokens == 12


async def test_a_cancelled_call_stops_computing_its_row(engine: Engine) -> None:
    loop = asyncio.get_running_loop()
    tasks: list[asyncio.Task[object]] = []
    before = engine.stats.rows_stepped
    tasks.append(
        asyncio.create_task(
            engine.submit(
                ActOnCheck(
                    prompt=STORY,
                    max_new_tokens=64,
                    checks_left=3,
                    action=lambda: loop.call_soon_threadsafe(tasks[0].cancel),
                )
            )
        )
    )
    with pytest.raises(asyncio.CancelledError):
        await tasks[0]
    await run(engine, greedy("Hi", 1))
    assert engine.stats.rows_stepped - before < 63
    assert engine.describe()["rows_running"] == 0


async def test_a_row_cancelled_before_it_starts_costs_nothing(engine: Engine) -> None:
    request = greedy(CAPITAL)
    request.cancel()
    before = copy.copy(engine.stats)
    (output,) = await run(engine, request)
    assert (output.finish_reason, output.completion_tokens) == ("cancelled", 0)
    assert engine.stats == before


async def test_finished_rows_leave_the_batch(engine: Engine) -> None:
    before = engine.stats.rows_stepped
    await run(engine, greedy(STORY, 2), greedy(HAIKU, 8))
    # each row is in as many steps as it generates tokens (but the first, where prefill
    # samples it): the 2-token row leaves after its own, where a fixed batch would keep
    # it for all 8
    first_at_prefill = 2 if engine.first_token_at_prefill else 0
    assert engine.stats.rows_stepped - before == 2 + 8 - first_at_prefill


async def test_text_streams_while_the_row_runs(engine: Engine) -> None:
    pieces: list[str] = []
    request = SampleRequest(prompt=STORY, max_new_tokens=24, on_text=pieces.append)
    output = await engine.submit(request)
    assert len(pieces) > 5
    assert "".join(pieces) == output.text
    stopped: list[str] = []
    free = (await run(engine, greedy(CAPITAL)))[0]
    cut = await engine.submit(
        SampleRequest(prompt=CAPITAL, max_new_tokens=12, stop=["Paris"], on_text=stopped.append)
    )
    assert "".join(stopped) == cut.text == free.text[: free.text.index("Paris")]


async def test_a_row_over_its_limit_returns_its_text_so_far(engine: Engine) -> None:
    output = await engine.submit(SampleRequest(prompt=STORY, max_new_tokens=400, timeout_s=1.0))
    assert output.finish_reason == "timeout"
    assert 0 < output.completion_tokens < 400 and output.text
    assert output.token_logprobs is not None
    assert len(output.token_logprobs) == output.completion_tokens
    assert engine.describe()["rows_running"] == 0


async def test_a_bad_row_fails_alone(engine: Engine) -> None:
    too_long = SampleRequest(prompt="word " * 9000, max_new_tokens=4)
    no_prompt = SampleRequest()
    no_tokens = SampleRequest(prompt=CAPITAL, max_new_tokens=0)
    results = await engine.generate([too_long, greedy(CAPITAL, 4), no_prompt, no_tokens])
    assert "context" in str(failed(results[0]))
    assert ok(results[1]).completion_tokens == 4
    assert "neither a prompt nor messages" in str(failed(results[2]))
    assert "max_new_tokens" in str(failed(results[3]))


async def test_a_preempted_row_resumes_with_the_same_text(engine: Engine) -> None:
    alone = await engine.submit(greedy(STORY, 40))
    rows, preempt = engine.max_rows, engine.preempt_after_s
    engine.max_rows, engine.preempt_after_s = 1, 0.05
    try:
        streaming = asyncio.Event()
        low = SampleRequest(
            prompt=STORY, max_new_tokens=40, priority=5, on_text=lambda _: streaming.set()
        )
        background = asyncio.create_task(engine.submit(low))
        await asyncio.wait_for(streaming.wait(), 30)
        before = engine.stats.preempted
        urgent = await engine.submit(SampleRequest(prompt=CAPITAL, max_new_tokens=4, priority=0))
        assert urgent.completion_tokens == 4
        assert not background.done()  # the urgent row ran while the other waited
        resumed = await background
        assert engine.stats.preempted == before + 1
    finally:
        engine.max_rows, engine.preempt_after_s = rows, preempt
    same(alone, resumed)


# --- the default engine alone (longer generations) ---------------------------------------


async def test_a_row_s_text_is_the_same_alone_in_a_static_batch_and_joining_mid_run(
    invariant_engine: OpenVINOEngine,
) -> None:
    engine = invariant_engine
    alone = (await run(engine, greedy(CAPITAL, 16)))[0]
    seeded_alone = (await run(engine, sampled(HAIKU, 11)))[0]
    static = await run(engine, greedy(HAIKU, 16), greedy(CAPITAL, 16), greedy("Hi", 16))
    streaming = asyncio.Event()
    long = asyncio.create_task(
        engine.submit(
            SampleRequest(prompt=STORY, max_new_tokens=80, on_text=lambda _: streaming.set())
        )
    )
    await asyncio.wait_for(streaming.wait(), 30)  # the long row is running
    joined_before = engine.stats.joined_running
    joining, seeded_joining = await asyncio.gather(
        engine.submit(greedy(CAPITAL, 16)), engine.submit(sampled(HAIKU, 11))
    )
    assert engine.stats.joined_running > joined_before
    assert not long.done()  # the short rows ended while the long one ran on
    same(alone, static[1])
    same(alone, joining)
    same(seeded_alone, seeded_joining)
    assert ok(await long).completion_tokens == 80


@pytest.mark.timeout(180)
async def test_a_short_answer_beside_an_essay_ends_first(model_engine: OpenVINOEngine) -> None:
    writing = asyncio.Event()
    essay_request = SampleRequest(
        prompt=STORY, max_new_tokens=120, on_text=lambda _piece: writing.set()
    )
    essay = asyncio.create_task(model_engine.submit(essay_request))
    await asyncio.wait_for(writing.wait(), 60)  # the essay runs: the answer joins beside it
    short = asyncio.create_task(model_engine.submit(greedy("What is 3 + 3?", 16)))
    done, _ = await asyncio.wait({essay, short}, return_when=asyncio.FIRST_COMPLETED)
    assert done == {short}
    assert ok(await short).finish_reason in ("stop", "length")
    assert ok(await essay).completion_tokens == 120
