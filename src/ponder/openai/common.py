"""What the OpenAI-compatible routes share: the error shape, the caller, the model name →
mode mapping, text content, submitting a task and waiting for it.

Used by ``openai_compat.py`` (chat completions), ``responses.py``, ``files.py`` and
``batches.py``, and by the batch feeder, which runs a batch's lines through the same
request → task code as the routes. Errors use OpenAI's shape,
``{"error": {"message", "type", "param", "code"}}``, which is also ponder's envelope
(``code`` and ``message``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, ParamSpec, Protocol

from fastapi import Request
from fastapi.responses import JSONResponse, Response
from pydantic import ValidationError

from ponder import metrics
from ponder.api.deps import check_rate, get_owner, get_state
from ponder.api.errors import ApiError
from ponder.api.events import follow_events, is_final
from ponder.api.schemas import TaskCreate
from ponder.api.tasks import build_task, cancel_task
from ponder.config import SERVED_MODELS, Mode, Settings
from ponder.errors import IdempotencyConflict, QueueFull, RecoverableError
from ponder.ids import IdGenerator
from ponder.store.base import TaskStore
from ponder.types import Task, TaskStatus
from ponder.webhooks import check_callback_url

__all__ = [
    "OpenAIError",
    "TaskSink",
    "abandon",
    "caller",
    "check_metadata",
    "check_webhook_url",
    "failure",
    "invalid",
    "list_body",
    "mode_of",
    "model_names",
    "openai_errors",
    "openai_usage",
    "ponder_field",
    "query_int",
    "read_json",
    "served_model",
    "submit",
    "task_request",
    "text_of",
    "until_terminal",
    "wait_unless_gone",
]

log = logging.getLogger("ponder.api")

_P = ParamSpec("_P")

_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    409: "conflict_error",
    413: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
}

_METADATA_PAIRS, _METADATA_KEY, _METADATA_VALUE = 16, 64, 512

#: content part types read as text: chat's ``text``, the Responses API's input and output
_TEXT_PARTS = frozenset({"text", "input_text", "output_text"})


class OpenAIError(Exception):
    """An answer in OpenAI's error shape."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        *,
        param: str | None = None,
        headers: dict[str, str] | None = None,
        kind: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.param = status, code, message, param
        self.headers = headers or {}
        #: the error's ``type``; None: the status code's
        self.kind = kind

    @classmethod
    def from_api_error(cls, e: ApiError) -> OpenAIError:
        param = e.message.split(":", 1)[0] if e.code == "invalid" and ":" in e.message else None
        return cls(e.status, e.code, e.message, param=param, headers=e.headers)

    @classmethod
    def not_found(cls, what: str, obj_id: str) -> OpenAIError:
        return cls(404, "not_found", f"no {what} {obj_id!r}")

    def body(self) -> dict[str, Any]:
        kind = self.kind or _ERROR_TYPES.get(
            self.status, "server_error" if self.status >= 500 else "api_error"
        )
        return {
            "error": {"message": self.message, "type": kind, "param": self.param, "code": self.code}
        }

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


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
            return e.response()
        except RecoverableError as e:
            log.warning("%s: %s", route.__name__, e)
            return _unavailable().response()

    return wrapper


async def caller(request: Request) -> str:
    """The caller's owner id, after auth and the rate limit (errors in OpenAI's shape)."""
    try:
        owner = get_owner(request)
        address = request.client.host if request.client else None
        await check_rate(get_state(request), owner, address)
    except ApiError as e:
        raise OpenAIError.from_api_error(e) from e
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


def invalid(e: ValidationError, prefix: str = "") -> OpenAIError:
    """A pydantic validation error as a 422 naming the first field (``prefix``: where the
    validated object sits, e.g. ``body.``)."""
    first = e.errors()[0]
    param = prefix + ".".join(str(p) for p in first["loc"]) or None
    problems = "; ".join(
        f"{prefix}{'.'.join(str(p) for p in err['loc']) or 'body'}: {err['msg']}"
        for err in e.errors()[:5]
    )
    return OpenAIError(422, "invalid", problems, param=param)


def model_names(settings: Settings) -> list[str]:
    """The model names the OpenAI routes accept and ``/v1/models`` lists: the served
    names, then the aliases of ``PONDER_MODEL_ALIASES``."""
    return [*SERVED_MODELS, *settings.model_aliases]


def served_model(model: str, settings: Settings, param: str = "model") -> str:
    """The served name a request's ``model`` stands for (itself, or what its alias names);
    404 ``model_not_found`` (OpenAI's answer) for any other name."""
    if model in SERVED_MODELS:
        return model
    served = settings.model_aliases.get(model)
    if served is None:
        raise OpenAIError(
            404,
            "model_not_found",
            f"{param}: the model `{model}` does not exist; this service serves "
            f"{', '.join(model_names(settings))} (PONDER_MODEL_ALIASES maps other names)",
            param=param,
            kind="invalid_request_error",
        )
    return served


def openai_usage(task: Task) -> tuple[int, int]:
    """A task's (prompt, completion) tokens as OpenAI counts them: the prompt once, however
    many samples read it (the longest of their prompts: they differ only in the
    instruction of their reasoning path), and the completion tokens of every sample (and
    of a clarifying question). ``/v1/tasks`` shows every sample's prompt tokens."""
    prompt = max((s.tokens.prompt for s in task.samples), default=0)
    return prompt, task.usage.completion_tokens


def mode_of(model: str, mode: str | None) -> str:
    """The mode a request asks for: its ``mode`` field, else the model name
    (``ponder-fast|standard|deep``), else ``standard``."""
    if mode is not None:
        return mode
    suffix = model.removeprefix("ponder-")
    return suffix if suffix != model and suffix in Mode.__members__ else "standard"


def text_of(content: Any, where: str) -> str:
    """A message's content as text: a string, null, or a list of text parts (``text``,
    ``input_text``, ``output_text``); 422 naming ``where`` for anything else."""
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list):
        parts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") not in _TEXT_PARTS:
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise OpenAIError(
                    422,
                    "invalid",
                    f"{where}: only text parts are supported, not {kind!r}",
                    param=where,
                )
            parts.append(str(part.get("text", "")))
        return "\n".join(parts)
    raise OpenAIError(
        422, "invalid", f"{where}: give a string or a list of text parts", param=where
    )


def check_metadata(value: dict[str, str] | None) -> dict[str, str] | None:
    """OpenAI's metadata rule (a pydantic validator's body): at most 16 pairs, keys up to
    64 characters, values up to 512."""
    if value is not None and (
        len(value) > _METADATA_PAIRS
        or any(len(k) > _METADATA_KEY or len(v) > _METADATA_VALUE for k, v in value.items())
    ):
        raise ValueError(
            f"at most {_METADATA_PAIRS} pairs, keys up to {_METADATA_KEY} and values up to "
            f"{_METADATA_VALUE} characters"
        )
    return value


def list_body(data: Sequence[Mapping[str, Any]], more: bool) -> dict[str, Any]:
    """OpenAI's cursor page of objects (``after`` = the last id of a page)."""
    return {
        "object": "list",
        "data": list(data),
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": more,
    }


# --- request → task -------------------------------------------------------------------
class TaskSink(Protocol):
    """Where a route (or the batch feeder) submits tasks: the app's state has these."""

    settings: Settings
    store: TaskStore
    ids: IdGenerator


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
    whether it is new.

    ``batch``: a batch line (admitted against the batch lines' own backlog of
    ``batch_max_in_flight``, at ``batch_priority``). Errors in OpenAI's shape.
    """
    settings = sink.settings
    try:
        task = build_task(req, settings, task_id=task_id or sink.ids.new_id(), owner=owner)
        if batch:
            task.priority = settings.batch_priority
        stored, created = await sink.store.create_task(
            task,
            max_pending=settings.batch_max_in_flight if batch else settings.max_pending,
            idempotency_key=idempotency_key,
            body_hash=req.body_hash() if idempotency_key else None,
            batch=batch,
        )
    except ApiError as e:
        raise OpenAIError.from_api_error(e) from e
    except QueueFull as e:
        metrics.TASKS_REJECTED.labels(code="queue_full").inc()
        raise OpenAIError(
            503, "queue_full", str(e), headers={"Retry-After": str(settings.retry_after_s)}
        ) from e
    except IdempotencyConflict as e:
        raise OpenAIError(
            409, "conflict", "this Idempotency-Key was used with another request body"
        ) from e
    if created:
        metrics.TASKS_SUBMITTED.labels(mode=task.mode).inc()
    return stored, created


def task_request(fields: Mapping[str, Any], prefix: str = "") -> TaskCreate:
    """A :class:`TaskCreate` of the given fields (None values left out), errors in
    OpenAI's shape."""
    try:
        return TaskCreate.model_validate({k: v for k, v in fields.items() if v is not None})
    except ValidationError as e:
        raise invalid(e, prefix) from e


async def check_webhook_url(url: str, settings: Settings, param: str) -> None:
    """A webhook URL a request names: signing must be configured and the host public
    (the SSRF guard of task callbacks); 422 naming ``param`` otherwise."""
    if settings.webhook_secret is None:
        raise OpenAIError(
            422,
            "invalid",
            f"{param}: this service has no webhook signing secret; its operator must set "
            "PONDER_WEBHOOK_SECRET (`ponder keys webhook-secret` prints one)",
            param=param,
        )
    try:
        await check_callback_url(url, settings.callback_allow_private)
    except ValueError as e:
        message = str(e).replace("callback_url", param, 1)
        raise OpenAIError(422, "invalid", message, param=param) from e


# --- task → answer --------------------------------------------------------------------
def ponder_field(task: Task) -> dict[str, Any]:
    """The ``ponder`` field of an answer: the task's result, its id and status."""
    result = task.result.model_dump(mode="json") if task.result is not None else {}
    return {**result, "task_id": task.id, "status": task.status.value}


def failure(task: Task | None, task_id: str) -> OpenAIError | None:
    """The error for a task that ended without an answer (None when it has one)."""
    no_retry = {"x-should-retry": "false"}  # the task was already tried; do not resubmit
    if task is None:
        return OpenAIError(500, "internal", f"task {task_id} disappeared", headers=no_retry)
    if task.status == TaskStatus.cancelled:
        return OpenAIError(409, "cancelled", f"task {task.id} was cancelled", headers=no_retry)
    if task.result is None:
        code = task.error.code if task.error else "failed"
        message = task.error.message if task.error else "no sample finished"
        return OpenAIError(500, code, f"task {task.id} failed: {message}", headers=no_retry)
    return None


async def until_terminal(store: TaskStore, task_id: str, idle_s: float) -> Task | None:
    """Follow the task's events until its terminal one; the task as it ended."""
    async for event in follow_events(store, task_id, None, idle_s=idle_s, deltas=False):
        if event is not None and is_final(event):
            break
    return await store.get_task(task_id)


async def _until_disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def abandon(store: TaskStore, task_id: str, owner: str) -> None:
    """The client left before its answer: cancel the task (best effort)."""
    with contextlib.suppress(ApiError, RecoverableError):
        await cancel_task(store, task_id, owner)
        log.info("task %s cancelled: its client disconnected", task_id)


async def wait_unless_gone(
    request: Request, store: TaskStore, task_id: str, owner: str, idle_s: float
) -> Task | None:
    """Wait for the task to end; if the client disconnects first, cancel the task
    (nobody else is waiting for it) and return None. A store error is raised."""
    waiter = asyncio.create_task(until_terminal(store, task_id, idle_s))
    watch = asyncio.create_task(_until_disconnect(request))
    try:
        await asyncio.wait({waiter, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for job in (waiter, watch):
            job.cancel()
        await asyncio.gather(waiter, watch, return_exceptions=True)
    if not waiter.done() or waiter.cancelled():
        await abandon(store, task_id, owner)
        return None
    final = waiter.result()
    if final is None:
        raise OpenAIError(500, "internal", f"task {task_id} disappeared")
    return final
