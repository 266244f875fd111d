"""The scripted engine: directives, its step latency model, and the continuous loop it
shares with the local model engine (rows join and leave per step, admission by priority)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import jsonschema
import pytest

from ponder.engines.base import SampleOutput, SampleRequest
from ponder.engines.scripted import DEFAULT_TOKENS, ScriptedEngine, parse_directives
from ponder.errors import EngineBusy, EngineDeadError, EngineError


def req(prompt: str, index: int = 0, **kwargs: object) -> SampleRequest:
    return SampleRequest(prompt=prompt, sample_index=index, **kwargs)  # type: ignore[arg-type]


async def in_engine(engine: ScriptedEngine, row: SampleRequest) -> asyncio.Task[SampleOutput]:
    """Submit ``row``; return its submit once the row's first text came (it holds a slot)."""
    running = asyncio.Event()
    row.on_text = lambda _: running.set()
    submitted = asyncio.create_task(engine.submit(row))
    await asyncio.wait_for(running.wait(), 5)
    return submitted


@pytest.fixture
async def engine() -> AsyncIterator[ScriptedEngine]:
    e = ScriptedEngine()
    await e.start()
    yield e
    await e.close()


def test_parse_directives() -> None:
    assert parse_directives("x [[answers: 42, 17]] [[sleep_ms: 5]] [[fail]]") == {
        "answers": "42, 17",
        "sleep_ms": "5",
        "fail": "",
    }


async def test_answers_cycle_per_sample_index(engine: ScriptedEngine) -> None:
    prompt = "q [[answers: 42, 42, 17]]"
    out = await engine.generate([req(prompt, i) for i in range(4)])
    texts = [o.text for o in out if isinstance(o, SampleOutput)]
    assert [t.rsplit(" ", 1)[-1] for t in texts] == ["42.", "42.", "17.", "42."]
    assert all(t.startswith("Let me work through this") for t in texts)
    assert all(o.completion_tokens == DEFAULT_TOKENS for o in out if isinstance(o, SampleOutput))


async def test_default_answer_is_stable_and_prompt_dependent(engine: ScriptedEngine) -> None:
    a1, a2, b = await engine.generate([req("alpha"), req("alpha"), req("beta")])
    assert isinstance(a1, SampleOutput) and isinstance(a2, SampleOutput)
    assert isinstance(b, SampleOutput)
    assert a1.text == a2.text != b.text


async def test_fail_values_fail_only_their_sample(engine: ScriptedEngine) -> None:
    out = await engine.generate([req("[[answers: 1, fail]]", 0), req("[[answers: 1, fail]]", 1)])
    assert isinstance(out[0], SampleOutput)
    assert isinstance(out[1], EngineError)
    out = await engine.generate([req("[[fail]]", 0), req("ok", 0)])
    assert isinstance(out[0], EngineError) and isinstance(out[1], SampleOutput)


async def test_a_directive_that_is_not_a_number_fails_its_row(engine: ScriptedEngine) -> None:
    with pytest.raises(EngineError, match="needs a number"):
        await engine.submit(req("[[tokens: many]]"))
    assert (await engine.submit(req("fine"))).finish_reason == "stop"


async def test_hang_returns_only_when_cancelled(engine: ScriptedEngine) -> None:
    r = req("[[hang]]")
    call = asyncio.create_task(engine.submit(r))
    done, _ = await asyncio.wait({call}, timeout=0.05)
    assert not done
    r.cancel()
    out = await asyncio.wait_for(call, 1)
    assert out.finish_reason == "cancelled"


async def test_a_row_over_its_limit_returns_its_text_so_far() -> None:
    engine = ScriptedEngine(step_ms=(10, 0))
    try:
        out = await asyncio.wait_for(
            engine.submit(req("[[tokens: 500]]", timeout_s=0.2, max_new_tokens=1000)), 5
        )
    finally:
        await engine.close()
    assert out.finish_reason == "timeout"
    assert 5 <= out.completion_tokens < 500
    assert out.text.startswith("Let me work") and len(out.text.split()) == out.completion_tokens


async def test_tokens_directive_sets_the_length_and_max_new_tokens_cuts_it(
    engine: ScriptedEngine,
) -> None:
    out = await engine.submit(req("[[tokens: 30]] [[answers: 9]]"))
    assert out.completion_tokens == 30 and out.text.endswith("The answer is 9.")
    cut = await engine.submit(req("[[tokens: 30]]", max_new_tokens=7))
    assert (cut.completion_tokens, cut.finish_reason) == (7, "length")


async def test_text_streams_word_by_word(engine: ScriptedEngine) -> None:
    pieces: list[str] = []
    out = await engine.submit(req("[[tokens: 6]] [[answers: 3]]", on_text=pieces.append))
    assert "".join(pieces) == out.text
    assert len(pieces) >= 2  # the first piece at once, the rest with the row's end


async def test_a_fast_engine_hands_its_pieces_over_coalesced() -> None:
    """Steps of 0 ms: the first piece at once, then at most one delivery per 20 ms, not
    one per step (each wakes the event loop); steps slower than that: a piece a step."""
    fast, slow = ScriptedEngine(), ScriptedEngine(step_ms=(40, 0))
    try:
        many: list[str] = []
        out = await fast.submit(req("[[tokens: 60]] [[answers: 3]]", on_text=many.append))
        assert "".join(many) == out.text and out.completion_tokens == 60
        assert 2 <= len(many) < 60
        each: list[str] = []
        out = await slow.submit(req("[[tokens: 5]] [[answers: 3]]", on_text=each.append))
        assert "".join(each) == out.text and len(each) == out.completion_tokens == 5
    finally:
        await fast.close()
        await slow.close()


async def test_step_latency_model() -> None:
    engine = ScriptedEngine(step_ms=(30, 5))
    assert engine.step_latency_s(4) == pytest.approx(0.05)
    try:
        start = time.monotonic()
        await engine.generate([req(f"[[tokens: 2]] {i}") for i in range(4)])
        elapsed = time.monotonic() - start
    finally:
        await engine.close()
    # two steps of four rows (the rows may start one step apart: at most three steps)
    assert elapsed >= 0.1
    assert engine.stats.rows_stepped == 8


async def test_sleep_ms_delays_only_its_own_row() -> None:
    engine = ScriptedEngine(step_ms=(1, 0))
    try:
        submitted = time.monotonic()  # the sleep counts from the row's admission, later
        slow = asyncio.create_task(engine.submit(req("[[sleep_ms: 300]] [[tokens: 2]]")))
        await asyncio.sleep(0.01)
        start = time.monotonic()
        await engine.submit(req("[[tokens: 5]]"))
        fast_s = time.monotonic() - start
        assert not slow.done()
        await slow
        assert time.monotonic() - submitted >= 0.3
    finally:
        await engine.close()
    assert fast_s < 0.25  # it did not wait for the sleeping row


async def test_a_short_row_beside_a_long_one_ends_first() -> None:
    engine = ScriptedEngine(step_ms=(2, 0))
    try:
        long = await in_engine(engine, req("[[tokens: 400]]", max_new_tokens=1000))
        short = asyncio.create_task(engine.submit(req("[[tokens: 4]]")))
        done, _ = await asyncio.wait({long, short}, return_when=asyncio.FIRST_COMPLETED)
        assert done == {short}
        assert (await long).completion_tokens == 400
    finally:
        await engine.close()
    assert engine.stats.joined_running >= 1  # the short row joined the running batch


async def test_a_cancelled_row_frees_its_slot_within_one_step() -> None:
    engine = ScriptedEngine(step_ms=(5, 0), max_rows=1)
    try:
        first = req("[[tokens: 10000]]", max_new_tokens=10000)
        running = await in_engine(engine, first)
        waiting = asyncio.create_task(engine.submit(req("[[tokens: 1]]")))
        await asyncio.sleep(0.05)
        assert not waiting.done()  # no slot
        steps = engine.stats.steps
        first.cancel()
        await asyncio.wait_for(waiting, 2)
        assert engine.stats.steps - steps <= 3  # the retiring step, the waiting row's step
        assert (await running).finish_reason == "cancelled"
    finally:
        await engine.close()


async def test_a_priority_0_flood_does_not_starve_priority_5() -> None:
    engine = ScriptedEngine(step_ms=(1, 0), max_rows=2, max_queue=200)
    order: list[int] = []

    async def one(priority: int) -> None:
        await engine.submit(req("[[tokens: 1]]", priority=priority))
        order.append(priority)

    try:
        blocker = req("[[tokens: 10000]]", max_new_tokens=10000)
        blocking = await in_engine(engine, blocker)
        jobs = [asyncio.create_task(one(0)) for _ in range(60)]
        jobs += [asyncio.create_task(one(5)) for _ in range(5)]
        await asyncio.wait_for(asyncio.gather(*jobs), 20)
        blocker.cancel()
        await blocking
    finally:
        await engine.close()
    # with quotas 4,3,2,2,1,1 priority 5 gets 1 of every 5 slots while both wait
    assert max(i for i, p in enumerate(order) if p == 5) < 40  # strict priority: >= 60


async def test_the_admission_queue_is_bounded() -> None:
    engine = ScriptedEngine(step_ms=(2, 0), max_rows=1, max_queue=2)
    first = req("[[tokens: 10000]]", max_new_tokens=10000)
    rows = [first] + [req("[[hang]]") for _ in range(3)]
    try:
        tasks = [await in_engine(engine, first)]  # the one slot is taken
        tasks += [asyncio.create_task(engine.submit(r)) for r in rows[1:3]]
        await asyncio.sleep(0)  # both queued
        with pytest.raises(EngineBusy, match="PONDER_ENGINE_MAX_QUEUE"):
            await engine.submit(rows[3])
        for r in rows:
            r.cancel()
        outs = await asyncio.wait_for(asyncio.gather(*tasks), 2)
        assert {o.finish_reason for o in outs} == {"cancelled"}
    finally:
        await engine.close()


async def test_closing_fails_waiting_rows_and_later_submits() -> None:
    engine = ScriptedEngine()
    call = asyncio.create_task(engine.submit(req("[[hang]]")))
    await asyncio.sleep(0.05)
    await engine.close()
    with pytest.raises(EngineDeadError):
        await call
    with pytest.raises(EngineDeadError):
        await engine.submit(req("x"))


async def test_an_overdue_urgent_row_preempts_a_much_less_urgent_one() -> None:
    engine = ScriptedEngine(step_ms=(2, 0), max_rows=1, preempt_after_ms=50)
    try:
        background = await in_engine(engine, req("[[tokens: 300]]", max_new_tokens=300, priority=5))
        same_level = asyncio.create_task(engine.submit(req("[[tokens: 2]]", priority=4)))
        urgent = await asyncio.wait_for(engine.submit(req("[[tokens: 3]]", priority=1)), 5)
        assert urgent.completion_tokens == 3
        assert not background.done()  # it resumes after the urgent row
        resumed = await asyncio.wait_for(background, 10)
        await same_level
    finally:
        await engine.close()
    assert engine.stats.preempted == 1  # priority 4 is not 2 levels above 5: no preemption
    uninterrupted = ScriptedEngine()
    try:
        alone = await uninterrupted.submit(req("[[tokens: 300]]", max_new_tokens=300))
    finally:
        await uninterrupted.close()
    assert (resumed.text, resumed.completion_tokens) == (alone.text, alone.completion_tokens)


async def test_without_preemption_an_urgent_row_waits_for_a_slot() -> None:
    engine = ScriptedEngine(step_ms=(2, 0), max_rows=1)
    try:
        background = await in_engine(engine, req("[[tokens: 100]]", max_new_tokens=100, priority=5))
        urgent = asyncio.create_task(engine.submit(req("[[tokens: 3]]", priority=0)))
        done, _ = await asyncio.wait({background, urgent}, return_when=asyncio.FIRST_COMPLETED)
        assert done == {background}
        await urgent
    finally:
        await engine.close()
    assert engine.stats.preempted == 0


async def test_the_most_urgent_waiting_row_is_admitted_first() -> None:
    """Deep mode's promoted first sample (two levels up) starts ahead of its siblings."""
    engine = ScriptedEngine(step_ms=(1, 0), max_rows=1)
    order: list[int] = []
    try:
        blocker = req("[[tokens: 10000]]", max_new_tokens=10000)
        blocking = await in_engine(engine, blocker)

        async def sample(index: int, priority: int) -> None:
            await engine.submit(req("[[tokens: 2]]", index, priority=priority))
            order.append(index)

        jobs = [asyncio.create_task(sample(i, 3)) for i in (1, 2, 3, 4)]
        jobs.append(asyncio.create_task(sample(0, 1)))  # submitted last, promoted
        await asyncio.sleep(0.05)
        blocker.cancel()
        await asyncio.wait_for(asyncio.gather(*jobs), 5)
        await blocking
    finally:
        await engine.close()
    assert order[0] == 0


# --- structured rows -------------------------------------------------------------------

ORDER: dict[str, Any] = {
    "type": "object",
    "properties": {
        "answer": {"type": "number", "minimum": 0},
        "customer": {
            "type": "object",
            "properties": {
                "name": {"type": "string", "minLength": 2, "maxLength": 12},
                "email": {"type": "string", "format": "email"},
                "code": {"type": "string", "pattern": "^[A-Z]{3}-\\d{2,4}$"},
            },
            "required": ["name"],
            "additionalProperties": False,
        },
        "status": {"enum": ["open", "paid", "shipped"]},
        "kind": {"const": "order"},
        "express": {"type": "boolean"},
        "items": {
            "type": "array",
            "items": {"type": "integer", "exclusiveMinimum": 0, "maximum": 9},
            "minItems": 2,
            "maxItems": 4,
        },
        "note": {"type": ["string", "null"]},
        "discount": {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1},
    },
    "required": ["answer", "customer", "status", "kind"],
    "additionalProperties": False,
}


def structured(prompt: str, index: int = 0, **kwargs: object) -> SampleRequest:
    return req(prompt, index, **{"json_schema": ORDER, "max_new_tokens": 200, **kwargs})


async def objects(engine: ScriptedEngine, *rows: SampleRequest) -> list[dict[str, Any]]:
    """The rows' objects, each valid for its schema."""
    out = []
    for row, result in zip(rows, await engine.generate(list(rows)), strict=True):
        assert isinstance(result, SampleOutput), result
        value = json.loads(result.text)
        jsonschema.validate(value, row.json_schema or {})
        out.append(value)
    return out


async def test_a_structured_row_is_an_object_valid_for_its_schema_the_same_per_sample(
    engine: ScriptedEngine,
) -> None:
    assert engine.constrains_json and engine.describe()["constrains_json"]
    a, b, other = await objects(
        engine, structured("q", 0, seed=1), structured("q", 1, seed=2), structured("r")
    )
    assert a == b != other  # derived from the prompt and the schema, not the sample
    assert set(a) == set(ORDER["properties"]) and a["kind"] == "order"
    assert set(a["customer"]) == {"name", "email", "code"}
    assert a["customer"]["email"] == "ann@example.com"
    minimal = {"type": "object"}
    (empty,) = await objects(engine, req("q", json_schema=minimal))
    assert empty == {}


async def test_unbounded_and_half_bounded_numbers_are_drawn(engine: ScriptedEngine) -> None:
    # a plain {"type": "integer"} once stopped the engine's thread (math.ceil of -inf)
    numbers = {
        "type": "object",
        "properties": {
            "n": {"type": "integer"},
            "low": {"type": "integer", "minimum": 5},
            "high": {"type": "integer", "exclusiveMaximum": -3},
            "x": {"type": "number"},
        },
        "required": ["n", "low", "high", "x"],
    }
    (value,) = await objects(engine, req("q", json_schema=numbers, max_new_tokens=200))
    assert value["low"] >= 5 and value["high"] < -3


async def test_directives_steer_the_answer_and_chosen_fields_per_sample(
    engine: ScriptedEngine,
) -> None:
    prompt = (
        "q [[answers: 42, 42, 17]] [[fields: status = paid | open; customer.name = Ann]]"
        " [[vary: items]]"
    )
    rows = [structured(prompt, i, seed=7) for i in range(3)]
    first, second, third = await objects(engine, *rows)
    assert [o["answer"] for o in (first, second, third)] == [42, 42, 17]
    assert [o["status"] for o in (first, second, third)] == ["paid", "open", "paid"]
    assert {o["customer"]["name"] for o in (first, second, third)} == {"Ann"}
    assert len({json.dumps(o["items"]) for o in (first, second, third)}) > 1  # varied
    assert first["note"] == second["note"] and first["express"] == second["express"]


async def test_a_sample_can_be_made_invalid_or_cut_on_purpose(engine: ScriptedEngine) -> None:
    prompt = "q [[fields: status = lost | paid]] [[json: ok, ok, cut]]"
    lost, paid, cut = await engine.generate([structured(prompt, i) for i in range(3)])
    assert isinstance(lost, SampleOutput) and isinstance(paid, SampleOutput)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(json.loads(lost.text), ORDER)
    jsonschema.validate(json.loads(paid.text), ORDER)
    assert isinstance(cut, SampleOutput)
    with pytest.raises(json.JSONDecodeError):
        json.loads(cut.text)


async def test_a_structured_row_streams_its_object_and_its_budget_cuts_it(
    engine: ScriptedEngine,
) -> None:
    pieces: list[str] = []
    row = structured("q", on_text=pieces.append)
    (whole,) = await engine.generate([row])
    assert isinstance(whole, SampleOutput) and whole.finish_reason == "stop"
    assert "".join(pieces) == whole.text
    assert whole.completion_tokens == len(whole.text.split(" "))
    (short,) = await engine.generate([structured("q", max_new_tokens=3)])
    assert isinstance(short, SampleOutput) and short.finish_reason == "length"
    assert whole.text.startswith(short.text) and short.text != whole.text
