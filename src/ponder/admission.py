"""Admission: a task request becomes a stored, queued task; a caller's task is read or
cancelled. Below the API: the task routes (``/v1/tasks``), the OpenAI routes and the
batch feeder all come through here.

A request that is refused raises :class:`~ponder.errors.AdmissionError` with the status,
code and message of its answer; each caller answers it in its own shape (the error
envelope of ``/v1/tasks``, OpenAI's error object, a batch's error line). Metrics of
submits, rejections and cancels are counted here, once for every caller.
"""

from __future__ import annotations

import json
from typing import Protocol

from ponder import metrics
from ponder.config import ModeConfig, Settings
from ponder.errors import AdmissionError, IdempotencyConflict, QueueFull
from ponder.ids import IdGenerator, parse_task_id
from ponder.schemas import TaskCreate
from ponder.states import is_terminal
from ponder.store.base import Admission, TaskRecords
from ponder.types import CallbackInfo, EventName, Mode, SampleStatus, Task, TaskStatus, utcnow
from ponder.webhooks import check_callback_url

__all__ = [
    "TaskSink",
    "build_task",
    "cancel_task",
    "check_callback",
    "load_task",
    "model_names",
    "resolve_model",
    "submit",
]

_CAS_RETRIES = 10


def model_names(settings: Settings) -> list[str]:
    """Every model name a request may give (what ``GET /v1/models`` lists):
    :meth:`Settings.served_names <ponder.config.Settings.served_names>` (``ponder`` and
    ``ponder-<mode>``, then each configured model ``NAME`` and ``NAME-<mode>``), then the
    aliases of ``PONDER_MODEL_ALIASES``."""
    return [*settings.served_names(), *settings.model_aliases]


def resolve_model(name: str, settings: Settings, param: str = "model") -> tuple[str, Mode | None]:
    """The configured model a model name stands for, and the mode the name selects (None:
    the request's, else the default mode): ``NAME`` and ``NAME-<mode>`` for each
    configured model, ``ponder`` and ``ponder-<mode>`` for the default model, an alias of
    ``PONDER_MODEL_ALIASES`` for what it names. 404 ``model_not_found`` naming ``param``
    for any other name."""
    served = settings.served_names().get(settings.model_aliases.get(name, name))
    if served is not None:
        return served
    modes = "|".join(m.value for m in Mode)
    aliases = f"; aliases: {', '.join(settings.model_aliases)}" if settings.model_aliases else ""
    raise AdmissionError(
        404,
        "model_not_found",
        f"{param}: the model `{name}` does not exist; this service serves "
        f"{', '.join(settings.models)} (each also as NAME-{modes}; `ponder` is "
        f"{settings.default_model}){aliases}. GET /v1/models lists every name; "
        "PONDER_MODEL_ALIASES maps other names",
    )


class TaskSink(Protocol):
    """Where tasks are submitted: the settings, the store and an id generator (the API's
    state has these, and so has the batch feeder)."""

    settings: Settings
    ids: IdGenerator

    @property
    def store(self) -> TaskRecords: ...


def build_task(req: TaskCreate, settings: Settings, *, task_id: str, owner: str) -> Task:
    """Check ``req`` against the configured limits and turn it into a pending Task: on
    the model it names (404 ``model_not_found`` for a name no model has), in the mode it
    gives, else the mode its model name selects."""
    model, named_mode = resolve_model(req.model or settings.default_model, settings)
    if named_mode is not None and "mode" not in req.model_fields_set:
        req = req.model_copy(update={"mode": named_mode})
    mode = settings.mode(req.mode)
    _check_limits(req, settings, mode)
    timeout_s = req.timeout_s if req.timeout_s is not None else mode.task_timeout_s
    queue_timeout_s = req.queue_timeout_s
    if queue_timeout_s is None:
        queue_timeout_s = settings.models[model].queue_timeout_s or settings.queue_timeout_s
    return Task(
        id=task_id,
        model=model,
        queue_timeout_s=queue_timeout_s,
        mode=req.mode,
        task_type=req.task_type,
        priority=req.priority,
        samples_planned=min(req.samples or mode.samples, req.max_samples or mode.max_samples),
        prompt=req.prompt,
        messages=[m.model_dump(exclude_none=True) for m in req.messages] if req.messages else None,
        max_new_tokens=req.max_new_tokens or mode.max_new_tokens,
        temperature=req.temperature
        if req.temperature is not None
        else mode.temperature_for(req.samples or mode.samples),
        timeout_s=timeout_s,
        sample_timeout_s=min(mode.sample_timeout_s, timeout_s),
        tests=req.tests,
        early_stop=req.early_stop,
        target_confidence=req.target_confidence,
        stop=req.stop,
        max_samples=req.max_samples,
        max_total_tokens=req.max_total_tokens,
        metadata=req.metadata,
        response_format=req.response_format.format() if req.response_format else None,
        callback=CallbackInfo(url=str(req.callback_url)) if req.callback_url else None,
        owner=owner,
    )


def _check_limits(req: TaskCreate, settings: Settings, mode: ModeConfig) -> None:
    """422 (413 for the prompt) for what ``req`` asks over the configured limits."""
    if req.prompt_chars() > settings.max_prompt_chars:
        raise AdmissionError(
            413,
            "too_large",
            f"the prompt has {req.prompt_chars()} characters; the limit is "
            f"{settings.max_prompt_chars}",
        )
    caps: list[tuple[str, float | None, float]] = [
        ("samples", req.samples, mode.max_samples),
        ("max_samples", req.max_samples, mode.max_samples),
        ("max_new_tokens", req.max_new_tokens, mode.max_max_new_tokens),
        ("temperature", req.temperature, mode.max_temperature),
        ("timeout_s", req.timeout_s, mode.max_timeout_s),
    ]
    for name, value, cap in caps:
        if value is not None and value > cap:
            shown = value if isinstance(value, int) else f"{value:g}"  # ints may exceed a float
            raise AdmissionError(
                422, "invalid", f"{name}: {shown} is over the {req.mode} mode's maximum {cap:g}"
            )
    metadata_bytes = len(json.dumps(req.metadata, separators=(",", ":")).encode())
    if metadata_bytes > settings.max_metadata_bytes:
        raise AdmissionError(
            422,
            "invalid",
            f"metadata: {metadata_bytes} bytes as JSON; the limit is {settings.max_metadata_bytes}",
        )
    if req.tests is not None and len(req.tests) > settings.max_tests_chars:
        raise AdmissionError(422, "invalid", f"tests: over {settings.max_tests_chars} characters")


async def check_callback(url: str, settings: Settings, param: str = "callback_url") -> None:
    """A webhook URL a request names (``param``: its field): signing must be configured
    and the host public (the SSRF guard of :func:`~ponder.webhooks.check_callback_url`);
    422 ``invalid`` naming ``param`` otherwise."""
    if settings.webhook_secret is None:
        raise AdmissionError(
            422,
            "invalid",
            f"{param}: this service has no webhook signing secret; its operator must set "
            "PONDER_WEBHOOK_SECRET (`ponder keys webhook-secret` prints one)",
        )
    try:
        await check_callback_url(url, settings.callback_allow_private)
    except ValueError as e:
        raise AdmissionError(422, "invalid", str(e).replace("callback_url", param, 1)) from e


async def submit(
    sink: TaskSink,
    req: TaskCreate,
    owner: str,
    idempotency_key: str | None,
    *,
    task_id: str | None = None,
    batch: bool = False,
) -> tuple[Task, bool]:
    """Build the task of ``req`` (with ``task_id``, or a new id) and store it; the task and
    whether it is new (False: the task of an earlier request with ``idempotency_key``).

    ``batch``: a batch line (admitted against the batch lines' own backlog of
    ``batch_max_in_flight``, at ``batch_priority``).
    """
    settings = sink.settings
    task = build_task(req, settings, task_id=task_id or sink.ids.new_id(), owner=owner)
    if req.callback_url is not None:
        await check_callback(str(req.callback_url), settings)
    if batch:
        task.priority = settings.batch_priority
    try:
        admission = Admission(
            max_pending=settings.batch_max_in_flight if batch else settings.max_pending,
            idempotency_key=idempotency_key,
            body_hash=req.body_hash() if idempotency_key else None,
            batch=batch,
        )
        stored, created = await sink.store.create_task(task, admission)
    except QueueFull as e:
        metrics.TASKS_REJECTED.labels(code="queue_full").inc()
        raise AdmissionError(
            503, "queue_full", str(e), headers={"Retry-After": str(settings.retry_after_s)}
        ) from e
    except IdempotencyConflict as e:
        raise AdmissionError(
            409, "conflict", "this Idempotency-Key was used with another request body"
        ) from e
    if created:
        metrics.TASKS_SUBMITTED.labels(mode=task.mode).inc()
    return stored, created


async def load_task(store: TaskRecords, task_id: str, owner: str) -> Task:
    """The caller's task, or 404 (unknown id, malformed id, or another key's task)."""
    task = await store.get_task(task_id) if parse_task_id(task_id) else None
    if task is None or task.owner != owner:
        raise AdmissionError(404, "not_found", f"no task {task_id!r}")
    return task


async def cancel_task(store: TaskRecords, task_id: str, owner: str) -> Task:
    """Cancel a pending or running task (idempotent for a cancelled one; 409 otherwise)."""
    for _ in range(_CAS_RETRIES):
        task = await load_task(store, task_id, owner)
        if task.status == TaskStatus.cancelled:
            return task
        if is_terminal(task.status):
            raise AdmissionError(
                409,
                "conflict",
                f"the task already ended ({task.status.value}); only pending or running "
                "tasks can be cancelled",
                extra={"task": task.to_public()},
            )
        task.status = TaskStatus.cancelled
        task.finished_at = utcnow()
        for sample in task.samples:
            if sample.status in (SampleStatus.queued, SampleStatus.running):
                sample.status = SampleStatus.cancelled
        if await store.update_task(
            task, [(EventName.status, {"status": TaskStatus.cancelled.value})]
        ):
            metrics.TASKS_FINISHED.labels(status="cancelled").inc()
            return task
    raise AdmissionError(503, "unavailable", "the task kept changing while cancelling; retry")
