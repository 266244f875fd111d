"""Calibrated confidence: the estimated probability that an answer is right.

Two logistic models, fitted by ``bench/quality.py report --write-calibration`` on the
quality benchmark's recorded samples and shipped as package data
(``calibration.json``):

* per sample: P(this sample's answer is right) from what the engine gives for free and
  the task states: its mean token log-probability, how much of its text repeats itself,
  its answer type's reasoning signals, whether it hit the token limit, its length, its
  reasoning path, the task type, the answer's form (a whole number; its length), the
  prompt's length and how many numbers it holds, and whether the sample is greedy;
* per mode, for the fused result: P(the voted answer is right) from the vote (the
  winner's share of the finished samples, its margin over the runner-up, how many
  samples finished, whether the greedy sample agrees) and the winner's samples (mean
  log-probability, mean signals, mean sample confidence).

A mode's result model may cap its probability at the winner's Laplace share
``(votes + 1) / (finished + 2)`` (2/3 for one sample): the fit keeps the cap where it
lowers the calibration error on held-back problems of the fit half, and drops it where
it only makes a well-supported answer look unsure. An answer of None has probability 0.
Confidence depends on the model: the file holds one fit per benchmark model (by
``PONDER_MODEL`` name) and one over all of them for other models, with the held-out
expected calibration error per mode that the benchmark measured.
"""

from __future__ import annotations

import functools
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any

from ponder.types import Mode, ReasoningPath, Sample

__all__ = [
    "RESULT_FEATURES",
    "SAMPLE_FEATURES",
    "Calibration",
    "LogisticModel",
    "default_calibration",
    "laplace_cap",
    "result_features",
    "sample_features",
]

SAMPLE_FEATURES = (
    "mean_logprob",
    "signals",
    "truncated",
    "repetition",
    "log_tokens",
    "pot",
    "decompose",
    "choice",
    "text",
    "code",
    "integer",
    "log_answer_chars",
    "log_prompt_chars",
    "log_prompt_numbers",
    "greedy",
    "logprob_text",
    "logprob_choice",
)
RESULT_FEATURES = (
    "share",
    "margin",
    "log_finished",
    "greedy_agrees",
    "mean_logprob",
    "signals",
    "sample_confidence",
)
#: log-probabilities below this are clipped (a degenerate sample must not dominate)
_LOGPROB_FLOOR = -5.0
_NUMBER = re.compile(r"\d+(?:\.\d+)?")
_INTEGER = re.compile(r"-?\d+")


@dataclass(frozen=True)
class LogisticModel:
    """``sigmoid(intercept + Σ coef[f] · x[f])`` over named features; ``cap``: a result
    model's probability is also capped at the winner's Laplace share."""

    intercept: float
    coef: Mapping[str, float]
    cap: bool = True

    def predict(self, features: Mapping[str, float]) -> float:
        z = self.intercept + sum(w * features.get(name, 0.0) for name, w in self.coef.items())
        z = max(-30.0, min(30.0, z))
        return 1.0 / (1.0 + math.exp(-z))

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> LogisticModel:
        coef = {k: float(v) for k, v in data["coef"].items()}
        return cls(float(data["intercept"]), coef, bool(data.get("cap", True)))

    def to_json(self) -> dict[str, Any]:
        return {"intercept": self.intercept, "coef": dict(self.coef), "cap": self.cap}


@dataclass(frozen=True)
class Calibration:
    """The fitted models: one per sample, one per mode for results."""

    sample: LogisticModel
    modes: Mapping[str, LogisticModel]
    info: Mapping[str, Any]
    #: a structured result's fields (fitted on ``bench/structured.py``'s fit half), over
    #: :func:`result_features` and the leaf's kind (``kind_<kind>``); None: the mode's
    #: result model scores a field as it scores a whole answer
    fields: LogisticModel | None = None

    def sample_confidence(self, features: Mapping[str, float]) -> float:
        return self.sample.predict(features)

    def result_confidence(
        self, mode: str, features: Mapping[str, float], votes: int, finished: int
    ) -> float:
        """P(the voted answer is right), capped at the Laplace share of its votes where
        the mode's model says so."""
        model = self.modes.get(mode) or self.modes[Mode.standard]
        p = model.predict(features)
        return min(p, laplace_cap(votes, finished)) if model.cap else p

    def field_confidence(
        self, mode: str, features: Mapping[str, float], votes: int, finished: int
    ) -> float:
        """P(a structured result's field is right): the fields' model where one was
        fitted, else the mode's result model."""
        if self.fields is None:
            return self.result_confidence(mode, features, votes, finished)
        p = self.fields.predict(features)
        return min(p, laplace_cap(votes, finished)) if self.fields.cap else p

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Calibration:
        fields = data.get("fields")
        return cls(
            sample=LogisticModel.from_json(data["sample"]),
            modes={m: LogisticModel.from_json(v) for m, v in data["modes"].items()},
            info=data.get("info", {}),
            fields=LogisticModel.from_json(fields) if fields else None,
        )

    def to_json(self) -> dict[str, Any]:
        fields = {"fields": self.fields.to_json()} if self.fields is not None else {}
        return {
            "info": dict(self.info),
            "sample": self.sample.to_json(),
            "modes": {m: v.to_json() for m, v in self.modes.items()},
            **fields,
        }


def laplace_cap(votes: int, finished: int) -> float:
    """``(votes + 1) / (finished + 2)``: what ``votes`` of ``finished`` can support."""
    return (votes + 1) / (finished + 2)


def _logprob(value: float | None) -> float:
    return max(_LOGPROB_FLOOR, value) if value is not None else _LOGPROB_FLOOR / 2


def sample_features(
    sample: Sample, signals: float, task_type: str, prompt: str
) -> dict[str, float]:
    """A finished sample's features (see the module docstring): ``signals`` is its answer
    type's reasoning signals, ``task_type`` the task's resolved type, ``prompt`` the
    task's prompt (its text). A looping text is likely token by token, hence
    ``repetition``: the share of its lines that repeat an earlier one."""
    text = sample.text or ""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    repeated = (len(lines) - len(set(lines))) / len(lines) if lines else 0.0
    logprob = _logprob(sample.mean_logprob)
    answer = sample.answer or ""
    return {
        "mean_logprob": logprob,
        "signals": signals,
        "truncated": 1.0 if sample.finish_reason == "length" else 0.0,
        "repetition": repeated,
        "log_tokens": math.log1p(sample.tokens.completion),
        "pot": 1.0 if sample.path == ReasoningPath.pot else 0.0,
        "decompose": 1.0 if sample.path == ReasoningPath.decompose else 0.0,
        "choice": 1.0 if task_type == "choice" else 0.0,
        "text": 1.0 if task_type == "text" else 0.0,
        "code": 1.0 if task_type == "code" else 0.0,
        "integer": 1.0 if _INTEGER.fullmatch(answer.strip()) else 0.0,
        "log_answer_chars": math.log1p(len(answer)),
        "log_prompt_chars": math.log1p(len(prompt)),
        "log_prompt_numbers": math.log1p(len(_NUMBER.findall(prompt))),
        "greedy": 1.0 if sample.temperature == 0 else 0.0,
        "logprob_text": logprob if task_type == "text" else 0.0,
        "logprob_choice": logprob if task_type == "choice" else 0.0,
    }


def result_features(
    *,
    votes: int,
    runner_up: int,
    finished: int,
    greedy_agrees: bool,
    logprobs: Sequence[float | None],
    signals: Sequence[float],
    confidences: Sequence[float],
) -> dict[str, float]:
    """The features of a voted answer (see the module docstring)."""
    n = max(1, finished)
    return {
        "share": votes / n,
        "margin": (votes - runner_up) / n,
        "log_finished": math.log(n),
        "greedy_agrees": 1.0 if greedy_agrees else 0.0,
        "mean_logprob": sum(_logprob(x) for x in logprobs) / max(1, len(logprobs)),
        "signals": sum(signals) / max(1, len(signals)),
        "sample_confidence": sum(confidences) / max(1, len(confidences)),
    }


@functools.cache
def _shipped() -> dict[str, Any]:
    text = resources.files("ponder.enhance").joinpath("calibration.json").read_text()
    data: dict[str, Any] = json.loads(text)
    return data


@functools.cache
def default_calibration(model: str | None = None) -> Calibration:
    """The calibration shipped with the package (``ponder/enhance/calibration.json``):
    the one fitted for ``model`` (a ``PONDER_MODEL`` name) if there is one, else the one
    fitted on every benchmark model together (whose structured fields' model also serves
    a model without one of its own)."""
    data = _shipped()
    fitted = data.get("models", {}).get(model) if model else None
    if fitted is None:
        return Calibration.from_json(data["default"])
    # a model fitted on prose alone borrows the pooled structured fields' model
    return Calibration.from_json({"fields": data["default"].get("fields"), **fitted})
