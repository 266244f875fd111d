"""Calibrated confidence: the shipped fit, the Laplace cap, the features."""

from __future__ import annotations

import math

import pytest

from ponder.enhance.calibration import (
    RESULT_FEATURES,
    Calibration,
    LogisticModel,
    default_calibration,
    laplace_cap,
    result_features,
    sample_features,
)


def test_the_shipped_calibration_has_a_model_per_mode() -> None:
    calibration = default_calibration()
    assert set(calibration.modes) == {"fast", "standard", "deep"}
    assert set(calibration.modes["standard"].coef) <= set(RESULT_FEATURES)
    assert 0 < calibration.sample_confidence(sample_features(-0.3, 0.8, "stop")) < 1


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


def test_features_handle_missing_log_probabilities() -> None:
    assert sample_features(None, 1.0, "length") == {
        "mean_logprob": -2.5,
        "signals": 1.0,
        "truncated": 1.0,
        "repetition": 0.0,
    }
    looping = "Dave is married.\nDave is married.\nDave is married.\nSo 4."
    assert sample_features(-0.1, 1.0, "length", looping)["repetition"] == 0.5
    assert sample_features(-40.0, 0.0, "stop")["mean_logprob"] == -5.0
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
