"""Calibrated confidence: the shipped fit, the Laplace cap, the features."""

from __future__ import annotations

import math

import pytest

from ponder.enhance.calibration import (
    RESULT_FEATURES,
    SAMPLE_FEATURES,
    Calibration,
    LogisticModel,
    default_calibration,
    laplace_cap,
    result_features,
    sample_features,
)
from ponder.types import Sample, Tokens


def _sample(
    mean_logprob: float | None, finish_reason: str, text: str = "", **fields: object
) -> Sample:
    return Sample(
        index=0,
        temperature=0.0,
        seed=1,
        text=text,
        mean_logprob=mean_logprob,
        finish_reason=finish_reason,
        **fields,  # type: ignore[arg-type]
    )


def test_the_shipped_calibration_has_a_model_per_mode() -> None:
    calibration = default_calibration()
    assert set(calibration.modes) == {"fast", "standard", "deep", "auto"}
    assert set(calibration.modes["standard"].coef) <= set(RESULT_FEATURES)
    assert set(calibration.sample.coef) == set(SAMPLE_FEATURES)
    features = sample_features(_sample(-0.3, "stop", "The answer is 4."), 0.8, "math", "2 + 2?")
    assert 0 < calibration.sample_confidence(features) < 1


def test_logistic_model_and_round_trip() -> None:
    model = LogisticModel(0.5, {"a": 2.0})
    assert model.predict({"a": 0.0}) == pytest.approx(1 / (1 + math.exp(-0.5)))
    assert model.predict({"a": 1e9}) < 1.0  # clipped, never exactly 1
    calibration = Calibration(model, {"standard": model}, {"fitted": True})
    assert Calibration.from_json(calibration.to_json()) == calibration


def test_a_result_is_capped_at_the_laplace_share_of_its_votes() -> None:
    sure = LogisticModel(30.0, {})
    calibration = Calibration(sure, {"standard": sure, "fast": sure}, {})
    assert laplace_cap(1, 1) == pytest.approx(2 / 3)
    assert calibration.result_confidence("fast", {}, votes=1, finished=1) == pytest.approx(2 / 3)
    assert calibration.result_confidence("standard", {}, 8, 8) == pytest.approx(0.9)
    # an unknown mode uses the standard model
    assert calibration.result_confidence("other", {}, 3, 3) == pytest.approx(0.8)


def test_a_mode_fitted_without_the_cap_states_its_model_probability() -> None:
    sure = LogisticModel(2.0, {})
    uncapped = LogisticModel(2.0, {}, cap=False)
    calibration = Calibration(sure, {"standard": uncapped, "fast": sure}, {})
    assert calibration.result_confidence("standard", {}, 1, 1) == pytest.approx(sure.predict({}))
    assert calibration.result_confidence("fast", {}, 1, 1) == pytest.approx(2 / 3)
    assert Calibration.from_json(calibration.to_json()).modes["standard"].cap is False
    # files written before the flag keep the cap
    assert LogisticModel.from_json({"intercept": 2.0, "coef": {}}).cap is True


def test_a_structured_field_uses_the_fields_model_where_one_was_fitted() -> None:
    mode = LogisticModel(2.0, {}, cap=False)
    fields = LogisticModel(-1.0, {"kind_number": 3.0}, cap=False)
    without = Calibration(mode, {"standard": mode}, {})
    with_fields = Calibration(mode, {"standard": mode}, {}, fields=fields)
    number = {"kind_number": 1.0}
    # no fields' model: a field is scored as the mode scores a whole answer
    assert without.field_confidence("standard", number, 1, 1) == pytest.approx(mode.predict({}))
    assert with_fields.field_confidence("standard", number, 1, 1) == pytest.approx(
        1 / (1 + math.exp(-2.0))
    )
    assert with_fields.field_confidence("standard", {}, 1, 1) == pytest.approx(
        1 / (1 + math.exp(1.0))
    )
    assert Calibration.from_json(with_fields.to_json()) == with_fields
    assert Calibration.from_json(without.to_json()).fields is None


def test_features_handle_missing_log_probabilities() -> None:
    features = sample_features(_sample(None, "length"), 1.0, "math", "")
    assert set(features) == set(SAMPLE_FEATURES)
    assert features["mean_logprob"] == -2.5
    assert (features["signals"], features["truncated"], features["repetition"]) == (1.0, 1.0, 0.0)
    looping = "Dave is married.\nDave is married.\nDave is married.\nSo 4."
    assert sample_features(_sample(-0.1, "length", looping), 1.0, "text", "")["repetition"] == 0.5
    assert sample_features(_sample(-40.0, "stop"), 0.0, "math", "")["mean_logprob"] == -5.0


def test_sample_features_describe_path_type_form_and_prompt() -> None:
    sample = _sample(
        -0.5, "stop", "x = 12\nprint(x)", path="pot", answer="12",
        tokens=Tokens(prompt=30, completion=20),
    )  # fmt: skip
    f = sample_features(sample, 0.5, "choice", "Pick 3 of 12 or 7?")
    assert (f["pot"], f["decompose"], f["choice"], f["text"], f["code"]) == (1, 0, 1, 0, 0)
    assert f["integer"] == 1.0 and f["greedy"] == 1.0
    assert f["log_tokens"] == pytest.approx(math.log1p(20))
    assert f["log_answer_chars"] == pytest.approx(math.log1p(2))
    assert f["log_prompt_chars"] == pytest.approx(math.log1p(len("Pick 3 of 12 or 7?")))
    assert f["log_prompt_numbers"] == pytest.approx(math.log1p(3))
    assert f["logprob_choice"] == -0.5 and f["logprob_text"] == 0.0
    worded = sample.model_copy(update={"answer": "twelve", "temperature": 0.4})
    g = sample_features(worded, 0.5, "text", "")
    assert g["integer"] == 0.0 and g["greedy"] == 0.0 and g["logprob_text"] == -0.5
    f = result_features(
        votes=3,
        runner_up=1,
        finished=4,
        greedy_agrees=True,
        logprobs=[-0.2, None],
        signals=[1.0, 0.5],
        confidences=[0.8, 0.6],
    )
    assert f["share"] == 0.75 and f["margin"] == 0.5 and f["greedy_agrees"] == 1.0
    assert f["mean_logprob"] == pytest.approx((-0.2 - 2.5) / 2)
    assert f["sample_confidence"] == pytest.approx(0.7)


def test_a_model_without_its_own_fit_gets_the_pooled_one() -> None:
    assert default_calibration("no-such-model") == default_calibration(None)


def test_the_shipped_fields_model_serves_every_model() -> None:
    # fitted on bench/structured.py's fit half; a model without its own borrows the pooled
    pooled = default_calibration()
    assert pooled.fields is not None
    for model in ("qwen0.5b", "smollm2-135m", "a-model-never-fitted"):
        assert default_calibration(model).fields is not None
