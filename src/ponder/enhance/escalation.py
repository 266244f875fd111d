"""Auto mode across models: a task whose model ends its cascade unsure continues on the
model's ``escalate_to`` (the models file, docs/models.md).

When the model's last stage (stage 3, the rest of the deep plan) ends with the result's
calibrated confidence still below the task's target (:func:`ends_unsure`), and the model
names an ``escalate_to`` the task has not run on yet (:func:`escalation_target`: a chain
never loops), the worker hands the task over to that model's queue
(:meth:`~ponder.store.base.TaskRecords.hand_over`). The stronger model runs the cascade
from stage 1 with samples of its own, appended after the earlier ones; every sample keeps
the model that ran it (:attr:`~ponder.types.Sample.model`) and only the current model's
samples vote (:func:`own_samples`): no calibration makes one model's confidence comparable
with another's, so votes do not cross models. :func:`mark` writes on a result the model
whose samples voted, the model escalated to, and the hops in ``escalations``
(``escalate_to:NAME`` after the stages of the model that handed the task over).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ponder.config import Settings
from ponder.enhance.calibration import Calibration, default_calibration
from ponder.enhance.strategy import ESCALATIONS, Strategy, sample_seed
from ponder.types import EventName, Result, Sample, Task

__all__ = [
    "HOP",
    "ends_unsure",
    "escalate",
    "escalation_target",
    "mark",
    "model_calibration",
    "models_ran",
    "own_samples",
    "plan_on_model",
]

#: the prefix of a hop to another model in :attr:`Result.escalations`
HOP = "escalate_to:"


def model_calibration(task: Task, settings: Settings) -> Calibration:
    """The calibration of the task's model: the one shipped for its packaged model (or
    the openai engine's upstream model) where there is one, else the pooled one."""
    spec = settings.models.get(task.model)
    name = settings.model if spec is None else (spec.model or spec.upstream_model)
    return default_calibration(name)


def own_samples(samples: Sequence[Sample], model: str) -> list[Sample]:
    """The samples ``model`` ran (one without a model, recorded before there were several,
    counts as the task's own)."""
    return [s for s in samples if s.model is None or s.model == model]


def models_ran(samples: Sequence[Sample]) -> list[str]:
    """The models that ran the samples, in the order they did."""
    return list(dict.fromkeys(s.model for s in samples if s.model is not None))


def ends_unsure(
    stage: int | None, confidence: float, target: float, stop_reason: str | None
) -> bool:
    """Whether an auto result ended its model's last stage below the target: stage 3 ran
    out of samples (not the budget's or the deadline's end) with the calibrated
    confidence under ``target``."""
    return stage == 3 and confidence < target and stop_reason not in ("budget", "deadline")


def escalation_target(task: Task, settings: Settings, result: Result, target: float) -> str | None:
    """The model the task continues on, or None: the result :func:`ends_unsure`, the
    task's model names a configured ``escalate_to``, and the task has not run on it."""
    if not ends_unsure(result.stage, result.confidence, target, result.stop_reason):
        return None
    spec = settings.models.get(task.model)
    to = spec.escalate_to if spec is not None else None
    if to is None or to not in settings.models or to in models_ran(task.samples):
        return None
    return to


def mark(result: Result, samples: Sequence[Sample], model: str, to: str | None = None) -> Result:
    """Set on ``result`` (of ``model``'s samples) its model, the hops of the models that
    ran before it (each after its three stages) and, with ``to``, the hop it takes now;
    ``escalated_to``: ``to``, else ``model`` where earlier models handed it over."""
    earlier = [m for m in models_ran(samples) if m != model]
    hops = [*earlier[1:], model] if earlier else []
    before = [step for hop in hops for step in (*ESCALATIONS, f"{HOP}{hop}")]
    result.model = model
    result.escalations = [*before, *result.escalations, *([f"{HOP}{to}"] if to else [])]
    result.escalated_to = to or (model if earlier else None)
    return result


def plan_on_model(strategy: Strategy, task: Task) -> list[Sample]:
    """The strategy's plan for the task's model, numbered after the samples of the models
    that ran the task before (each sample marked with its model, seeded by its index)."""
    first = len(task.samples)
    planned = strategy.plan()
    for sample in planned:
        sample.index += first
        sample.seed = sample_seed(task.id, sample.index)
        sample.model = task.model
    return planned


def escalate(task: Task, result: Result, to: str) -> list[tuple[str, dict[str, Any]]]:
    """Hand ``task`` (still running) over to model ``to``; the events that say so.

    The current model's ``result`` becomes the task's preliminary answer (marked
    ``escalated_to``: :func:`mark`); ``task.model`` becomes ``to``; ``attempts`` starts
    again at 0: it counts the starts on the current model, so takeovers on the model
    before do not count against ``max_deliveries`` on the new one (a chain of models
    cannot loop: :func:`escalation_target`). The events: the ``preliminary`` answer, then
    a ``status`` event (still ``running``) naming the new ``model`` and ``escalated_from``.
    """
    came_from = task.model
    task.preliminary = mark(result, task.samples, came_from, to)
    task.model, task.attempts = to, 0
    status = {"status": task.status.value, "model": to, "escalated_from": came_from}
    return [
        (EventName.preliminary, task.preliminary.model_dump(mode="json")),
        (EventName.status, status),
    ]
