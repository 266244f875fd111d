"""A task's events: ``GET /v1/tasks/{id}/events`` (SSE) and ``/v1/tasks/{id}/ws``.

Both follow the task's event log (``status``, ``sample``, ``preliminary``, ``result``),
which the store writes atomically with each state change, so they work the same in the
embedded store and across processes over Redis. Every event carries its log id: a
client that reconnects with ``Last-Event-ID`` (header, or ``?last_event_id=``) gets
exactly the events after it; an id past the end of the log waits for the next event, and
one that is not an event id at all is 400 ``invalid``. A stream ends after the event that
carries a terminal status; connecting to a finished task replays its events and ends.

Between those, ``delta`` events carry the text of running samples as it is generated
(``{"index", "offset", "text"}``, at most ~10 per second per sample: see
:mod:`ponder.deltas`); they are in the same log, so they resume like the others, and
``?deltas=false`` leaves them out. They are written while a client follows them: a stream
with deltas posts a follow notice for its task (again every ``FOLLOW_RENEW_S``), and its
first delta of each running sample holds that sample's text so far.

Waiting is a blocking read of the log (``read_events(block_ms=…)``), never polling; when
it times out the SSE stream sends a keep-alive comment. A stream holds at most one page
of events in memory and writes it only as fast as the client reads (the ASGI server's
flow control), and it stops as soon as the client disconnects.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import re
from collections.abc import AsyncIterator
from typing import Annotated, Any, cast

from fastapi import APIRouter, Header, Query, Request, WebSocket
from fastapi.responses import JSONResponse
from starlette.websockets import WebSocketState

from ponder.aio import first_of
from ponder.api.deps import AppState, Caller, check_rate, get_owner
from ponder.api.errors import ApiError, error_response
from ponder.api.schemas import ErrorBody
from ponder.api.streaming import StreamResponse, event_stream
from ponder.api.tasks import load_task
from ponder.deltas import FOLLOW_RENEW_S
from ponder.errors import RecoverableError, StoreUnavailable
from ponder.states import is_final, is_terminal
from ponder.store.base import Event, EventLog, Notice, TaskEvents
from ponder.types import EventName

# is_final is ponder.states's (the SDK's TaskEvent uses it too), named here for the routes
# that follow events
__all__ = [
    "follow_event_batches",
    "follow_events",
    "follow_text",
    "format_sse",
    "is_final",
    "router",
]

log = logging.getLogger("ponder.api")

router = APIRouter(prefix="/v1", tags=["tasks"])

_PAGE = 100
_MAX_EVENT_ID = 64
_SSE_RETRY_MS = 1000
_WS_NORMAL, _WS_ERROR = 1000, 1011

_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorBody} for code in (400, 401, 404, 422, 429, 503)
}


async def follow_text(store: EventLog, task_id: str) -> None:
    """Tell the workers that a client follows the task's text: they write its ``delta``
    events (and stream it from a remote engine) from now on (:mod:`ponder.deltas`). A route
    that will stream a task it is about to create says so first, so that its first sample
    streams too."""
    await store.post_notice(Notice.follow, task_id)


async def follow_events(
    store: TaskEvents, task_id: str, after: str | None, *, idle_s: float, deltas: bool = True
) -> AsyncIterator[Event | None]:
    """The task's events after ``after``, oldest first, as they are written.

    Yields None after each ``idle_s`` without an event (a keep-alive tick). Ends after
    the terminal event, or when the task is terminal or gone and no event follows
    ``after`` (a client that already has everything). Without ``deltas``, ``delta``
    events are skipped (an interval with only those counts as idle).
    """
    async for batch in follow_event_batches(store, task_id, after, idle_s=idle_s, deltas=deltas):
        if not batch:
            yield None
        for event in batch:
            yield event


async def follow_event_batches(
    store: TaskEvents, task_id: str, after: str | None, *, idle_s: float, deltas: bool = True
) -> AsyncIterator[list[Event]]:
    """:func:`follow_events` a read at a time: the events of one read of the log (those
    written together come together), or ``[]`` for a keep-alive tick.

    With ``deltas``, it tells the workers that the task's text is followed (a
    :func:`follow_text` once its first read shows the task unfinished, and again at most
    every :data:`FOLLOW_RENEW_S` while it runs): they write its ``delta`` events only then."""
    loop = asyncio.get_running_loop()
    idle_ms = max(1, int(idle_s * 1000))
    block_ms = 0  # the first read does not wait: a finished task's stream ends at once
    ended = False
    last_yield = loop.time()
    followed_at = -math.inf
    while True:
        # before each wait (the task has not ended): a replay of a finished task posts none
        if deltas and block_ms and loop.time() - followed_at >= FOLLOW_RENEW_S:
            await follow_text(store, task_id)
            followed_at = loop.time()
        events = await store.read_events(task_id, after, block_ms=block_ms, limit=_PAGE)
        batch: list[Event] = []
        for event in events:
            after = event.id
            if deltas or event.event != EventName.delta:
                batch.append(event)
                if is_final(event):
                    break
        if batch:
            yield batch
            last_yield = loop.time()
            if is_final(batch[-1]):
                return
        if events:
            if loop.time() - last_yield >= idle_s:
                yield []
                last_yield = loop.time()
            # the task has not ended (no final event yet): wait for the next event at once;
            # a final event already written is read back without waiting
            block_ms = idle_ms
            continue
        if ended:
            return
        task = await store.get_task(task_id)
        if task is None or is_terminal(task.status):
            ended, block_ms = True, 0  # one more read: the final event may have just landed
            continue
        if block_ms:
            yield []  # a whole idle interval without an event
            last_yield = loop.time()
        block_ms = idle_ms


def format_sse(event: Event) -> bytes:
    """One SSE message: ``id``, ``event`` and the data as one JSON line."""
    data = json.dumps(event.data, separators=(",", ":"))
    return f"id: {event.id}\nevent: {event.event}\ndata: {data}\n\n".encode()


#: an event id as the stores write them: a row id (SQLite) or a stream id (Redis)
_EVENT_ID = re.compile(r"\d{1,20}(-\d{1,20})?")


def _event_key(event_id: str) -> tuple[int, int]:
    first, _, second = event_id.partition("-")
    return int(first), int(second or 0)


def _start_after(*candidates: str | None) -> str | None:
    """The first Last-Event-ID given (header, then query); 400 ``invalid`` if malformed."""
    for value in candidates:
        if value:
            if not _EVENT_ID.fullmatch(value):
                raise ApiError(
                    400,
                    "invalid",
                    f"Last-Event-ID: {value[:_MAX_EVENT_ID]!r} is not an event id; give the "
                    "`id` of the last event received, or none to start from the beginning",
                )
            return value
    return None


async def _resume_after(store: EventLog, task_id: str, after: str | None) -> str | None:
    """The last event of the log at or before ``after`` (None: before the first).

    Resuming there is the same as resuming after ``after``, except for an id past the end
    of the log: the stream then waits for the next event, whatever id it gets, instead of
    skipping every event up to that id. Read before following, so an event written
    meanwhile (a later id) is not skipped either.
    """
    if after is None:
        return None
    limit, resume, cursor = _event_key(after), None, None
    while True:
        page = await store.read_events(task_id, cursor, limit=_PAGE)
        for event in page:
            if _event_key(event.id) > limit:
                return resume
            resume = event.id
        if len(page) < _PAGE:
            return resume
        cursor = page[-1].id


async def _sse_stream(
    store: TaskEvents, task_id: str, after: str | None, idle_s: float, deltas: bool
) -> AsyncIterator[bytes]:
    # one chunk (one socket write) per read of the log; the retry line goes with the first
    head = f"retry: {_SSE_RETRY_MS}\n\n".encode()
    try:
        async for batch in follow_event_batches(
            store, task_id, after, idle_s=idle_s, deltas=deltas
        ):
            yield head + (b"".join(map(format_sse, batch)) if batch else b": keep-alive\n\n")
            head = b""
    except RecoverableError as e:
        # Headers are sent: end the stream; the client resumes with Last-Event-ID.
        log.warning("events of task %s: %s", task_id, e)


Deltas = Annotated[bool, Query(description="include `delta` events (the text of running samples)")]


@router.get(
    "/tasks/{task_id}/events",
    responses={200: {"content": {"text/event-stream": {}}}, **_ERRORS},
    response_class=StreamResponse,
)
async def task_events(
    task_id: str,
    caller: Caller,
    last_event_id_header: Annotated[str | None, Header(alias="Last-Event-ID")] = None,
    last_event_id: Annotated[str | None, Query(description="resume after this event")] = None,
    deltas: Deltas = True,
) -> StreamResponse:
    """Server-Sent Events of the task: ``status``, ``delta``, ``sample``, ``preliminary``,
    ``result``.

    Resume with the ``Last-Event-ID`` header (or ``?last_event_id=``). The stream ends
    after the terminal event; a ``: keep-alive`` comment is sent while nothing happens.
    ``delta`` events (``{"index", "offset", "text"}``: the text of a running sample) are
    left out with ``?deltas=false``.
    """
    after = _start_after(last_event_id_header, last_event_id)
    state = caller.state
    await load_task(state.store, task_id, caller.owner)
    after = await _resume_after(state.store, task_id, after)
    return event_stream(
        _sse_stream(state.store, task_id, after, state.settings.events_keepalive_s, deltas)
    )


# --- WebSocket ------------------------------------------------------------------------
async def _deny(websocket: WebSocket, response: JSONResponse, status: int, message: str) -> None:
    """Refuse the handshake with the HTTP error envelope where the server allows it."""
    if "websocket.http.response" in websocket.scope.get("extensions", {}):
        await websocket.send_denial_response(response)
    else:  # close codes 4000 + HTTP status, a common convention
        await websocket.close(code=4000 + status, reason=message[:120])


async def _until_disconnect(websocket: WebSocket) -> bool:
    """Read (and ignore) what the client sends until it goes away; True (it left)."""
    while True:
        message = await websocket.receive()
        if message["type"] == "websocket.disconnect":
            return True


async def _ws_pump(websocket: WebSocket, store: TaskEvents, task_id: str, after: str | None,
                   idle_s: float, deltas: bool) -> bool:  # fmt: skip
    """Send the task's events until the last; False (the client did not leave)."""
    async for event in follow_events(store, task_id, after, idle_s=idle_s, deltas=deltas):
        if event is not None:  # the protocol's own pings keep an idle connection alive
            await websocket.send_json({"event": event.event, "id": event.id, "data": event.data})
    return False


@router.websocket("/tasks/{task_id}/ws")
async def task_websocket(
    websocket: WebSocket,
    task_id: str,
    last_event_id: Annotated[str | None, Query()] = None,
    deltas: Deltas = True,
) -> None:
    """The same events as JSON messages ``{"event", "id", "data"}``; closed with 1000
    after the terminal event. Resume with ``?last_event_id=`` (or a Last-Event-ID header);
    ``?deltas=false`` leaves out the ``delta`` events."""
    state: AppState = websocket.app.state.ponder
    try:
        # get_owner reads only the app state and the headers, which a WebSocket has too
        owner = get_owner(cast(Request, websocket))
        await check_rate(state, owner, websocket.client.host if websocket.client else None)
        after = _start_after(websocket.headers.get("last-event-id"), last_event_id)
        await load_task(state.store, task_id, owner)
        after = await _resume_after(state.store, task_id, after)
    except ApiError as e:
        denial = error_response(e.status, e.code, e.message, e.headers)
        await _deny(websocket, denial, e.status, e.message)
        return
    except StoreUnavailable:
        message = "the task store cannot be reached; retry later"
        await _deny(websocket, error_response(503, "unavailable", message), 503, message)
        return
    await websocket.accept()
    idle_s = state.settings.events_keepalive_s
    code = _WS_NORMAL
    try:
        pump = _ws_pump(websocket, state.store, task_id, after, idle_s, deltas)
        if await first_of(_until_disconnect(websocket), pump):
            return  # the client left
    except Exception as error:
        log.warning("websocket events of task %s: %s", task_id, error)
        code = _WS_ERROR
    if websocket.application_state == WebSocketState.CONNECTED:
        with contextlib.suppress(RuntimeError, OSError):
            await websocket.close(code=code)
