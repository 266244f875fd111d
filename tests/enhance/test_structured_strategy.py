"""The structured strategy: prompts, judging, the field-wise fuse and the stop rule."""

from __future__ import annotations

import json
from typing import Any

import pytest

from ponder.config import load_settings
from ponder.enhance.calibration import Calibration, LogisticModel
from ponder.enhance.strategy import Strategy, create_strategy
from ponder.enhance.structured_strategy import StructuredStrategy
from ponder.types import ResponseFormat, Sample, SampleStatus, Task, TaskType, Tokens

SETTINGS = load_settings(engine="scripted", redis_url=None)
#: every answer 0.5 sure, results 0.9 (capped by the Laplace share)
FLAT = Calibration(
    sample=LogisticModel(0.0, {}), modes={"standard": LogisticModel(2.2, {})}, info={}
)
#: every answer 0.9999 sure
SURE = Calibration(
    sample=LogisticModel(10.0, {}), modes={"standard": LogisticModel(2.2, {})}, info={}
)
PERSON: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "city": {"type": "string"},
    },
    "required": ["name", "age"],
}


def task(mode: str = "standard", n: int = 5, **kw: Any) -> Task:
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}
    base: dict[str, Any] = {
        "id": "1764412800123-a-1",
        "mode": mode,
        "samples_planned": n,
        "temperature": 0.7,
        "task_type": TaskType.text,
        "prompt": "Who is in this text? Ann Lee, 30, lives in Oslo.",
        "response_format": ResponseFormat.model_validate(fmt),
    }
    return Task(**(base | kw))


def strategy(
    mode: str = "standard", n: int = 5, calibration: Calibration = FLAT, **kw: Any
) -> Strategy:
    return create_strategy(task(mode, n, **kw), SETTINGS, calibration=calibration)


def sample(s: Strategy, index: int, obj: dict[str, Any] | str | None, **kw: Any) -> Sample:
    """A finished sample whose text is ``obj`` (as JSON), judged by ``s``."""
    text = obj if isinstance(obj, str) else json.dumps(obj) if obj is not None else ""
    made = Sample(
        index=index,
        temperature=0.0 if index == 0 else 0.7,
        seed=index,
        status=SampleStatus.done,
        text=text,
        tokens=Tokens(completion=20),
        mean_logprob=-0.3,
        finish_reason="stop",
        **kw,
    )
    s.rejudge(made)
    return made


def queued(index: int) -> Sample:
    return Sample(index=index, temperature=0.7, seed=index)


def ann(**changes: Any) -> dict[str, Any]:
    return {"name": "Ann Lee", "age": 30} | changes


def test_a_structured_task_gets_the_structured_strategy() -> None:
    s = strategy()
    assert isinstance(s, StructuredStrategy)
    assert not isinstance(create_strategy(task(response_format=None), SETTINGS), StructuredStrategy)


def test_every_sample_is_asked_for_one_json_object_of_the_schema() -> None:
    s = strategy("deep", 6)
    plan = s.plan()
    assert {p.path for p in plan} == {"cot"}  # no program, no prose decomposition
    system = s.messages(plan[0])[0]
    assert system["role"] == "system" and "one JSON object" in system["content"]
    assert json.dumps(PERSON) in system["content"]
    loose = create_strategy(task(response_format=ResponseFormat(type="json_object")), SETTINGS)
    assert "JSON Schema" not in loose.messages(plan[0])[0]["content"]


async def test_judge_parses_and_validates_the_object() -> None:
    s = strategy(calibration=SURE)
    good = sample(s, 1, "Here it is:\n```json\n" + json.dumps(ann()) + "\n```")
    assert good.object == ann() and good.schema_error is None
    assert good.answer == '{"age":30,"name":"Ann Lee"}'
    assert good.confidence is not None and good.confidence > 0.99
    bad = Sample(index=2, temperature=0.7, seed=2, status=SampleStatus.done, text='{"name": "Ann"}')
    await s.judge(bad)
    assert bad.object is None and bad.answer is None and bad.confidence == 0.0
    assert bad.schema_error == "the object: 'age' is a required property"


def test_fuse_votes_field_by_field() -> None:
    s = strategy()
    samples = [
        sample(s, 0, ann(city="Oslo")),
        sample(s, 1, ann(name="ann lee", age=30.0)),
        sample(s, 2, ann(age=31, city="Oslo")),
        sample(s, 3, "I could not find anyone."),
    ]
    fusion = s.fuse(samples)
    assert fusion is not None
    result = fusion.result
    assert result.object == {"name": "Ann Lee", "age": 30, "city": "Oslo"}
    assert result.object_from == "fields"
    assert result.answer == result.text == '{"age":30,"city":"Oslo","name":"Ann Lee"}'
    assert result.fields is not None
    assert result.fields["name"].votes == {'"Ann Lee"': 3}
    assert result.fields["age"].votes == {"30": 2, "31": 1}
    assert result.fields["city"].votes == {'"Oslo"': 2, "(absent)": 1}
    # the least confident required field: age (2 of the 3 valid samples)
    assert result.agreement == result.fields["age"].agreement == pytest.approx(2 / 3, abs=1e-4)
    assert result.confidence == min(result.fields[f].confidence for f in ("name", "age"))
    assert result.confidence < result.fields["name"].confidence
    assert sum(result.votes.values()) == 3  # whole objects: the invalid sample does not vote
    assert result.chosen_sample == 0  # it agrees with every voted field


def test_field_confidence_is_calibrated_per_field() -> None:
    s = strategy(calibration=Calibration.from_json(_fitted()))
    samples = [sample(s, i, ann(age=30 + (i == 2))) for i in range(3)]
    fusion = s.fuse(samples)
    assert fusion is not None and fusion.result.fields is not None
    fields = fusion.result.fields
    assert 0 < fields["age"].confidence < fields["name"].confidence < 1


def _fitted() -> dict[str, Any]:
    """A calibration whose result model rises with the share of the votes."""
    return {
        "sample": {"intercept": 0.0, "coef": {}},
        "modes": {"standard": {"intercept": -2.0, "coef": {"share": 5.0}, "cap": False}},
    }


def test_no_valid_sample_is_no_answer() -> None:
    s = strategy()
    fusion = s.fuse([sample(s, 0, "no"), sample(s, 1, {"name": 3})])
    assert fusion is not None
    assert fusion.result.answer is None and fusion.result.object is None
    assert fusion.result.confidence == 0.0 and fusion.result.fields == {}


def test_the_stop_rule_waits_for_every_required_field() -> None:
    s = strategy(n=5)
    # name agrees, age is split: 1 against 1 with 3 left
    split = [sample(s, 0, ann()), sample(s, 1, ann(age=31)), queued(2), queued(3), queued(4)]
    assert not s.stop(split).stop
    # both required fields agree in 3 of 5 (the optional city splits): decided
    agreed = [sample(s, i, ann(city=c)) for i, c in enumerate(["Oslo", "Rome", "Oslo"])]
    check = s.stop([*agreed, queued(3), queued(4)])
    assert check.stop and check.reason == "decided"
    # one sample cannot decide, though every field of it is "unanimous"
    assert not s.stop([sample(s, 0, ann()), queued(1), queued(2), queued(3), queued(4)]).stop


def test_the_stop_rule_reaches_the_target_on_the_weakest_field() -> None:
    s = strategy(n=12, target_confidence=0.9)
    four = [sample(s, i, ann()) for i in range(4)]
    check = s.stop([*four, *(queued(i) for i in range(4, 12))])
    assert check.stop and check.reason == "confident" and check.probability >= 0.9
    three = [*four[:3], sample(s, 3, ann(age=31))]
    check = s.stop([*three, *(queued(i) for i in range(4, 12))])
    assert not check.stop and check.probability < 0.9


def test_auto_mode_escalates_on_the_least_confident_field() -> None:
    s = strategy("auto", 5, target_confidence=0.9, calibration=SURE)
    first = sample(s, 0, ann())
    assert s.stop([first, *(queued(i) for i in range(1, 5))]).stop  # stage 1: sure enough
    unsure = strategy("auto", 5, target_confidence=0.9)  # every field 0.5 sure
    first = sample(unsure, 0, ann())
    assert not unsure.stop([first, *(queued(i) for i in range(1, 5))]).stop
    # stage 2: both agree on every required field (the optional city differs): 1 - 0.5² < 0.9
    pair = [first, sample(unsure, 1, ann(city="Oslo"))]
    check = unsure.stop([*pair, *(queued(i) for i in range(2, 5))])
    assert not check.stop and check.probability == pytest.approx(0.75)
    sure = strategy("auto", 5, target_confidence=0.9, calibration=SURE)
    pair = [sample(sure, 0, ann()), sample(sure, 1, ann(city="Oslo"))]
    assert sure.stop([*pair, *(queued(i) for i in range(2, 5))]).stop
    split = [sample(sure, 0, ann()), sample(sure, 1, ann(age=31))]
    assert not sure.stop([*split, *(queued(i) for i in range(2, 5))]).stop


def test_preliminary_answers_carry_the_fields() -> None:
    s = strategy("standard", 5)
    s.anytime = True
    result = s.preliminary([sample(s, 0, ann()), sample(s, 1, ann(age=31)), queued(2)])
    assert result is not None and result.fields is not None
    assert result.object == ann() and result.fields["age"].votes == {"30": 1, "31": 1}


def test_a_field_for_reasoning_is_asked_for_the_working_step_by_step() -> None:
    from ponder.enhance.structured_strategy import json_instruction

    math = {"type": "object", "properties": {"reasoning": {"type": "string"},
                                             "answer": {"type": "number"}}}  # fmt: skip
    person = {"type": "object", "properties": {"name": {"type": "string"}}}
    assert "every calculation" in json_instruction(math, named=True)
    assert "every calculation" not in json_instruction(person, named=True)
    assert '"reasoning"' in json_instruction(math, named=True)  # the schema itself
