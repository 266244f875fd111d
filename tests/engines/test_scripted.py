from __future__ import annotations

import asyncio
import time

import pytest

from ponder.engines.base import SampleOutput, SampleRequest
from ponder.engines.scripted import ScriptedEngine, parse_directives
from ponder.errors import EngineError


def req(prompt: str, index: int = 0) -> SampleRequest:
    return SampleRequest(prompt=prompt, sample_index=index)


def test_parse_directives() -> None:
    assert parse_directives("x [[answers: 42, 17]] [[sleep_ms: 5]] [[fail]]") == {
        "answers": "42, 17",
        "sleep_ms": "5",
        "fail": "",
    }


async def test_answers_cycle_per_sample_index() -> None:
    engine = ScriptedEngine()
    prompt = "q [[answers: 42, 42, 17]]"
    out = await engine.generate([req(prompt, i) for i in range(4)])
    texts = [o.text for o in out if isinstance(o, SampleOutput)]
    assert [t.rsplit(" ", 1)[-1] for t in texts] == ["42.", "42.", "17.", "42."]
    assert all(t.startswith("Let me work through this") for t in texts)


async def test_default_answer_is_stable_and_prompt_dependent() -> None:
    engine = ScriptedEngine()
    a1, a2, b = await engine.generate([req("alpha"), req("alpha"), req("beta")])
    assert isinstance(a1, SampleOutput) and isinstance(a2, SampleOutput)
    assert isinstance(b, SampleOutput)
    assert a1.text == a2.text != b.text


async def test_fail_values_fail_only_their_sample() -> None:
    engine = ScriptedEngine()
    out = await engine.generate([req("[[answers: 1, fail]]", 0), req("[[answers: 1, fail]]", 1)])
    assert isinstance(out[0], SampleOutput)
    assert isinstance(out[1], EngineError)
    out = await engine.generate([req("[[fail]]", 0), req("ok", 0)])
    assert isinstance(out[0], EngineError) and isinstance(out[1], SampleOutput)


async def test_poison_fails_the_whole_batch() -> None:
    with pytest.raises(EngineError):
        await ScriptedEngine().generate([req("ok"), req("[[poison]]")])


async def test_hang_returns_only_when_cancelled() -> None:
    engine = ScriptedEngine()
    r = req("[[hang]]")
    call = asyncio.create_task(engine.generate([r]))
    done, _ = await asyncio.wait({call}, timeout=0.05)
    assert not done
    r.cancel()
    (out,) = await asyncio.wait_for(call, 1)
    assert isinstance(out, SampleOutput) and out.finish_reason == "cancelled"


async def test_latency_model_per_batch() -> None:
    engine = ScriptedEngine(batch_ms=(30, 5))
    assert engine.batch_latency_s(4) == pytest.approx(0.05)
    start = time.monotonic()
    await engine.generate([req("a"), req("b"), req("c"), req("d")])
    assert time.monotonic() - start >= 0.05
    assert engine.batch_sizes == [4]


async def test_sleep_ms_directive() -> None:
    start = time.monotonic()
    await ScriptedEngine().generate([req("[[sleep_ms: 40]]")])
    assert time.monotonic() - start >= 0.04
