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
- ``model`` must be a name ``GET /v1/models`` lists: ``ponder`` (standard mode),
  ``ponder-fast|standard|deep``, or an alias of ``PONDER_MODEL_ALIASES``; any other is
  404 ``model_not_found``, as OpenAI answers. The answer names the served model.
- ``usage.prompt_tokens`` counts the prompt once whatever ``n`` and the mode;
  ``completion_tokens`` counts every sample's tokens (the work done for the answer).
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

import json
import logging
from collections.abc import AsyncIterator
from typing import Any, Literal

import anyio
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ponder.api.deps import AppState, get_state
from ponder.api.events import follow_events, is_final
from ponder.api.openai_common import (
    OpenAIError,
    abandon,
    caller,
    failure,
    invalid,
    mode_of,
    model_names,
    openai_errors,
    openai_usage,
    ponder_field,
    read_json,
    served_model,
    submit,
    task_request,
    text_of,
    wait_unless_gone,
)
from ponder.api.schemas import TaskCreate
from ponder.config import Settings
from ponder.deltas import DELTA
from ponder.errors import RecoverableError
from ponder.types import Sample, SampleStatus, Task

__all__ = ["ChatCompletionRequest", "chat_body", "completion_body", "router"]

log = logging.getLogger("ponder.api")

router = APIRouter(prefix="/v1", tags=["openai"])

_MODEL_CREATED = 1_764_412_800  # 2025-11-29: a fixed date, as OpenAI's list shows
_MAX_STOP = 4


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
        return mode_of(self.model, self.mode)


# --- request → task -------------------------------------------------------------------
def chat_body(body: dict[str, Any], settings: Settings, prefix: str = "") -> tuple[
    ChatCompletionRequest, TaskCreate
]:  # fmt: skip
    """A chat completion request body as the request and its task (OpenAI's errors;
    ``prefix``: where the body sits, for error messages, e.g. in a batch line)."""
    try:
        req = ChatCompletionRequest.model_validate(body)
    except ValidationError as e:
        raise invalid(e, prefix) from e
    req.model = served_model(req.model, settings, f"{prefix}model")
    mode = settings.mode(req.selected_mode())
    if req.n > mode.max_samples:
        raise OpenAIError(
            422,
            "invalid",
            f"{prefix}n: {req.n} is over the {req.selected_mode()} mode's maximum "
            f"{mode.max_samples}",
            param=f"{prefix}n",
        )
    if len(req.stops()) > _MAX_STOP:
        raise OpenAIError(
            422, "invalid", f"{prefix}stop: at most {_MAX_STOP} sequences", param=f"{prefix}stop"
        )
    messages = []
    for i, message in enumerate(req.messages):
        content = text_of(message.get("content"), f"{prefix}messages[{i}].content")
        entry = {"role": message.get("role"), "content": content}
        if isinstance(message.get("name"), str):
            entry["name"] = message["name"]
        messages.append(entry)
    fields = {
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
    return req, task_request(fields, prefix)


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
    prompt, completion = openai_usage(task)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def completion_body(task: Task, req: ChatCompletionRequest) -> dict[str, Any]:
    """The ``chat.completion`` of a task that has a result."""
    return {
        "id": f"chatcmpl-{task.id}",
        "object": "chat.completion",
        "created": int(task.created_at.timestamp()),
        "model": req.model,
        "choices": _choices(task, req.n, req.stops()),
        "usage": _usage(task),
        "system_fingerprint": None,
        "ponder": ponder_field(task),
    }


async def _answer(request: Request, state: AppState, task: Task, req: ChatCompletionRequest,
                  owner: str) -> Response:  # fmt: skip
    idle_s = state.settings.events_keepalive_s
    final = await wait_unless_gone(request, state.store, task.id, owner, idle_s)
    if final is None:
        return Response(status_code=499)  # nobody reads it
    if (error := failure(final, task.id)) is not None:
        return error.response()
    return JSONResponse(completion_body(final, req))


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
            error: OpenAIError | None = OpenAIError(503, "unavailable", str(e))
        else:
            error = failure(final, task.id)
        finished = True
        if error is not None or final is None:
            yield _sse(error.body() if error else {"error": {"message": "no task"}})
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
            yield _sse({**head, "choices": [last], "ponder": ponder_field(final)})
        if (req.stream_options or {}).get("include_usage"):
            yield _sse({**head, "choices": [], "usage": _usage(final)})
        yield b"data: [DONE]\n\n"
    finally:
        if not finished:  # the client disconnected (the response is being cancelled)
            with anyio.CancelScope(shield=True):
                await abandon(state.store, task.id, owner)


@router.post(
    "/chat/completions",
    responses={
        200: {"description": "a `chat.completion`, or `chat.completion.chunk` events"},
        **{
            code: {"description": "OpenAI's error shape"} for code in (400, 401, 404, 409, 422, 503)
        },
    },
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": ChatCompletionRequest.model_json_schema()}},
        }
    },
)
@openai_errors
async def chat_completions(request: Request) -> Response:
    """OpenAI's chat completion, answered by a ponder task (see the module docstring)."""
    state = get_state(request)
    owner = await caller(request)
    req, task_req = chat_body(await read_json(request), state.settings)
    task, _ = await submit(state, task_req, owner, request.headers.get("idempotency-key"))
    if req.stream:
        return StreamingResponse(
            _stream(state, task, req, owner),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
    return await _answer(request, state, task, req, owner)


def _model(model_id: str) -> dict[str, Any]:
    return {"id": model_id, "object": "model", "created": _MODEL_CREATED, "owned_by": "ponder"}


@router.get("/models")
@openai_errors
async def list_models(request: Request) -> Response:
    """The model names this service answers to: ``ponder`` and ``ponder-<mode>``, then the
    aliases of ``PONDER_MODEL_ALIASES``."""
    await caller(request)
    names = model_names(get_state(request).settings)
    return JSONResponse({"object": "list", "data": [_model(m) for m in names]})


@router.get("/models/{model_id}")
@openai_errors
async def get_model(model_id: str, request: Request) -> Response:
    """One model of :func:`list_models`."""
    await caller(request)
    served_model(model_id, get_state(request).settings)  # 404 model_not_found
    return JSONResponse(_model(model_id))
