"""OpenAI-compatible ``POST /v1/chat/completions`` and ``GET /v1/models``.

An OpenAI SDK pointed at the service's ``/v1`` works unchanged. A request becomes a
task (``messages``, ``n``, ``temperature``, ``max_tokens``; extra body fields ``mode``,
``task_type`` and ``priority`` select the enhancement), the route waits for it on the
task's event log and answers in OpenAI's shape:

- ``choices[0]`` is the fused answer (the text of the sample the vote chose); with
  ``n`` > 1 the other choices are the other finished samples (when early stopping left
  fewer than ``n``, they are reused in turn).
- ``stop`` is passed to the engine, and each choice is cut at the first stop sequence.
- a ``ponder`` field carries the task's ``result`` (plus ``task_id`` and ``status``).
- ``stream: true`` answers with ``chat.completion.chunk`` events: the role at once, the
  text of a sample as the model writes it (from the task's ``delta`` events), keep-alive
  comments while nothing happens, then the answer, the finish reason (and the usage with
  ``stream_options.include_usage``), then ``data: [DONE]``. Which text streams:

  - a task of one sample (fast mode, ``n`` = 1): its text is ``choices[0]``'s ``content``
    as it is written, and a last content chunk completes it to the final answer (the
    text of a sample is its answer);
  - several samples (standard, deep, ``n`` > 1): the vote picks the answer only at the
    end, so the text of the *leading* sample (the first to write) streams as
    ``choices[0].delta.reasoning_content`` (the field reasoning servers use for text
    that is not the answer), and ``content`` carries the fused answer in one chunk when
    the vote is done — the concatenated ``content`` is exactly the non-streamed answer.

Errors use OpenAI's shape, ``{"error": {"message", "type", "param", "code"}}``, which
is also ponder's envelope (``code`` and ``message``). A client that disconnects before
the answer cancels its task: nobody else is waiting for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator
from typing import Any, Literal

import anyio
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ponder import metrics
from ponder.api.deps import AppState, check_rate, get_owner, get_state
from ponder.api.errors import ApiError
from ponder.api.events import follow_events, is_final
from ponder.api.schemas import TaskCreate
from ponder.api.tasks import build_task, cancel_task
from ponder.config import Mode
from ponder.deltas import DELTA
from ponder.errors import IdempotencyConflict, QueueFull, RecoverableError
from ponder.store.base import TaskStore
from ponder.types import Sample, SampleStatus, Task, TaskStatus

__all__ = ["ChatCompletionRequest", "router"]

log = logging.getLogger("ponder.api")

router = APIRouter(prefix="/v1", tags=["openai"])

MODEL_IDS = ("ponder", "ponder-fast", "ponder-standard", "ponder-deep")
_MODEL_CREATED = 1_764_412_800  # 2025-11-29: a fixed date, as OpenAI's list shows
_MAX_STOP = 4

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


class ChatCompletionRequest(BaseModel):
    """The fields of OpenAI's chat completion request that ponder reads (others ignored)."""

    model_config = ConfigDict(extra="ignore")

    model: str = Field(default="ponder", max_length=200)
    messages: list[dict[str, Any]] = Field(min_length=1)
    n: int = Field(default=1, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    # ponder's extensions (the OpenAI SDK's ``extra_body``)
    mode: Literal["fast", "standard", "deep"] | None = None
    task_type: Literal["auto", "math", "code", "choice", "text"] = "auto"
    priority: int = Field(default=3, ge=0, le=5)
    timeout_s: float | None = Field(default=None, gt=0)

    def stops(self) -> list[str]:
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        return [s for s in stops if s]

    def selected_mode(self) -> str:
        if self.mode is not None:
            return self.mode
        suffix = self.model.removeprefix("ponder-")
        return suffix if suffix != self.model and suffix in Mode.__members__ else "standard"


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
    ) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.param = status, code, message, param
        self.headers = headers or {}

    @classmethod
    def from_api_error(cls, e: ApiError) -> OpenAIError:
        param = e.message.split(":", 1)[0] if e.code == "invalid" and ":" in e.message else None
        return cls(e.status, e.code, e.message, param=param, headers=e.headers)

    def body(self) -> dict[str, Any]:
        kind = _ERROR_TYPES.get(self.status, "server_error" if self.status >= 500 else "api_error")
        return {
            "error": {"message": self.message, "type": kind, "param": self.param, "code": self.code}
        }

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


# --- request → task -------------------------------------------------------------------
def _text_of(content: Any, index: int) -> str:
    """A message's content as text: a string, null, or a list of text parts."""
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list):
        parts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text":
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise OpenAIError(
                    422,
                    "invalid",
                    f"messages[{index}].content: only text parts are supported, not {kind!r}",
                    param=f"messages[{index}].content",
                )
            parts.append(str(part.get("text", "")))
        return "\n".join(parts)
    raise OpenAIError(
        422,
        "invalid",
        f"messages[{index}].content: give a string or a list of text parts",
        param=f"messages[{index}].content",
    )


def _task_request(req: ChatCompletionRequest, state: AppState) -> TaskCreate:
    mode = state.settings.mode(req.selected_mode())
    if req.n > mode.max_samples:
        raise OpenAIError(
            422,
            "invalid",
            f"n: {req.n} is over the {req.selected_mode()} mode's maximum {mode.max_samples}",
            param="n",
        )
    if len(req.stops()) > _MAX_STOP:
        raise OpenAIError(422, "invalid", f"stop: at most {_MAX_STOP} sequences", param="stop")
    messages = []
    for i, message in enumerate(req.messages):
        entry = {"role": message.get("role"), "content": _text_of(message.get("content"), i)}
        if isinstance(message.get("name"), str):
            entry["name"] = message["name"]
        messages.append(entry)
    try:
        return TaskCreate.model_validate(
            {
                "messages": messages,
                "mode": req.selected_mode(),
                "task_type": req.task_type,
                "priority": req.priority,
                "samples": max(req.n, mode.samples) if req.n > 1 else None,
                "max_new_tokens": req.max_completion_tokens or req.max_tokens,
                "temperature": req.temperature,
                "timeout_s": req.timeout_s,
                "stop": req.stops(),
            }
        )
    except ValidationError as e:
        raise _invalid(e) from e


def _invalid(e: ValidationError) -> OpenAIError:
    first = e.errors()[0]
    param = ".".join(str(p) for p in first["loc"]) or None
    problems = "; ".join(
        f"{'.'.join(str(p) for p in err['loc']) or 'body'}: {err['msg']}" for err in e.errors()[:5]
    )
    return OpenAIError(422, "invalid", problems, param=param)


async def _submit(
    state: AppState, req: TaskCreate, owner: str, idempotency_key: str | None
) -> Task:
    settings = state.settings
    try:
        task = build_task(req, settings, task_id=state.ids.new_id(), owner=owner)
        stored, created = await state.store.create_task(
            task,
            max_pending=settings.max_pending,
            idempotency_key=idempotency_key,
            body_hash=req.body_hash() if idempotency_key else None,
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
    return stored


# --- task → completion ----------------------------------------------------------------
def _cut(text: str, stops: list[str]) -> tuple[str, bool]:
    """``text`` up to the first stop sequence, and whether one was found."""
    cut = min((i for i in (text.find(s) for s in stops) if i >= 0), default=-1)
    return (text[:cut], True) if cut >= 0 else (text, False)


def _choices(task: Task, n: int, stops: list[str]) -> list[dict[str, Any]]:
    """The fused answer first, then the other finished samples (reused when too few)."""
    assert task.result is not None
    done = [s for s in task.samples if s.status == SampleStatus.done and s.text is not None]
    chosen = next((s for s in done if s.index == task.result.chosen_sample), None)
    order: list[Sample | None] = [chosen] + [s for s in done if s is not chosen]
    choices = []
    for i in range(n):
        sample = order[i % len(order)]
        text = task.result.text if sample is None else sample.text or ""
        text, stopped = _cut(text, stops)
        finish = sample.finish_reason if sample is not None else "stop"
        choices.append(
            {
                "index": i,
                "message": {"role": "assistant", "content": text, "refusal": None},
                "finish_reason": "length" if finish == "length" and not stopped else "stop",
                "logprobs": None,
            }
        )
    return choices


def _usage(task: Task) -> dict[str, int]:
    prompt, completion = task.usage.prompt_tokens, task.usage.completion_tokens
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def _ponder(task: Task) -> dict[str, Any]:
    result = task.result.model_dump(mode="json") if task.result is not None else {}
    return {**result, "task_id": task.id, "status": task.status.value}


def _failure(task: Task | None, task_id: str) -> OpenAIError | None:
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


def _completion(task: Task, req: ChatCompletionRequest) -> dict[str, Any]:
    return {
        "id": f"chatcmpl-{task.id}",
        "object": "chat.completion",
        "created": int(task.created_at.timestamp()),
        "model": req.model,
        "choices": _choices(task, req.n, req.stops()),
        "usage": _usage(task),
        "system_fingerprint": None,
        "ponder": _ponder(task),
    }


async def _until_terminal(store: TaskStore, task_id: str, idle_s: float) -> Task | None:
    async for event in follow_events(store, task_id, None, idle_s=idle_s, deltas=False):
        if event is not None and is_final(event):
            break
    return await store.get_task(task_id)


async def _until_disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _abandon(store: TaskStore, task_id: str, owner: str) -> None:
    """The client left before its answer: cancel the task (best effort)."""
    with contextlib.suppress(ApiError, RecoverableError):
        await cancel_task(store, task_id, owner)
        log.info("task %s cancelled: its chat completion client disconnected", task_id)


async def _answer(request: Request, state: AppState, task: Task, req: ChatCompletionRequest,
                  owner: str) -> Response:  # fmt: skip
    idle_s = state.settings.events_keepalive_s
    waiter = asyncio.create_task(_until_terminal(state.store, task.id, idle_s))
    watch = asyncio.create_task(_until_disconnect(request))
    try:
        await asyncio.wait({waiter, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for job in (waiter, watch):
            job.cancel()
        await asyncio.gather(waiter, watch, return_exceptions=True)
    if not waiter.done() or waiter.cancelled():
        await _abandon(state.store, task.id, owner)
        return Response(status_code=499)  # nobody reads it
    final = waiter.result()  # raises a store error: answered 503 by the caller
    if (failure := _failure(final, task.id)) is not None:
        return failure.response()
    assert final is not None
    return JSONResponse(_completion(final, req))


def _sse(data: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


class _LeadingSample:
    """The text of the first sample that writes, from its ``delta`` events: what is new
    since the last piece handed out (a sample rerun from its start repeats nothing)."""

    def __init__(self) -> None:
        self.index: int | None = None
        self.text = ""  # the sample's text so far
        self.sent = ""  # the part of it handed out

    def take(self, delta: dict[str, Any]) -> str:
        if self.index is None:
            self.index = delta["index"]
        if delta["index"] != self.index:
            return ""
        self.text = self.text[: delta["offset"]] + delta["text"]
        return self.rest(self.text)

    def rest(self, text: str) -> str:
        """What ``text`` adds to what was handed out ("" when it does not extend it)."""
        if not text.startswith(self.sent):
            return ""
        piece, self.sent = text[len(self.sent) :], text
        return piece


async def _stream(state: AppState, task: Task, req: ChatCompletionRequest,
                  owner: str) -> AsyncIterator[bytes]:  # fmt: skip
    head = {
        "id": f"chatcmpl-{task.id}",
        "object": "chat.completion.chunk",
        "created": int(task.created_at.timestamp()),
        "model": req.model,
        "system_fingerprint": None,
    }
    finished = False
    # one sample: its text is the answer; several: the leader's text is not (see the module doc)
    field = "content" if task.samples_planned == 1 else "reasoning_content"
    leader = _LeadingSample()

    def chunk(index: int, delta: dict[str, Any], **extra: Any) -> bytes:
        choice = {"index": index, "delta": delta, "finish_reason": None}
        return _sse({**head, "choices": [choice], **extra})

    try:
        for i in range(req.n):
            yield chunk(i, {"role": "assistant", "content": ""})
        idle_s = state.settings.events_keepalive_s
        final: Task | None = None
        try:
            async for event in follow_events(state.store, task.id, None, idle_s=idle_s):
                if event is None:
                    yield b": keep-alive\n\n"
                elif is_final(event):
                    break
                elif event.event == DELTA and (piece := leader.take(event.data)):
                    yield chunk(0, {field: piece})
            final = await state.store.get_task(task.id)
        except RecoverableError as e:
            failure: OpenAIError | None = OpenAIError(503, "unavailable", str(e))
        else:
            failure = _failure(final, task.id)
        finished = True
        if failure is not None or final is None:
            yield _sse(failure.body() if failure else {"error": {"message": "no task"}})
            return
        choices = _choices(final, req.n, req.stops())
        for choice in choices:
            content = choice["message"]["content"]
            if choice["index"] == 0 and field == "content":
                streamed, content = leader.sent, leader.rest(content)  # completed
                if not content and streamed != choice["message"]["content"]:
                    log.warning("task %s: the streamed text is not its answer's", task.id)
            if content:
                yield chunk(choice["index"], {"content": content})
        for choice in choices:
            last = {"index": choice["index"], "delta": {}, "finish_reason": choice["finish_reason"]}
            yield _sse({**head, "choices": [last], "ponder": _ponder(final)})
        if (req.stream_options or {}).get("include_usage"):
            yield _sse({**head, "choices": [], "usage": _usage(final)})
        yield b"data: [DONE]\n\n"
    finally:
        if not finished:  # the client disconnected (the response is being cancelled)
            with anyio.CancelScope(shield=True):
                await _abandon(state.store, task.id, owner)


async def _caller(request: Request) -> str:
    """The caller's owner id, after auth and the rate limit (errors in OpenAI's shape)."""
    try:
        owner = get_owner(request)
        address = request.client.host if request.client else None
        await check_rate(get_state(request), owner, address)
    except ApiError as e:
        raise OpenAIError.from_api_error(e) from e
    return owner


@router.post(
    "/chat/completions",
    responses={
        200: {"description": "a `chat.completion`, or `chat.completion.chunk` events"},
        **{code: {"description": "OpenAI's error shape"} for code in (400, 401, 409, 422, 503)},
    },
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": ChatCompletionRequest.model_json_schema()}},
        }
    },
)
async def chat_completions(request: Request) -> Response:
    """OpenAI's chat completion, answered by a ponder task (see the module docstring)."""
    try:
        state = get_state(request)
        owner = await _caller(request)
        try:
            body = json.loads(await request.body())
        except ValueError as e:
            raise OpenAIError(400, "bad_request", "the body is not valid JSON") from e
        try:
            req = ChatCompletionRequest.model_validate(body)
        except ValidationError as e:
            raise _invalid(e) from e
        task = await _submit(
            state, _task_request(req, state), owner, request.headers.get("idempotency-key")
        )
        if req.stream:
            return StreamingResponse(
                _stream(state, task, req, owner),
                media_type="text/event-stream",
                headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
            )
        return await _answer(request, state, task, req, owner)
    except OpenAIError as e:
        return e.response()
    except RecoverableError as e:
        log.warning("chat completion: %s", e)
        return OpenAIError(
            503, "unavailable", "the task store cannot be reached; retry later",
            headers={"Retry-After": "1"},
        ).response()  # fmt: skip


def _model(model_id: str) -> dict[str, Any]:
    return {"id": model_id, "object": "model", "created": _MODEL_CREATED, "owned_by": "ponder"}


@router.get("/models")
async def list_models(request: Request) -> JSONResponse:
    """The model names this service answers to: ``ponder`` and ``ponder-<mode>``."""
    try:
        await _caller(request)
    except OpenAIError as e:
        return e.response()
    return JSONResponse({"object": "list", "data": [_model(m) for m in MODEL_IDS]})


@router.get("/models/{model_id}")
async def get_model(model_id: str, request: Request) -> JSONResponse:
    """One model of :func:`list_models`."""
    try:
        await _caller(request)
    except OpenAIError as e:
        return e.response()
    if model_id not in MODEL_IDS:
        return OpenAIError(
            404, "model_not_found", f"the model {model_id!r} does not exist", param="model"
        ).response()
    return JSONResponse(_model(model_id))
