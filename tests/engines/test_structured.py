"""Structured rows on the openvino engine (the real SmolLM2-135M, the session's engine):
each row constrained to its own schema inside one continuous batch, a free row beside
them, a schema the pipeline cannot compile, and a preempted structured row."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest

from ponder.engines.base import SampleRequest
from ponder.engines.openvino import OpenVINOEngine
from tests.engines.prompts import CAPITAL, failed, ok, preempted, run

PERSON: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 20},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}
WEATHER: dict[str, Any] = {
    "type": "object",
    "properties": {
        "sky": {"enum": ["clear", "cloudy", "rain"]},
        "windy": {"type": "boolean"},
        "kind": {"const": "report"},
    },
    "required": ["sky", "windy", "kind"],
    "additionalProperties": False,
}


def test_which_engines_constrain_decoding() -> None:
    """The transformers engine cannot: its structured rows are free text, the vote
    validates them."""
    from ponder.engines.openai import OpenAIEngine
    from ponder.engines.scripted import ScriptedEngine
    from ponder.engines.transformers import TransformersEngine

    assert OpenVINOEngine.constrains_json and OpenAIEngine.constrains_json
    assert ScriptedEngine.constrains_json and not TransformersEngine.constrains_json


def structured(prompt: str, schema: dict[str, Any], **kwargs: Any) -> SampleRequest:
    return SampleRequest(prompt=prompt, max_new_tokens=60, json_schema=schema, **kwargs)


def valid(text: str, schema: dict[str, Any]) -> Any:
    value = json.loads(text)
    jsonschema.validate(value, schema)
    return value


@pytest.mark.model
async def test_rows_of_one_batch_follow_their_own_schemas_and_a_free_row_stays_free(
    model_engine: OpenVINOEngine,
) -> None:
    assert model_engine.constrains_json and model_engine.describe()["constrains_json"]
    before = model_engine.stats.max_rows_seen
    model_engine.stats.max_rows_seen = 0
    try:
        person, weather, free = await run(
            model_engine,
            structured("Describe a person as JSON.", PERSON),
            structured("What is the weather like? Answer in JSON.", WEATHER, strict=True),
            SampleRequest(prompt=CAPITAL, max_new_tokens=12),
        )
        assert model_engine.stats.max_rows_seen == 3  # one batch
    finally:
        model_engine.stats.max_rows_seen = max(before, model_engine.stats.max_rows_seen)
    valid(person.text, PERSON)
    assert valid(weather.text, WEATHER)["kind"] == "report"
    assert (person.finish_reason, weather.finish_reason) == ("stop", "stop")
    assert "Paris" in free.text and not free.text.lstrip().startswith("{")


@pytest.mark.model
async def test_a_schema_the_pipeline_cannot_compile_fails_a_strict_row_alone(
    model_engine: OpenVINOEngine,
) -> None:
    """xgrammar refuses a lookahead: the strict row fails naming it, the non-strict row of
    the same schema runs unconstrained, the step's other rows go on; the engine remembers
    the schema (a later strict row fails at once)."""
    lookahead: dict[str, Any] = {
        "type": "object",
        "properties": {"code": {"type": "string", "pattern": "^(?=A)[A-Z]{3}$"}},
        "required": ["code"],
    }
    results = await model_engine.generate(
        [
            structured("Give a code.", lookahead, strict=True),
            structured("Give a code.", lookahead),
            structured("Describe a person as JSON.", PERSON),
            SampleRequest(prompt=CAPITAL, max_new_tokens=12),
        ]
    )
    assert "cannot constrain decoding to this schema" in str(failed(results[0]))
    assert "Lookahead" in str(results[0])
    assert ok(results[1]).completion_tokens > 0
    valid(ok(results[2]).text, PERSON)
    assert "Paris" in ok(results[3]).text
    again = await model_engine.generate([structured("Give a code.", lookahead, strict=True)])
    assert "cannot constrain" in str(failed(again[0]))


@pytest.mark.model
async def test_a_preempted_structured_row_starts_again_and_ends_as_it_would_have(
    model_engine: OpenVINOEngine,
) -> None:
    """A grammar cannot start inside an object: the row is re-added from its prompt with
    its first seed, and on f16 weights it draws the same object; its stream is that text."""
    engine = model_engine
    prompt = "Describe a person as JSON."
    alone = await engine.submit(structured(prompt, PERSON, temperature=1.0, seed=3))
    assert alone.completion_tokens > 8  # long enough to be preempted on its way
    low = structured(prompt, PERSON, temperature=1.0, seed=3)
    _, resumed, pieces = await preempted(engine, low)
    assert (resumed.text, resumed.completion_tokens) == (alone.text, alone.completion_tokens)
    valid(resumed.text, PERSON)
    assert "".join(pieces) == resumed.text
