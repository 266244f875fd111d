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
- ``model`` must be a name ``GET /v1/models`` lists: a configured model ``NAME``
  (standard mode) or ``NAME-fast|standard|deep|auto``, ``ponder`` and ``ponder-<mode>``
  (the default model's), or an alias of ``PONDER_MODEL_ALIASES``; any other is 404
  ``model_not_found``, as OpenAI answers, and creates nothing. The task runs on the
  configured model (its ``model``); the answer names the name asked for (an alias's: the
  name it maps to).
- ``GET /v1/models`` adds a ``ponder`` field to each model: the configured ``model``,
  the ``mode`` the name selects, its ``engine``, whether a live worker serves it
  (``served``), its ``state`` (``loaded``, ``loading``, ``unloaded``; null when no
  worker serves it) and ``resident_mb``.
- ``usage.prompt_tokens`` counts the prompt once whatever ``n`` and the mode;
  ``completion_tokens`` counts every sample's tokens (the work done for the answer).
- ``stream: true`` answers with ``chat.completion.chunk`` events: the role at once, the
  text of a sample as the model writes it (from the task's ``delta`` events), keep-alive
  comments while nothing happens, then the answer, the finish reason (and the usage with
  ``stream_options.include_usage``), then ``data: [DONE]``. Which text streams:

  - a task of one sample (fast mode, ``n`` = 1): its text is ``choices[0]``'s ``content``
    as it is written, and a last content chunk completes it to the final answer (the
    text of a sample is its answer);
  - several samples (standard, deep, ``n`` > 1), or a structured task
    (``response_format``: its answer is the object the vote builds): the vote picks the
    answer only at the end, so the text of the *leading* sample (the first to write)
    streams as ``choices[0].delta.reasoning_content`` (the field reasoning servers use
    for text that is not the answer), and ``content`` carries the fused answer in one
    chunk when the vote is done — the concatenated ``content`` is exactly the non-streamed answer.

Errors use OpenAI's shape, ``{"error": {"message", "type", "param", "code"}}``, which
is also ponder's envelope (``code`` and ``message``). A client that disconnects before
the answer cancels its task: nobody else is waiting for it. The request → task and
task → completion mappings are :mod:`ponder.openai.chat`; this module is the routes,
the waiting and the stream.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import anyio
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from ponder.api.deps import AppState, get_state
from ponder.api.events import follow_events, follow_text, is_final
from ponder.api.openai_common import (
    abandon,
    caller,
    openai_errors,
    openai_response,
    read_json,
    wait_unless_gone,
)
from ponder.api.streaming import event_stream
from ponder.config import Settings
from ponder.errors import RecoverableError
from ponder.openai.chat import (
    ChatCompletionRequest,
    chat_body,
    completion_body,
    completion_choices,
    completion_usage,
)
from ponder.openai.common import (
    OpenAIError,
    failure,
    model_names,
    ponder_field,
    resolve_model,
    submit,
)
from ponder.store.records import ModelState
from ponder.types import DEFAULT_MODE, EventName, Task

__all__ = ["router"]

log = logging.getLogger("ponder.api")

router = APIRouter(prefix="/v1", tags=["openai"])

_MODEL_CREATED = 1_764_412_800  # 2025-11-29: a fixed date, as OpenAI's list shows


async def _answer(request: Request, state: AppState, task: Task, req: ChatCompletionRequest,
                  owner: str) -> Response:  # fmt: skip
    idle_s = state.settings.events_keepalive_s
    final = await wait_unless_gone(request, state.store, task.id, owner, idle_s)
    if final is None:
        return Response(status_code=499)  # nobody reads it
    if (error := failure(final, task.id)) is not None:
        return openai_response(error)
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


def _streamed_field(task: Task) -> str:
    """Where the leading sample's text streams: ``content`` when it is the answer (one
    sample), else ``reasoning_content`` (several samples, or a structured task: the answer
    is the object the vote builds; see the module doc)."""
    single = task.samples_planned == 1 and task.response_format is None
    return "content" if single else "reasoning_content"


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
    field = _streamed_field(task)
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
                elif event.event == EventName.delta and (piece := leader.take(event.data)):
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
        choices = completion_choices(final, req.n, req.stops())
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
            yield _sse({**head, "choices": [], "usage": completion_usage(final)})
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
    task_id = state.ids.new_id()
    if req.stream:
        await follow_text(state.store, task_id)
    key = request.headers.get("idempotency-key")
    task, _ = await submit(state, task_req, owner, key, task_id=task_id)
    if req.stream:
        return event_stream(_stream(state, task, req, owner))
    return await _answer(request, state, task, req, owner)


def _model(model_id: str, settings: Settings, states: list[ModelState]) -> dict[str, Any]:
    """One entry of ``/v1/models``: OpenAI's fields, and in ``ponder`` the configured
    model the name stands for, the mode it selects, its engine and how the live workers
    serve it (``served``; ``state``: the most loaded of theirs; ``resident_mb``: the
    resident memory of its engines, each process's once, as ``/v1/overview`` counts it)."""
    model, mode = resolve_model(model_id, settings)
    mine = [s for s in states if s.model == model]
    state = next(
        (k for k in ("loaded", "loading", "unloaded") if any(s.state == k for s in mine)), None
    )
    sizes: dict[str, float] = {}  # each process once: its worker loops share one engine
    for s in mine:
        if s.resident_mb is not None:
            process = s.worker.rpartition("-w")[0] or s.worker
            sizes[process] = max(sizes.get(process, 0.0), s.resident_mb)
    ponder = {
        "model": model,
        "mode": (mode or DEFAULT_MODE).value,
        "engine": settings.models[model].engine,
        "served": bool(mine),
        "state": state,
        "resident_mb": round(sum(sizes.values()), 1) if sizes else None,
    }
    return {
        "id": model_id,
        "object": "model",
        "created": _MODEL_CREATED,
        "owned_by": "ponder",
        "ponder": ponder,
    }


@router.get("/models")
@openai_errors
async def list_models(request: Request) -> Response:
    """The model names this service answers to: each configured model and its
    ``-<mode>`` variants, ``ponder`` and ``ponder-<mode>`` (the default model's), then the
    aliases of ``PONDER_MODEL_ALIASES``; each with a ``ponder`` field (:func:`_model`)."""
    await caller(request)
    state = get_state(request)
    states = await state.store.served_models()  # the one store call
    data = [_model(name, state.settings, states) for name in model_names(state.settings)]
    return JSONResponse({"object": "list", "data": data})


@router.get("/models/{model_id}")
@openai_errors
async def get_model(model_id: str, request: Request) -> Response:
    """One model of :func:`list_models` (404 ``model_not_found`` for a name it does not
    list)."""
    await caller(request)
    state = get_state(request)
    resolve_model(model_id, state.settings)  # 404 model_not_found
    return JSONResponse(_model(model_id, state.settings, await state.store.served_models()))
