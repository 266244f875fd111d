"""``/v1/tasks``: create, read, cancel and list tasks.

Bodies are read by :class:`StrictJSONRoute`: ``Content-Type`` must be JSON (else 415
``unsupported_media_type``), and integers longer than :data:`MAX_INT_DIGITS` are refused
with 422 before they are converted; :class:`~ponder.api.schemas.TaskCreate` does the rest.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Coroutine
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, Query, Request, Response
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException

from ponder import metrics
from ponder.api.deps import AppState, get_owner, get_state, rate_limit
from ponder.api.errors import ApiError
from ponder.api.schemas import ErrorBody, TaskCreate, TaskList
from ponder.config import Settings
from ponder.errors import IdempotencyConflict, QueueFull
from ponder.ids import parse_task_id
from ponder.states import is_terminal
from ponder.store.base import TaskStore
from ponder.types import CallbackInfo, SampleStatus, Task, TaskStatus, utcnow
from ponder.webhooks import check_callback_url

__all__ = ["MAX_INT_DIGITS", "StrictJSONRoute", "build_task", "cancel_task", "router"]

#: the longest integer a body may hold (digits); a longer one is refused before
#: conversion, which costs time quadratic in its length
MAX_INT_DIGITS = 100


def _parse_int(text: str) -> int:
    digits = len(text.lstrip("-"))
    if digits > MAX_INT_DIGITS:
        raise HTTPException(
            422, f"the body has a number of {digits} digits; numbers have at most {MAX_INT_DIGITS}"
        )
    return int(text)


class _StrictJSONRequest(Request):
    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            body = await self.body()
            try:
                self._json = json.loads(body, parse_int=_parse_int)
            except UnicodeDecodeError as e:
                raise HTTPException(400, "the body is not UTF-8 text") from e
            except RecursionError as e:
                raise HTTPException(400, "the body is nested too deeply") from e
        return self._json


def _is_json(content_type: str) -> bool:
    media_type = content_type.partition(";")[0].strip().lower()
    kind, _, subtype = media_type.partition("/")
    return kind == "application" and (subtype == "json" or subtype.endswith("+json"))


class StrictJSONRoute(APIRoute):
    """A route whose body must be sent as JSON and is parsed without oversized numbers
    (FastAPI answers 422 "not a valid dictionary" to a form body, 400 to a long number)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        if self.body_field is None:
            return handler

        async def strict_handler(request: Request) -> Response:
            content_type = request.headers.get("content-type", "")
            if not _is_json(content_type):
                raise ApiError(
                    415,
                    "unsupported_media_type",
                    f"send the body as JSON with `Content-Type: application/json` (got "
                    f"{content_type or 'no Content-Type'})",
                )
            return await handler(_StrictJSONRequest(request.scope, request.receive))

        return strict_handler


router = APIRouter(
    prefix="/v1", tags=["tasks"], dependencies=[Depends(rate_limit)], route_class=StrictJSONRoute
)

_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorBody} for code in (400, 401, 404, 409, 413, 422, 429, 503)
}
_TASK: dict[int | str, dict[str, Any]] = {200: {"model": Task, "description": "the Task"}}
_CAS_RETRIES = 10


def build_task(req: TaskCreate, settings: Settings, *, task_id: str, owner: str) -> Task:
    """Check ``req`` against the configured limits and turn it into a pending Task."""
    mode = settings.mode(req.mode)
    if req.prompt_chars() > settings.max_prompt_chars:
        raise ApiError(
            413,
            "too_large",
            f"the prompt has {req.prompt_chars()} characters; the limit is "
            f"{settings.max_prompt_chars}",
        )
    caps: list[tuple[str, float | None, float]] = [
        ("samples", req.samples, mode.max_samples),
        ("max_new_tokens", req.max_new_tokens, mode.max_max_new_tokens),
        ("temperature", req.temperature, mode.max_temperature),
        ("timeout_s", req.timeout_s, mode.max_timeout_s),
    ]
    for name, value, cap in caps:
        if value is not None and value > cap:
            shown = value if isinstance(value, int) else f"{value:g}"  # ints may exceed a float
            raise ApiError(
                422, "invalid", f"{name}: {shown} is over the {req.mode} mode's maximum {cap:g}"
            )
    metadata_bytes = len(json.dumps(req.metadata, separators=(",", ":")).encode())
    if metadata_bytes > settings.max_metadata_bytes:
        raise ApiError(
            422,
            "invalid",
            f"metadata: {metadata_bytes} bytes as JSON; the limit is {settings.max_metadata_bytes}",
        )
    if req.tests is not None and len(req.tests) > settings.max_tests_chars:
        raise ApiError(422, "invalid", f"tests: over {settings.max_tests_chars} characters")
    timeout_s = req.timeout_s if req.timeout_s is not None else mode.task_timeout_s
    return Task(
        id=task_id,
        mode=req.mode,
        task_type=req.task_type,
        priority=req.priority,
        samples_planned=req.samples or mode.samples,
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
        metadata=req.metadata,
        callback=CallbackInfo(url=str(req.callback_url)) if req.callback_url else None,
        owner=owner,
    )


async def load_task(store: TaskStore, task_id: str, owner: str) -> Task:
    """The caller's task, or 404 (unknown id, malformed id, or another key's task)."""
    task = await store.get_task(task_id) if parse_task_id(task_id) else None
    if task is None or task.owner != owner:
        raise ApiError(404, "not_found", f"no task {task_id!r}")
    return task


async def cancel_task(store: TaskStore, task_id: str, owner: str) -> Task:
    """Cancel a pending or running task (idempotent for a cancelled one; 409 otherwise)."""
    for _ in range(_CAS_RETRIES):
        task = await load_task(store, task_id, owner)
        if task.status == TaskStatus.cancelled:
            return task
        if is_terminal(task.status):
            raise ApiError(
                409,
                "conflict",
                f"the task already ended ({task.status.value}); only pending or running "
                "tasks can be cancelled",
                body_extra={"task": task.to_public()},
            )
        task.status = TaskStatus.cancelled
        task.finished_at = utcnow()
        for sample in task.samples:
            if sample.status in (SampleStatus.queued, SampleStatus.running):
                sample.status = SampleStatus.cancelled
        if await store.update_task(task, [("status", {"status": "cancelled"})]):
            metrics.TASKS_FINISHED.labels(status="cancelled").inc()
            return task
    raise ApiError(503, "unavailable", "the task kept changing while cancelling; retry")


State = Annotated[AppState, Depends(get_state)]
Owner = Annotated[str, Depends(get_owner)]


@router.post(
    "/tasks",
    status_code=202,
    responses={
        202: {"model": Task, "description": "the new Task"},
        200: {"model": Task, "description": "the Task of an earlier request (Idempotency-Key)"},
        415: {"model": ErrorBody, "description": "the body is not sent as JSON"},
        **_ERRORS,
    },
)
async def create_task(
    req: TaskCreate,
    state: State,
    owner: Owner,
    idempotency_key: Annotated[str | None, Header(max_length=255)] = None,
) -> JSONResponse:
    """Submit a task; answers 202 at once with the Task (200 for an idempotent repeat)."""
    settings = state.settings
    task = build_task(req, settings, task_id=state.ids.new_id(), owner=owner)
    if req.callback_url is not None:
        if settings.webhook_secret is None:
            raise ApiError(
                422,
                "invalid",
                "callback_url: this service has no webhook signing secret; its operator must "
                "set PONDER_WEBHOOK_SECRET (`ponder keys webhook-secret` prints one)",
            )
        try:
            await check_callback_url(str(req.callback_url), settings.callback_allow_private)
        except ValueError as e:
            raise ApiError(422, "invalid", str(e)) from e
    try:
        stored, created = await state.store.create_task(
            task,
            max_pending=settings.max_pending,
            idempotency_key=idempotency_key,
            body_hash=req.body_hash() if idempotency_key else None,
        )
    except QueueFull as e:
        metrics.TASKS_REJECTED.labels(code="queue_full").inc()
        raise ApiError(
            503, "queue_full", str(e), headers={"Retry-After": str(settings.retry_after_s)}
        ) from e
    except IdempotencyConflict as e:
        raise ApiError(
            409, "conflict", "this Idempotency-Key was used with another request body"
        ) from e
    if created:
        metrics.TASKS_SUBMITTED.labels(mode=task.mode).inc()
    return JSONResponse(
        stored.to_public(),
        status_code=202 if created else 200,
        headers={"Location": f"/v1/tasks/{stored.id}"},
    )


@router.get("/tasks/{task_id}", response_model=None, responses=_TASK | _ERRORS)
async def get_task(task_id: str, state: State, owner: Owner) -> dict[str, Any]:
    """The task with its samples, result and error."""
    return (await load_task(state.store, task_id, owner)).to_public()


@router.delete("/tasks/{task_id}", response_model=None, responses=_TASK | _ERRORS)
async def delete_task(task_id: str, state: State, owner: Owner) -> dict[str, Any]:
    """Cancel a pending or running task."""
    return (await cancel_task(state.store, task_id, owner)).to_public()


@router.get("/tasks", responses=_ERRORS)
async def list_tasks(
    state: State,
    owner: Owner,
    status: TaskStatus | None = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    cursor: Annotated[str | None, Query(max_length=200)] = None,
) -> TaskList:
    """The caller's tasks, newest first; pass ``next_cursor`` back as ``cursor``."""
    try:
        tasks, next_cursor = await state.store.list_tasks(
            owner, status=status, limit=limit, cursor=cursor
        )
    except ValueError as e:
        raise ApiError(422, "invalid", "cursor: not a cursor this service returned") from e
    return TaskList(data=[t.to_public() for t in tasks], next_cursor=next_cursor)
