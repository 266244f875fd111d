"""What OpenAI's APIs share: the error shape, the model name → mode mapping, text content,
usage, submitting a task and reading the answer of one that ended.

Used by the OpenAI routes (``ponder.api.openai_compat``, ``responses``, ``files``,
``batches``) and by the batch feeder, which runs a batch's lines through the same
request → task code as the routes. Errors use OpenAI's shape,
``{"error": {"message", "type", "param", "code"}}``, which is also ponder's envelope
(``code`` and ``message``). No HTTP here: the routes' side is :mod:`ponder.api.openai_common`.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, ParamSpec, TypeVar

from pydantic import ValidationError

from ponder import admission
from ponder.config import Settings
from ponder.errors import AdmissionError, Refusal
from ponder.schemas import ResponseFormatBody, TaskCreate
from ponder.types import DEFAULT_MODE, Mode, Task, TaskStatus

__all__ = [
    "OpenAIError",
    "answer_text",
    "check_metadata",
    "check_webhook_url",
    "failure",
    "invalid",
    "list_body",
    "mode_of",
    "model_names",
    "openai_shaped",
    "openai_usage",
    "ponder_field",
    "resolve_model",
    "response_format_of",
    "served_model",
    "submit",
    "task_request",
    "text_of",
]

_P = ParamSpec("_P")
_T = TypeVar("_T")

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
    def of(cls, e: Refusal) -> OpenAIError:
        """A refusal in ponder's envelope (admission's, the API's auth and rate limit) in
        OpenAI's shape; ``param``: the field an ``invalid`` message starts with."""
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
    """The model names the OpenAI routes accept and ``/v1/models`` lists
    (:func:`ponder.admission.model_names`): each configured model and its mode variants,
    ``ponder*`` (the default model's), then the aliases of ``PONDER_MODEL_ALIASES``."""
    return admission.model_names(settings)


def resolve_model(model: str, settings: Settings, param: str = "model") -> tuple[str, Mode | None]:
    """The configured model a request's ``model`` stands for and the mode the name selects
    (None: none; :func:`ponder.admission.resolve_model`); 404 ``model_not_found`` in
    OpenAI's shape, naming ``param``, for a name no model has."""
    try:
        return admission.resolve_model(model, settings, param)
    except AdmissionError as e:
        raise OpenAIError(
            e.status, e.code, e.message, param=param, kind="invalid_request_error"
        ) from e


def served_model(model: str, settings: Settings, param: str = "model") -> str:
    """The name an answer gives for a request's ``model``: itself, or what its alias names
    (OpenAI's answer names the model that served it); 404 ``model_not_found`` (OpenAI's
    shape) for a name no model has. The task's model is the request's name
    (:class:`~ponder.schemas.TaskCreate` ``model``: resolved on admission)."""
    resolve_model(model, settings, param)
    return settings.model_aliases.get(model, model)


def openai_usage(task: Task) -> tuple[int, int]:
    """A task's (prompt, completion) tokens as OpenAI counts them: the prompt once, however
    many samples read it (the longest of their prompts: they differ only in the
    instruction of their reasoning path), and the completion tokens of every sample (and
    of a clarifying question). ``/v1/tasks`` shows every sample's prompt tokens."""
    prompt = max((s.tokens.prompt for s in task.samples), default=0)
    return prompt, task.usage.completion_tokens


def mode_of(model: str, mode: Mode | None) -> Mode:
    """The mode a request asks for: its ``mode`` field, else the model name's
    (``NAME-fast|standard|deep|auto``, ``ponder-<mode>``), else
    :data:`~ponder.types.DEFAULT_MODE`. ``model``: a served name (:func:`served_model`)."""
    if mode is not None:
        return mode
    base, dash, suffix = model.rpartition("-")
    return Mode(suffix) if dash and base and suffix in Mode.__members__ else DEFAULT_MODE


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
def openai_shaped(call: Callable[_P, Awaitable[_T]]) -> Callable[_P, Awaitable[_T]]:
    """``call`` (a function of :mod:`ponder.admission`) with its refusals raised in
    OpenAI's shape (:meth:`OpenAIError.of`)."""

    @functools.wraps(call)
    async def shaped(*args: _P.args, **kwargs: _P.kwargs) -> _T:
        try:
            return await call(*args, **kwargs)
        except AdmissionError as e:
            raise OpenAIError.of(e) from e

    return shaped


#: build the task of a request and store it (:func:`ponder.admission.submit`)
submit = openai_shaped(admission.submit)
#: a webhook URL a request names: signing configured, a public host
#: (:func:`ponder.admission.check_callback`; its ``param`` names the field)
check_webhook_url = openai_shaped(admission.check_callback)


def response_format_of(value: Any, param: str, *, flat: bool = False) -> ResponseFormatBody | None:
    """OpenAI's format of the answer as a task's ``response_format``: chat's
    ``response_format`` (``{"type": "json_schema", "json_schema": {...}}``,
    ``{"type": "json_object"}``) or, ``flat``, the Responses API's ``text.format`` (the
    json_schema's ``name``, ``schema``, ``strict``, ``description`` beside ``type``). None
    for none or ``{"type": "text"}``. 422 ``invalid`` with ``param`` (where the format
    sits) for anything else, its message naming the part (the schema subset's path)."""
    if value is None or (isinstance(value, dict) and value.get("type") == "text"):
        return None
    if not isinstance(value, dict):
        raise OpenAIError(422, "invalid", f"{param}: give an object with a `type`", param=param)
    body = value
    if flat and value.get("type") == "json_schema":
        body = {
            "type": "json_schema",
            "json_schema": {k: v for k, v in value.items() if k != "type"},
        }
    try:
        return ResponseFormatBody.model_validate(body)
    except ValidationError as e:
        problems = []
        for error in e.errors()[:5]:
            loc = [str(p) for p in error["loc"]]
            if flat and loc[:1] == ["json_schema"]:
                loc = loc[1:]
            message = str(error["msg"]).removeprefix("Value error, ")
            problems.append(f"{'.'.join([param, *loc])}: {message}")
        raise OpenAIError(422, "invalid", "; ".join(problems), param=param) from e


def answer_text(task: Task) -> str:
    """The text of a task's answer: a structured task's object as JSON text, else the
    result's text (the text of the sample the vote chose)."""
    assert task.result is not None
    if task.result.object is not None:
        return json.dumps(task.result.object, ensure_ascii=False)
    return task.result.text


def task_request(fields: Mapping[str, Any], prefix: str = "") -> TaskCreate:
    """A :class:`TaskCreate` of the given fields (None values left out), errors in
    OpenAI's shape."""
    try:
        return TaskCreate.model_validate({k: v for k, v in fields.items() if v is not None})
    except ValidationError as e:
        raise invalid(e, prefix) from e


# --- task → answer --------------------------------------------------------------------
def ponder_field(task: Task) -> dict[str, Any]:
    """The ``ponder`` field of an answer: the task's result, its id and status."""
    result = task.result.model_dump(mode="json") if task.result is not None else {}
    return {**result, "task_id": task.id, "status": task.status.value}


def failure(task: Task | None, task_id: str) -> OpenAIError | None:
    """The error for a task that ended without an answer (None when it has one): 409
    ``cancelled``; 503 ``queue_timeout`` for one that expired in its model's queue (it
    never ran; not retried by the SDK: the request's own deadline passed); else 500 with
    the task's error code."""
    no_retry = {"x-should-retry": "false"}  # the task was already tried; do not resubmit
    if task is None:
        return OpenAIError(500, "internal", f"task {task_id} disappeared", headers=no_retry)
    if task.status == TaskStatus.cancelled:
        return OpenAIError(409, "cancelled", f"task {task.id} was cancelled", headers=no_retry)
    if task.status == TaskStatus.expired:  # no worker of its model started it in time
        message = task.error.message if task.error else "not started within its queue_timeout_s"
        return OpenAIError(
            503, "queue_timeout", f"task {task.id} expired: {message}", headers=no_retry
        )
    if task.result is None:
        code = task.error.code if task.error else "failed"
        message = task.error.message if task.error else "no sample finished"
        return OpenAIError(500, code, f"task {task.id} failed: {message}", headers=no_retry)
    return None
