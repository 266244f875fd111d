"""The HTTP side that the OpenAI-compatible routes share: answering an
:class:`~ponder.openai.common.OpenAIError`, the caller, reading the body and the query,
waiting for a task while the client is there.

Used by ``openai_compat.py`` (chat completions), ``responses.py``, ``files.py`` and
``batches.py``; what those APIs compute is :mod:`ponder.openai`.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any, ParamSpec

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from ponder import admission
from ponder.aio import first_of
from ponder.api.deps import check_rate, get_owner, get_state
from ponder.api.errors import ApiError
from ponder.api.events import follow_events, is_final
from ponder.errors import AdmissionError, RecoverableError
from ponder.openai.common import OpenAIError
from ponder.store.base import TaskEvents, TaskRecords
from ponder.types import Task

__all__ = [
    "abandon",
    "caller",
    "openai_errors",
    "openai_response",
    "query_int",
    "read_json",
    "until_terminal",
    "wait_unless_gone",
]

log = logging.getLogger("ponder.api")

_P = ParamSpec("_P")


def openai_response(error: OpenAIError) -> JSONResponse:
    """The answer of ``error``: its status, OpenAI's error body, its headers."""
    return JSONResponse(error.body(), status_code=error.status, headers=error.headers)


def _unavailable() -> OpenAIError:
    return OpenAIError(
        503,
        "unavailable",
        "the task store cannot be reached; retry later",
        headers={"Retry-After": "1"},
    )


def openai_errors(
    route: Callable[_P, Awaitable[Response]],
) -> Callable[_P, Awaitable[Response]]:
    """Answer an :class:`OpenAIError` raised by the route in OpenAI's shape, and a store
    outage with 503 ``unavailable``."""

    @functools.wraps(route)
    async def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> Response:
        try:
            return await route(*args, **kwargs)
        except OpenAIError as e:
            return openai_response(e)
        except RecoverableError as e:
            log.warning("%s: %s", route.__name__, e)
            return openai_response(_unavailable())

    return wrapper


async def caller(request: Request) -> str:
    """The caller's owner id, after auth and the rate limit (errors in OpenAI's shape)."""
    try:
        owner = get_owner(request)
        address = request.client.host if request.client else None
        await check_rate(get_state(request), owner, address)
    except ApiError as e:
        raise OpenAIError.of(e) from e
    return owner


async def read_json(request: Request) -> dict[str, Any]:
    """The request body as a JSON object (400 when it is not one)."""
    try:
        body = json.loads(await request.body())
    except ValueError as e:
        raise OpenAIError(400, "bad_request", "the body is not valid JSON") from e
    if not isinstance(body, dict):
        raise OpenAIError(400, "bad_request", "the body must be a JSON object")
    return body


def query_int(request: Request, name: str, default: int, low: int, high: int) -> int:
    """An integer query parameter within ``low..high`` (422 naming it otherwise)."""
    raw = request.query_params.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = low - 1
    if not low <= value <= high:
        raise OpenAIError(
            422, "invalid", f"{name}: give an integer from {low} to {high}", param=name
        )
    return value


async def until_terminal(store: TaskEvents, task_id: str, idle_s: float) -> Task:
    """Follow the task's events until its terminal one; the task as it ended (500 if it
    is gone)."""
    async for event in follow_events(store, task_id, None, idle_s=idle_s, deltas=False):
        if event is not None and is_final(event):
            break
    final = await store.get_task(task_id)
    if final is None:
        raise OpenAIError(500, "internal", f"task {task_id} disappeared")
    return final


async def _until_disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def abandon(store: TaskRecords, task_id: str, owner: str) -> None:
    """The client left before its answer: cancel the task (best effort: a task that
    cannot be cancelled is logged and left to its own timeout)."""
    try:
        await admission.cancel_task(store, task_id, owner)
    except (AdmissionError, RecoverableError) as e:
        log.warning("task %s not cancelled after its client disconnected: %s", task_id, e)
    else:
        log.info("task %s cancelled: its client disconnected", task_id)


async def wait_unless_gone(
    request: Request, store: TaskEvents, task_id: str, owner: str, idle_s: float
) -> Task | None:
    """Wait for the task to end; if the client disconnects first, cancel the task
    (nobody else is waiting for it) and return None. A store error is raised."""
    final = await first_of(until_terminal(store, task_id, idle_s), _until_disconnect(request))
    if final is None:
        await abandon(store, task_id, owner)
    return final
