"""The web console at ``/console``: static files shipped inside the package.

No build step and no CDN: the page, its script, styles and icon are files in
``ponder/console/`` (package data), served from memory by this process. A strict
Content-Security-Policy (``'self'`` only) makes the browser refuse anything from
elsewhere, so "everything it loads comes from the service" is enforced, not hoped for.

The console talks to the same API as every client (``/v1/tasks``, ``/v1/overview``, the
events stream read with ``fetch`` so that an API key travels in the ``Authorization``
header, never in a URL). ``/console/config.json`` tells it whether API keys are on (if
so it asks for one before its first call and keeps it in the tab's session storage) and
the service's names it works with: the task statuses, the terminal ones (from
:mod:`ponder.states`), the events that carry a status, a finished sample's statuses. The
script keeps no copy of its own.
"""

from __future__ import annotations

from functools import cache
from importlib import resources

from fastapi import APIRouter
from fastapi.responses import JSONResponse, RedirectResponse, Response

from ponder.api.deps import State
from ponder.api.errors import ApiError
from ponder.schemas import TaskCreate
from ponder.states import STATUS_EVENTS, TERMINAL
from ponder.types import EventName, Mode, SampleStatus, TaskStatus, TaskType

__all__ = ["router"]

router = APIRouter(tags=["console"], include_in_schema=False)

#: the files of the console and their media types
FILES = {
    "index.html": "text/html; charset=utf-8",
    "app.js": "text/javascript; charset=utf-8",
    "style.css": "text/css; charset=utf-8",
    "favicon.svg": "image/svg+xml",
}
_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}

#: the names the console's script works with (in the order it shows them)
NAMES = {
    "statuses": [s.value for s in TaskStatus],
    "terminal": [s.value for s in TaskStatus if s in TERMINAL],
    "status_events": list(STATUS_EVENTS),
    "events": {e.name: e.value for e in EventName},
    "modes": [m.value for m in Mode],
    "default_mode": TaskCreate.model_fields["mode"].default.value,
    "task_types": [t.value for t in TaskType],
    "default_task_type": TaskCreate.model_fields["task_type"].default.value,
    # a sample no longer queued or running: its text is final
    "finished_samples": [
        s.value for s in SampleStatus if s not in (SampleStatus.queued, SampleStatus.running)
    ],
}


@cache
def _read(name: str) -> bytes:
    return (resources.files("ponder") / "console" / name).read_bytes()


def _file(name: str) -> Response:
    if name not in FILES:
        raise ApiError(404, "not_found", f"the console has no file {name!r}")
    return Response(_read(name), media_type=FILES[name], headers=_HEADERS)


@router.get("/")
async def root() -> RedirectResponse:
    """The service's root opens the console."""
    return RedirectResponse("/console", status_code=307)


@router.get("/console/config.json")
async def console_config(state: State) -> JSONResponse:
    """What the page must know before its first API call: whether it needs a key, and the
    service's names (:data:`NAMES`)."""
    return JSONResponse({"auth": bool(state.settings.api_keys), **NAMES}, headers=_HEADERS)


@router.get("/console")
async def console_page() -> Response:
    """The console's page."""
    return _file("index.html")


@router.get("/console/")
async def console_slash() -> RedirectResponse:
    return RedirectResponse("/console", status_code=308)


@router.get("/console/{name}")
async def console_file(name: str) -> Response:
    """One of the console's static files."""
    return _file(name)
