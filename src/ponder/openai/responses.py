"""OpenAI's Responses API: ``/v1/responses`` (create, retrieve, stream and resume, cancel,
delete, input items), answered by ponder tasks.

A response is a task: ``resp_<task id>``. Its status maps from the task's: ``pending`` →
``queued``, ``running`` → ``in_progress``, ``done`` → ``completed``, ``partial_done`` →
``incomplete`` (``incomplete_details.reason``: ``partial_samples``), ``failed`` →
``failed`` (``error``), ``cancelled`` → ``cancelled``. ``output`` is the fused answer as one
assistant message, ``usage`` counts the prompt once and every sample's output tokens
(:func:`~ponder.api.openai_common.openai_usage`), and a ``ponder`` field
carries the vote (as on the chat route). ponder's own fields come through the SDK's
``extra_body``: ``mode``, ``task_type``, ``priority``, ``samples``, ``timeout_s``, ``stop``
and ``webhook_url``.

- Without ``background`` the call waits like the chat route (a client that disconnects
  first cancels the task); with it, the call answers at once (``queued``) and a
  disconnect never cancels anything.
- ``store: false``: the response is not kept: it cannot be retrieved, streamed again or
  listed afterwards (its task is, like any task, under ``/v1/tasks``). Background
  responses need ``store: true``.
- ``stream: true`` answers with OpenAI's response events, each with a
  ``sequence_number``; ``GET /v1/responses/{id}?stream=true&starting_after=N`` replays
  from N+1 and follows to the end. The events are a pure function of the task's event
  log (:class:`ResponseEvents`), so a replay numbers them the same way and a resumed
  stream has no gap and no duplicate.
- A background response with a ``webhook_url`` (or ``PONDER_WEBHOOK_URL``) gets
  ``response.completed|failed|cancelled|incomplete`` (``ponder.openai_events``).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any, Literal

import anyio
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from ponder.api.deps import AppState, get_state
from ponder.api.errors import ApiError
from ponder.api.events import follow_events, is_final
from ponder.api.openai_common import (
    OpenAIError,
    abandon,
    caller,
    check_metadata,
    check_webhook_url,
    invalid,
    list_body,
    mode_of,
    openai_errors,
    openai_usage,
    ponder_field,
    query_int,
    read_json,
    served_model,
    submit,
    task_request,
    text_of,
    wait_unless_gone,
)
from ponder.api.schemas import TaskCreate
from ponder.api.tasks import cancel_task
from ponder.batches import usage_object
from ponder.config import Settings
from ponder.errors import RecoverableError
from ponder.ids import parse_task_id, sort_key
from ponder.states import is_terminal
from ponder.store.base import Event, StoredObject, TaskStore
from ponder.types import Task, TaskStatus

__all__ = [
    "KIND",
    "ResponseCreateRequest",
    "ResponseEvents",
    "parse_response_body",
    "response_object",
    "router",
]

router = APIRouter(prefix="/v1", tags=["openai"])

KIND = "response"
_ROLES = frozenset({"user", "system", "developer", "assistant"})

STATUS = {
    TaskStatus.pending: "queued",
    TaskStatus.running: "in_progress",
    TaskStatus.done: "completed",
    TaskStatus.partial_done: "incomplete",
    TaskStatus.failed: "failed",
    TaskStatus.cancelled: "cancelled",
}
#: the stream's last event for each terminal status
_TERMINAL_EVENTS = {
    TaskStatus.done: "response.completed",
    TaskStatus.partial_done: "response.incomplete",
    TaskStatus.failed: "response.failed",
    TaskStatus.cancelled: "response.cancelled",
}


class ResponseCreateRequest(BaseModel):
    """The fields of OpenAI's response request that ponder reads (others ignored)."""

    model_config = ConfigDict(extra="ignore")

    model: str = Field(default="ponder", max_length=200)
    input: str | list[Any]
    instructions: str | None = None
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    max_output_tokens: int | None = Field(default=None, ge=1)
    metadata: dict[str, str] | None = None
    background: bool = False
    stream: bool = False
    store: bool = True
    tools: list[Any] | None = None
    previous_response_id: str | None = None
    # ponder's extensions (the OpenAI SDK's ``extra_body``)
    mode: Literal["fast", "standard", "deep"] | None = None
    task_type: Literal["auto", "math", "code", "choice", "text"] = "auto"
    priority: int = Field(default=3, ge=0, le=5)
    samples: int | None = Field(default=None, ge=1)
    timeout_s: float | None = Field(default=None, gt=0)
    stop: str | list[str] | None = None
    webhook_url: str | None = Field(default=None, max_length=2000)

    _metadata = field_validator("metadata")(check_metadata)


# --- request → task -------------------------------------------------------------------
def _input_items(req: ResponseCreateRequest, task_id: str, prefix: str) -> list[dict[str, Any]]:
    """The input as OpenAI's input message items (what ``input_items`` lists)."""
    if isinstance(req.input, str):
        raw: list[Any] = [{"role": "user", "content": req.input}]
    else:
        raw = req.input
    if not raw:
        raise OpenAIError(
            422, "invalid", f"{prefix}input: give at least one message", param=f"{prefix}input"
        )
    items = []
    for i, item in enumerate(raw):
        where = f"{prefix}input[{i}]"
        kind = item.get("type", "message") if isinstance(item, dict) else type(item).__name__
        if kind != "message" or item.get("role") not in _ROLES:
            raise OpenAIError(
                422,
                "invalid",
                f"{where}: only messages with a role of {', '.join(sorted(_ROLES))} are "
                f"supported, not {kind!r}",
                param=where,
            )
        role = item["role"]
        text = text_of(item.get("content"), f"{where}.content")
        part = "output_text" if role == "assistant" else "input_text"
        items.append(
            {
                "type": "message",
                "id": f"msg_{task_id}_{i}",
                "role": role,
                "status": "completed",
                "content": [{"type": part, "text": text}],
            }
        )
    return items


def parse_response_body(
    body: dict[str, Any], settings: Settings, task_id: str, prefix: str = ""
) -> tuple[ResponseCreateRequest, dict[str, Any], TaskCreate]:
    """A response request body as the request, the response's own fields (``meta``,
    what the response object echoes) and the task to run. Errors in OpenAI's shape;
    ``prefix`` says where the body sits (a batch line's ``body.``)."""
    try:
        req = ResponseCreateRequest.model_validate(body)
    except ValidationError as e:
        raise invalid(e, prefix) from e
    req.model = served_model(req.model, settings, f"{prefix}model")
    if req.tools:
        raise OpenAIError(
            422, "invalid", f"{prefix}tools: tools are not supported", param=f"{prefix}tools"
        )
    if req.previous_response_id is not None:
        raise OpenAIError(
            422,
            "invalid",
            f"{prefix}previous_response_id: not supported; send the conversation in input",
            param=f"{prefix}previous_response_id",
        )
    if req.background and not req.store:
        raise OpenAIError(
            422,
            "invalid",
            f"{prefix}store: background responses need store",
            param=f"{prefix}store",
        )
    items = _input_items(req, task_id, prefix)
    messages = [{"role": "system", "content": req.instructions}] if req.instructions else []
    messages += [{"role": i["role"], "content": i["content"][0]["text"]} for i in items]
    mode = mode_of(req.model, req.mode)
    stops = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
    fields = {
        "messages": messages,
        "mode": mode,
        "task_type": req.task_type,
        "priority": req.priority,
        "samples": req.samples,
        "max_new_tokens": req.max_output_tokens,
        "temperature": req.temperature,
        "timeout_s": req.timeout_s,
        "stop": [s for s in stops if s],
        "metadata": req.metadata,
    }
    meta = {
        "model": req.model,
        "instructions": req.instructions,
        "input": items,
        "top_p": req.top_p,
        "max_output_tokens": req.max_output_tokens,
        "metadata": req.metadata or {},
        "background": req.background,
        "store": req.store,
        "webhook_url": (req.webhook_url or settings.webhook_url) if req.background else None,
    }
    return req, meta, task_request(fields, prefix)


# --- task → response ------------------------------------------------------------------
def _message(task: Task, status: str, text: str | None) -> dict[str, Any]:
    content = [] if text is None else [_text_part(text)]
    return {
        "type": "message",
        "id": f"msg_{task.id}",
        "status": status,
        "role": "assistant",
        "content": content,
    }


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def response_object(
    meta: dict[str, Any], task: Task, *, as_of: TaskStatus | None = None
) -> dict[str, Any]:
    """The response object of ``task``; ``as_of``: as it was while the task had that
    (non-terminal) status (a stream's snapshots: they never show later state)."""
    status = as_of or task.status
    final = is_terminal(status)
    error = None
    if final and status == TaskStatus.failed:
        code, message = (task.error.code, task.error.message) if task.error else ("failed", "")
        error = {"code": "server_error", "message": f"{code}: {message}"}
    answered = final and task.result is not None
    finished = task.finished_at if final else None
    return {
        "id": f"resp_{task.id}",
        "object": "response",
        "created_at": int(task.created_at.timestamp()),
        "status": STATUS[status],
        "background": meta["background"],
        "completed_at": int(finished.timestamp()) if finished and answered else None,
        "error": error,
        "incomplete_details": {"reason": "partial_samples"}
        if status == TaskStatus.partial_done
        else None,
        "instructions": meta["instructions"],
        "max_output_tokens": meta["max_output_tokens"],
        "metadata": meta["metadata"],
        "model": meta["model"],
        "output": [_message(task, "completed", task.result.text)]
        if answered and task.result is not None
        else [],
        "parallel_tool_calls": True,
        "previous_response_id": None,
        "reasoning": {"effort": None, "summary": None},
        "store": meta["store"],
        "temperature": task.temperature,
        "text": {"format": {"type": "text"}},
        "tool_choice": "auto",
        "tools": [],
        "top_p": meta["top_p"] if meta["top_p"] is not None else 1.0,
        "truncation": "disabled",
        "usage": usage_object(*openai_usage(task)) if final else None,
        "user": None,
        "ponder": ponder_field(task) if final else {"task_id": task.id, "status": status.value},
    }


class ResponseEvents:
    """Maps a task's event log to OpenAI's response stream events.

    The mapping is a pure function of the log (and of the response's own fields), and
    every event gets the next ``sequence_number``: replaying the log gives the same events
    with the same numbers, which is what resuming with ``starting_after`` relies on.

    - ``status`` pending → ``response.created`` + ``response.queued``; running →
      ``response.in_progress`` (once; a reclaimed task's second start adds nothing).
    - ``sample`` → ``ponder.sample``, ``preliminary`` → ``ponder.preliminary``.
    - ``delta`` (``{"index": i, "text": …}``, per-token text of sample i): the output's
      ``response.output_text.delta`` when the task runs one sample (that sample is the
      answer), else ``ponder.sample.delta``.
    - the terminal event → the rest of the output message (one delta with the text not
      yet sent, ``.done`` events) and ``response.completed`` / ``incomplete`` /
      ``failed`` / ``cancelled`` with the whole response.
    """

    def __init__(self, meta: dict[str, Any], task: Task) -> None:
        self.meta = meta
        self.task = task
        self.seq = 0
        self._running = False
        self._opened = False
        self._sent = ""  # output text sent so far
        self._single = task.samples_planned == 1

    def _emit(self, kind: str, **fields: Any) -> dict[str, Any]:
        event = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return event

    def _where(self) -> dict[str, Any]:
        return {"item_id": f"msg_{self.task.id}", "output_index": 0, "content_index": 0}

    def _open(self) -> list[dict[str, Any]]:
        if self._opened:
            return []
        self._opened = True
        item = _message(self.task, "in_progress", None)
        return [
            self._emit("response.output_item.added", output_index=0, item=item),
            self._emit("response.content_part.added", **self._where(), part=_text_part("")),
        ]

    def _delta(self, text: str) -> list[dict[str, Any]]:
        self._sent += text
        return [self._emit("response.output_text.delta", **self._where(), delta=text, logprobs=[])]

    def map(self, event: Event, final: Task | None = None) -> list[dict[str, Any]]:
        """The response events of one task event; ``final``: the ended task, given with
        the terminal event."""
        data = event.data
        if final is not None:
            return self._finish(final)
        if event.event == "status" and data.get("status") == TaskStatus.pending:
            snapshot = response_object(self.meta, self.task, as_of=TaskStatus.pending)
            return [
                self._emit("response.created", response=snapshot),
                self._emit("response.queued", response=snapshot),
            ]
        if event.event == "status" and data.get("status") == TaskStatus.running:
            if self._running:
                return []
            self._running = True
            snapshot = response_object(self.meta, self.task, as_of=TaskStatus.running)
            return [self._emit("response.in_progress", response=snapshot)]
        if event.event == "sample":
            return [self._emit("ponder.sample", sample=data)]
        if event.event == "preliminary":
            return [self._emit("ponder.preliminary", result=data)]
        if event.event == "delta":
            text = str(data.get("text", ""))
            if self._single:
                return self._open() + self._delta(text)
            return [self._emit("ponder.sample.delta", sample_index=data.get("index"), delta=text)]
        return []

    def _finish(self, task: Task) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        if task.result is not None:
            text = task.result.text
            out += self._open()
            if not self._sent or (text.startswith(self._sent) and text != self._sent):
                out += self._delta(text[len(self._sent) :])
            out.append(
                self._emit("response.output_text.done", **self._where(), text=text, logprobs=[])
            )
            out.append(
                self._emit("response.content_part.done", **self._where(), part=_text_part(text))
            )
            out.append(
                self._emit(
                    "response.output_item.done",
                    output_index=0,
                    item=_message(task, "completed", text),
                )
            )
        kind = _TERMINAL_EVENTS[task.status]
        return [*out, self._emit(kind, response=response_object(self.meta, task))]


def _sse(event: dict[str, Any]) -> bytes:
    data = json.dumps(event, separators=(",", ":"))
    return f"event: {event['type']}\ndata: {data}\n\n".encode()


async def _stream(
    state: AppState,
    meta: dict[str, Any],
    task: Task,
    owner: str,
    starting_after: int,
    *,
    cancel_on_leave: bool,
) -> AsyncIterator[bytes]:
    """The response's events after ``starting_after``, from the task's event log."""
    store, idle_s = state.store, state.settings.events_keepalive_s
    mapper = ResponseEvents(meta, task)
    finished = False
    try:
        try:
            async for event in follow_events(store, task.id, None, idle_s=idle_s):
                if event is None:
                    yield b": keep-alive\n\n"
                    continue
                final = None
                if is_final(event):
                    final = await _ended_task(store, event, task.id)
                for out in mapper.map(event, final):
                    if out["sequence_number"] > starting_after:
                        yield _sse(out)
        except RecoverableError as e:
            error = OpenAIError(503, "unavailable", str(e)).body()["error"]
            yield _sse({"type": "error", "sequence_number": mapper.seq, **error})
        finished = True
    finally:
        if not finished and cancel_on_leave:  # the client disconnected before the end
            with anyio.CancelScope(shield=True):
                await abandon(store, task.id, owner)


async def _ended_task(store: TaskStore, event: Event, task_id: str) -> Task:
    """The task as it ended: the ``result`` event carries it; a cancel does not."""
    if event.event == "result":
        return Task.model_validate(event.data)
    task = await store.get_task(task_id)
    if task is None:
        raise OpenAIError(500, "internal", f"task {task_id} disappeared")
    return task


def _streaming(body: AsyncIterator[bytes]) -> StreamingResponse:
    return StreamingResponse(
        body,
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


# --- routes ---------------------------------------------------------------------------
async def _load(state: AppState, response_id: str, owner: str) -> tuple[StoredObject, Task]:
    """The caller's stored response and its task (404 otherwise)."""
    task_id = response_id.removeprefix("resp_")
    obj = None
    if response_id.startswith("resp_") and parse_task_id(task_id):
        obj = await state.store.get_object(KIND, response_id)
    task = await state.store.get_task(task_id) if obj is not None else None
    if obj is None or task is None or obj.owner != owner:
        raise OpenAIError.not_found("response", response_id)
    return obj, task


@router.post("/responses")
@openai_errors
async def create_response(request: Request) -> Response:
    """Create a response (see the module docstring)."""
    state = get_state(request)
    owner = await caller(request)
    body = await read_json(request)
    task_id = state.ids.new_id()
    req, meta, task_req = parse_response_body(body, state.settings, task_id)
    if req.webhook_url is not None and meta["webhook_url"] is not None:
        await check_webhook_url(req.webhook_url, state.settings, "webhook_url")
    task, created = await submit(
        state, task_req, owner, request.headers.get("idempotency-key"), task_id=task_id
    )
    if req.store:
        if not created:  # an Idempotency-Key repeat: the response of the earlier task
            _, meta, _ = parse_response_body(body, state.settings, task.id)
        active = meta["webhook_url"] is not None
        obj = StoredObject(KIND, f"resp_{task.id}", owner, sort_key(task.id), meta, active=active)
        if not await state.store.create_object(obj, ttl_s=2 * state.settings.task_ttl_s):
            meta = (await _load(state, obj.id, owner))[0].data
    if req.stream:
        return _streaming(_stream(state, meta, task, owner, -1, cancel_on_leave=not req.background))
    if req.background:
        return JSONResponse(response_object(meta, task))
    final = await wait_unless_gone(
        request, state.store, task.id, owner, state.settings.events_keepalive_s
    )
    if final is None:
        return Response(status_code=499)  # nobody reads it
    return JSONResponse(response_object(meta, final))


@router.get("/responses/{response_id}")
@openai_errors
async def retrieve_response(response_id: str, request: Request) -> Response:
    """The response; with ``?stream=true`` its events (after ``starting_after``), then
    the live ones until it ends."""
    state = get_state(request)
    owner = await caller(request)
    obj, task = await _load(state, response_id, owner)
    if request.query_params.get("stream", "false").lower() in ("true", "1"):
        after = query_int(request, "starting_after", -1, -1, 2**62)
        return _streaming(_stream(state, obj.data, task, owner, after, cancel_on_leave=False))
    return JSONResponse(response_object(obj.data, task))


@router.post("/responses/{response_id}/cancel")
@openai_errors
async def cancel_response(response_id: str, request: Request) -> Response:
    """Cancel a background response that is queued or in progress (a finished one is
    returned as it is)."""
    state = get_state(request)
    owner = await caller(request)
    obj, task = await _load(state, response_id, owner)
    if not obj.data["background"]:
        raise OpenAIError(
            400, "bad_request", "only background responses can be cancelled", param="response_id"
        )
    if not is_terminal(task.status):
        task = await _cancel(state.store, task.id, owner)
    return JSONResponse(response_object(obj.data, task))


async def _cancel(store: TaskStore, task_id: str, owner: str) -> Task:
    """Cancel the task; one that ended meanwhile is returned as it ended."""
    try:
        return await cancel_task(store, task_id, owner)
    except ApiError as e:
        task = await store.get_task(task_id) if e.code == "conflict" else None
        if task is None:
            raise OpenAIError.from_api_error(e) from e
        return task


@router.delete("/responses/{response_id}")
@openai_errors
async def delete_response(response_id: str, request: Request) -> Response:
    """Delete the response (a queued or running one is cancelled first)."""
    state = get_state(request)
    owner = await caller(request)
    _, task = await _load(state, response_id, owner)
    if not is_terminal(task.status):
        await _cancel(state.store, task.id, owner)
    await state.store.delete_object(KIND, response_id)
    return JSONResponse({"id": response_id, "object": "response", "deleted": True})


@router.get("/responses/{response_id}/input_items")
@openai_errors
async def list_input_items(response_id: str, request: Request) -> Response:
    """The response's input messages: ``?order=desc|asc`` (default desc), ``after``, ``limit``."""
    state = get_state(request)
    owner = await caller(request)
    obj, _ = await _load(state, response_id, owner)
    order = request.query_params.get("order", "desc")
    if order not in ("asc", "desc"):
        raise OpenAIError(422, "invalid", "order: give asc or desc", param="order")
    limit = query_int(request, "limit", 20, 1, 100)
    items: list[dict[str, Any]] = list(obj.data["input"])
    if order == "desc":
        items.reverse()
    after = request.query_params.get("after")
    if after is not None:
        ids = [item["id"] for item in items]
        if after not in ids:
            raise OpenAIError(422, "invalid", f"after: no input item {after!r}", param="after")
        items = items[ids.index(after) + 1 :]
    return JSONResponse(list_body(items[:limit], len(items) > limit))
