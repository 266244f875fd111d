"""OpenAI's Responses API: ``/v1/responses`` (create, retrieve, stream and resume, cancel,
delete, input items), answered by ponder tasks.

A response is a task: ``resp_<task id>``. Its status maps from the task's: ``pending`` →
``queued``, ``running`` → ``in_progress``, ``done`` → ``completed``, ``partial_done`` →
``incomplete`` (``incomplete_details.reason``: ``partial_samples``), ``failed`` →
``failed`` (``error``), ``cancelled`` → ``cancelled``. ``output`` is the fused answer as one
assistant message, ``usage`` counts the prompt once and every sample's output tokens
(:func:`~ponder.openai.common.openai_usage`), and a ``ponder`` field
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
  ``response.completed|failed|cancelled|incomplete`` (:mod:`ponder.openai.webhooks`).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any, NamedTuple

import anyio
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from ponder import admission
from ponder.api.deps import AppState, get_state
from ponder.api.events import follow_events, follow_text, is_final
from ponder.api.openai_common import (
    abandon,
    caller,
    openai_errors,
    query_int,
    read_json,
    wait_unless_gone,
)
from ponder.api.streaming import event_stream
from ponder.errors import AdmissionError, RecoverableError
from ponder.ids import parse_task_id, sort_key
from ponder.openai.common import OpenAIError, check_webhook_url, list_body, submit
from ponder.openai.responses import KIND, ResponseEvents, parse_response_body, response_object
from ponder.states import is_terminal
from ponder.store.base import Event, StoredObject, TaskRecords
from ponder.types import EventName, Task

__all__ = ["router"]

router = APIRouter(prefix="/v1", tags=["openai"])


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


async def _ended_task(store: TaskRecords, event: Event, task_id: str) -> Task:
    """The task as it ended: the ``result`` event carries it; a cancel does not."""
    if event.event == EventName.result:
        return Task.model_validate(event.data)
    task = await store.get_task(task_id)
    if task is None:
        raise OpenAIError(500, "internal", f"task {task_id} disappeared")
    return task


# --- routes ---------------------------------------------------------------------------
class _Loaded(NamedTuple):
    state: AppState
    owner: str
    obj: StoredObject
    task: Task


async def _load(request: Request, response_id: str) -> _Loaded:
    """The caller's stored response and its task (404 otherwise)."""
    state = get_state(request)
    owner = await caller(request)
    return _Loaded(state, owner, *await _find(state, response_id, owner))


async def _find(state: AppState, response_id: str, owner: str) -> tuple[StoredObject, Task]:
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
    if req.stream:
        await follow_text(state.store, task_id)
    task, created = await submit(
        state, task_req, owner, request.headers.get("idempotency-key"), task_id=task_id
    )
    if req.store:
        if not created:  # an Idempotency-Key repeat: the response of the earlier task
            _, meta, _ = parse_response_body(body, state.settings, task.id)
        active = meta["webhook_url"] is not None
        obj = StoredObject(KIND, f"resp_{task.id}", owner, sort_key(task.id), meta, active=active)
        if not await state.store.create_object(obj, ttl_s=2 * state.settings.task_ttl_s):
            meta = (await _find(state, obj.id, owner))[0].data
    if req.stream:
        stream = _stream(state, meta, task, owner, -1, cancel_on_leave=not req.background)
        return event_stream(stream)
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
    state, owner, obj, task = await _load(request, response_id)
    if request.query_params.get("stream", "false").lower() in ("true", "1"):
        after = query_int(request, "starting_after", -1, -1, 2**62)
        return event_stream(_stream(state, obj.data, task, owner, after, cancel_on_leave=False))
    return JSONResponse(response_object(obj.data, task))


@router.post("/responses/{response_id}/cancel")
@openai_errors
async def cancel_response(response_id: str, request: Request) -> Response:
    """Cancel a background response that is queued or in progress (a finished one is
    returned as it is)."""
    state, owner, obj, task = await _load(request, response_id)
    if not obj.data["background"]:
        raise OpenAIError(
            400, "bad_request", "only background responses can be cancelled", param="response_id"
        )
    if not is_terminal(task.status):
        task = await _cancel(state.store, task.id, owner)
    return JSONResponse(response_object(obj.data, task))


async def _cancel(store: TaskRecords, task_id: str, owner: str) -> Task:
    """Cancel the task; one that ended meanwhile is returned as it ended."""
    try:
        return await admission.cancel_task(store, task_id, owner)
    except AdmissionError as e:
        task = await store.get_task(task_id) if e.code == "conflict" else None
        if task is None:
            raise OpenAIError.of(e) from e
        return task


@router.delete("/responses/{response_id}")
@openai_errors
async def delete_response(response_id: str, request: Request) -> Response:
    """Delete the response (a queued or running one is cancelled first)."""
    state, owner, _, task = await _load(request, response_id)
    if not is_terminal(task.status):
        await _cancel(state.store, task.id, owner)
    await state.store.delete_object(KIND, response_id)
    return JSONResponse({"id": response_id, "object": "response", "deleted": True})


@router.get("/responses/{response_id}/input_items")
@openai_errors
async def list_input_items(response_id: str, request: Request) -> Response:
    """The response's input messages: ``?order=desc|asc`` (default desc), ``after``, ``limit``."""
    obj = (await _load(request, response_id)).obj
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
