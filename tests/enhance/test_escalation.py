"""The escalation rule of auto mode across models (ponder.enhance.escalation)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ponder.config import Settings
from ponder.enhance.calibration import Calibration, default_calibration
from ponder.enhance.escalation import (
    ends_unsure,
    escalation_target,
    mark,
    model_calibration,
    models_ran,
    own_samples,
    plan_on_model,
)
from ponder.enhance.strategy import create_strategy, sample_seed
from ponder.types import Result, Sample, SampleStatus, Task
from tests.conftest import make_settings

CHAIN = """
[models.small]
engine = "openvino"
model = "smollm2-135m"
escalate_to = "mid"

[models.mid]
engine = "openvino"
model = "qwen0.5b"
escalate_to = "big"

[models.big]
engine = "openai"
base_url = "http://127.0.0.1:9/v1"
upstream_model = "big-upstream"
escalate_to = "small"
"""


@pytest.fixture
def chain(tmp_path: Path) -> Settings:
    path = tmp_path / "models.toml"
    path.write_text(CHAIN, encoding="utf-8")
    return make_settings(models_file=str(path))


def sample(index: int, model: str | None) -> Sample:
    return Sample(index=index, temperature=0.4, seed=index, status=SampleStatus.done, model=model)


def result(
    stage: int | None = 3, confidence: float = 0.2, stop: str | None = "confident"
) -> Result:
    return Result(
        answer="1",
        text="",
        confidence=confidence,
        agreement=0.4,
        votes={"1": 2},
        chosen_sample=0,
        stage=stage,
        escalations=["second_path", "deep_plan"][: (stage or 1) - 1],
        stop_reason=stop,  # type: ignore[arg-type]
    )


@pytest.mark.parametrize(
    ("stage", "confidence", "stop", "unsure"),
    [
        (3, 0.2, "confident", True),  # stage 3's vote ended, the result still unsure
        (3, 0.2, "complete", True),
        (3, 0.6, "complete", False),  # at the target
        (2, 0.2, "confident", False),  # not the last stage
        (None, 0.2, "complete", False),  # not auto mode
        (3, 0.2, "budget", False),  # the budget ended it
        (3, 0.2, "deadline", False),  # so did the deadline
    ],
)
def test_ends_unsure(stage: int | None, confidence: float, stop: str, unsure: bool) -> None:
    assert ends_unsure(stage, confidence, 0.6, stop) is unsure


def test_the_target_follows_the_chain_and_never_loops(chain: Settings) -> None:
    task = Task(id="t", mode="auto", model="small", samples=[sample(0, "small")])
    assert escalation_target(task, chain, result(), 0.6) == "mid"
    assert escalation_target(task, chain, result(confidence=0.7), 0.6) is None
    task.model, task.samples = "mid", [sample(0, "small"), sample(1, "mid")]
    assert escalation_target(task, chain, result(), 0.6) == "big"
    task.model, task.samples = "big", [*task.samples, sample(2, "big")]
    assert escalation_target(task, chain, result(), 0.6) is None  # small already ran it


def test_a_model_without_escalate_to_or_unknown_ends_there(chain: Settings) -> None:
    plain = make_settings()  # one model, no escalate_to
    task = Task(id="t", mode="auto", samples=[sample(0, "ponder")])
    assert escalation_target(task, plain, result(), 0.6) is None
    task.model = "gone"  # a task of a model this process does not know
    assert escalation_target(task, chain, result(), 0.6) is None


def test_only_the_current_models_samples_vote() -> None:
    samples = [sample(0, "small"), sample(1, "small"), sample(2, "mid"), sample(3, None)]
    assert [s.index for s in own_samples(samples, "mid")] == [2, 3]
    assert models_ran(samples) == ["small", "mid"]


def test_mark_names_the_voters_the_hops_and_where_it_went() -> None:
    samples = [sample(0, "small"), sample(1, "mid"), sample(2, "big")]
    handed = mark(result(), samples[:1], "small", "mid")
    assert (handed.model, handed.escalated_to) == ("small", "mid")
    assert handed.escalations == ["second_path", "deep_plan", "escalate_to:mid"]
    final = mark(result(stage=1), samples, "big")
    assert (final.model, final.escalated_to) == ("big", "big")
    assert final.escalations == [
        "second_path", "deep_plan", "escalate_to:mid",
        "second_path", "deep_plan", "escalate_to:big",
    ]  # fmt: skip
    alone = mark(result(stage=2), samples[:1], "small")
    assert (alone.model, alone.escalated_to, alone.escalations) == ("small", None, ["second_path"])


def test_the_plan_of_the_next_model_follows_the_earlier_samples(chain: Settings) -> None:
    task = Task(
        id="t9", mode="auto", model="mid", samples_planned=5, prompt="What is 2 + 2?",
        samples=[sample(i, "small") for i in range(5)],
    )  # fmt: skip
    planned = plan_on_model(create_strategy(task, chain), task)
    assert [s.index for s in planned] == [5, 6, 7, 8, 9]
    assert {s.model for s in planned} == {"mid"}
    assert [s.seed for s in planned] == [sample_seed("t9", i) for i in range(5, 10)]
    assert planned[0].temperature == 0.0  # its stage 1 is greedy, as on any model


def test_each_model_gets_its_own_calibration(chain: Settings) -> None:
    def calibration(model: str) -> Calibration:
        return model_calibration(Task(id="t", model=model), chain)

    assert calibration("small") is default_calibration("smollm2-135m")
    assert calibration("mid") is default_calibration("qwen0.5b")
    pooled = default_calibration(None).to_json()
    assert calibration("big").to_json() == pooled  # no fit of its own: pooled
    assert default_calibration("qwen0.5b").to_json() != pooled
    assert calibration("mid") is not calibration("small")
