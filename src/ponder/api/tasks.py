"""``/v1/tasks``: create, read, cancel and list tasks (admission is
:mod:`ponder.admission`; its errors answer with the envelope, :mod:`ponder.api.errors`).

Bodies are read by :class:`StrictJSONRoute`: ``Content-Type`` must be JSON (else 415
``unsupported_media_type``), and integers longer than :data:`MAX_INT_DIGITS` are refused
with 422 before they are converted; :class:`~ponder.schemas.TaskCreate` does the rest.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Coroutine
from typing import Annotated, Any

from fastapi import APIRouter, Header, Query, Request, Response
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException

from ponder import admission
from ponder.api.deps import Caller, caller_info
from ponder.api.errors import ApiError
from ponder.api.schemas import ErrorBody, TaskList
from ponder.errors import AdmissionError
from ponder.schemas import TaskCreate
from ponder.store.base import TaskRecords
from ponder.types import Task, TaskStatus

__all__ = ["MAX_INT_DIGITS", "StrictJSONRoute", "load_task", "router"]

#: the longest integer a body may hold (digits); a longer one is refused before
#: conversion, which costs time quadratic in its length
MAX_INT_DIGITS = 100
_LONG_INT = re.compile(rb"\d{%d}" % (MAX_INT_DIGITS + 1))
#: the longest Idempotency-Key header (characters)
IDEMPOTENCY_KEY_MAX = 255


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
    (FastAPI answers 422 "not a valid dictionary" to a form body, 400 to a long number).

    ``at_once``: a faster way to answer a request, tried first; it returns None for a
    request it leaves to FastAPI's handler (which reads the body it already read).
    """

    at_once: Callable[[Request], Coroutine[Any, Any, Response | None]] | None = None

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
            strict = _StrictJSONRequest(request.scope, request.receive)
            if self.at_once is not None:
                response = await self.at_once(strict)
                if response is not None:
                    return response
            return await handler(strict)

        return strict_handler


# every route takes ``caller: Caller`` (which applies the rate limit), or calls
# ``caller_info`` first (the polled route)
router = APIRouter(prefix="/v1", tags=["tasks"], route_class=StrictJSONRoute)

_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorBody} for code in (400, 401, 404, 409, 413, 422, 429, 503)
}
_TASK: dict[int | str, dict[str, Any]] = {200: {"model": Task, "description": "the Task"}}


async def load_task(store: TaskRecords, task_id: str, owner: str) -> Task:
    """The caller's task (:func:`ponder.admission.load_task`), its 404 as an
    :class:`ApiError` (for the WebSocket route, which answers without the handlers)."""
    try:
        return await admission.load_task(store, task_id, owner)
    except AdmissionError as e:
        raise ApiError.of(e) from e


async def create_task(
    req: TaskCreate,
    caller: Caller,
    idempotency_key: Annotated[str | None, Header(max_length=IDEMPOTENCY_KEY_MAX)] = None,
) -> Response:
    """Submit a task; answers 202 at once with the Task (200 for an idempotent repeat)."""
    stored, created = await admission.submit(caller.state, req, caller.owner, idempotency_key)
    return _task_response(
        stored, status_code=202 if created else 200, headers={"Location": f"/v1/tasks/{stored.id}"}
    )


async def _submit_at_once(request: Request) -> Response | None:
    """``POST /v1/tasks`` for a body that validates, in one pass: pydantic parses and
    validates the JSON bytes, and the endpoint is called with the caller and the key.
    FastAPI's handler parses the JSON into a dict, validates that, and solves three
    parameters: more CPU than the rest of the route (an in-process measurement).

    None for anything else (a body that does not validate, a number over
    :data:`MAX_INT_DIGITS` digits, an Idempotency-Key over its length): FastAPI's
    handler then answers it, with the same errors as without this path.
    """
    key = request.headers.get("idempotency-key")
    if key is not None and len(key) > IDEMPOTENCY_KEY_MAX:
        return None
    body = await request.body()
    if _LONG_INT.search(body):
        return None
    try:
        req = TaskCreate.model_validate_json(body)
    except ValueError:  # pydantic's ValidationError
        return None
    return await create_task(req, await caller_info(request), key)


class _SubmitRoute(StrictJSONRoute):
    at_once = staticmethod(_submit_at_once)


router.add_api_route(
    "/tasks",
    create_task,
    methods=["POST"],
    status_code=202,
    responses={
        202: {"model": Task, "description": "the new Task"},
        200: {"model": Task, "description": "the Task of an earlier request (Idempotency-Key)"},
        415: {"model": ErrorBody, "description": "the body is not sent as JSON"},
        **_ERRORS,
    },
    route_class_override=_SubmitRoute,
)


async def _poll(request: Request) -> Response:
    """``GET /v1/tasks/{task_id}``, the route clients poll, as a plain Starlette route
    ahead of its FastAPI route (which documents it in the OpenAPI schema): FastAPI's
    handling of a request (its route's parameters, dependencies, telemetry and exit stack)
    cost more CPU than the route's own work: about 240 µs a request against 165 µs this way
    (16 clients polling one task over loopback, development measurement). Errors reach
    the same exception handlers; HEAD is answered too, as Starlette's routes do."""
    return await get_task(request.path_params["task_id"], request)


router.add_route(
    f"{router.prefix}/tasks/{{task_id}}", _poll, methods=["GET"], include_in_schema=False
)


@router.get("/tasks/{task_id}", response_model=None, responses=_TASK | _ERRORS)
async def get_task(task_id: str, request: Request) -> Response:
    """The task with its samples, result and error."""
    caller = await caller_info(request)  # by hand: the route clients poll
    return _task_response(await admission.load_task(caller.state.store, task_id, caller.owner))


@router.delete("/tasks/{task_id}", response_model=None, responses=_TASK | _ERRORS)
async def delete_task(task_id: str, caller: Caller) -> Response:
    """Cancel a pending or running task."""
    return _task_response(await admission.cancel_task(caller.state.store, task_id, caller.owner))


def _task_response(
    task: Task, status_code: int = 200, headers: dict[str, str] | None = None
) -> Response:
    """The task as its JSON body (:meth:`Task.to_public_json`: the hot path of polling)."""
    return Response(
        task.to_public_json(),
        status_code=status_code,
        headers=headers,
        media_type="application/json",
    )


@router.get("/tasks", responses=_ERRORS)
async def list_tasks(
    caller: Caller,
    status: TaskStatus | None = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    cursor: Annotated[str | None, Query(max_length=200)] = None,
) -> TaskList:
    """The caller's tasks, newest first; pass ``next_cursor`` back as ``cursor``."""
    try:
        tasks, next_cursor = await caller.state.store.list_tasks(
            caller.owner, status=status, limit=limit, cursor=cursor
        )
    except ValueError as e:
        raise ApiError(422, "invalid", "cursor: not a cursor this service returned") from e
    return TaskList(data=[t.to_public() for t in tasks], next_cursor=next_cursor)
