"""The FastAPI application: routes, error envelope, limits and the process lifecycle."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

from fastapi import FastAPI
from starlette.datastructures import State
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ponder.aio import cancel_and_wait
from ponder.api import (
    batches,
    console,
    events,
    files,
    openai_compat,
    ops,
    overview,
    responses,
    tasks,
)
from ponder.api.deps import AppState
from ponder.api.errors import install_error_handlers
from ponder.api.limits import BodySizeLimit
from ponder.config import Settings, load_settings
from ponder.errors import ConfigError
from ponder.ids import IdGenerator
from ponder.status import EngineStatus, Service
from ponder.store import create_store, start_store
from ponder.store.base import TaskStore
from ponder.version import __version__

__all__ = ["StartupErrors", "create_app"]

log = logging.getLogger("ponder.api")


class StartupErrors:
    """Keeps a configuration error at start-up (an unknown engine, a model that is not
    there) from becoming Starlette's traceback: the lifespan's failure message is left
    empty and the error kept on ``app.state.startup_error``, for ``ponder serve`` to print
    in one line. Every other error, and every other scope, passes through unchanged."""

    def __init__(self, app: ASGIApp, state: State) -> None:
        self.app = app
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "lifespan":
            await self.app(scope, receive, send)
            return

        async def quiet(message: Message) -> None:
            error = sys.exc_info()[1]  # Starlette reports from inside its except block
            if message["type"] == "lifespan.startup.failed" and isinstance(error, ConfigError):
                self.state.startup_error = error
                message = {**message, "message": ""}
            await send(message)

        await self.app(scope, receive, quiet)


def create_app(
    settings: Settings,
    *,
    store: TaskStore | None = None,
    services: Sequence[Service] = (),
    status: EngineStatus | None = None,
) -> FastAPI:
    """The HTTP API over ``store`` (by default the one the settings name).

    The lifespan starts the store, then ``services`` in order (``ponder serve`` passes its
    worker runtime), and stops them in reverse before the store closes. ``status``, where
    this process runs an engine, is what ``/readyz`` and the console's overview report of
    it (``app.state.engine_status``; None in an API-only process).
    """

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        used = create_store(settings) if store is None else store
        app.state.ponder = AppState(
            settings=settings, store=used, ids=IdGenerator(settings.node_id)
        )
        async with contextlib.AsyncExitStack() as stack:  # undone in reverse, each step
            stack.push_async_callback(used.close)
            # Serve at once even if the store is away: /healthz answers 200, /readyz and
            # the task routes 503 until it answers (worker loops wait for it themselves).
            if not await start_store(used, attempts=1):
                connecting = asyncio.create_task(start_store(used), name="store-start")
                stack.push_async_callback(cancel_and_wait, [connecting])
            for service in services:
                stack.push_async_callback(service.stop)  # also after a failed start
                await service.start()
            yield

    app = FastAPI(
        title="ponder",
        version=__version__,
        summary="Asynchronous LLM inference: submit a task, get an id, collect a better answer.",
        lifespan=lifespan,
        # FastAPI's OpenTelemetry hooks: ponder configures no provider (its metrics are
        # Prometheus', /metrics), and the per-request checks for one cost CPU on every call
        telemetry={"tracing": False, "metrics": False, "logs": False, "operation_spans": False},
    )
    app.state.engine_status = status
    install_error_handlers(app)
    app.add_middleware(
        BodySizeLimit,
        max_bytes=settings.max_body_bytes,
        # a file upload's limit is its own, plus the multipart framing
        path_limits={"/v1/files": settings.files_max_bytes + 65_536},
    )
    app.add_middleware(StartupErrors, state=app.state)
    for routes in (tasks, events, openai_compat, responses, files, batches, ops, overview, console):
        app.include_router(routes.router)
    return app


def create_app_from_environment() -> FastAPI:
    """The API of one of ``ponder api --processes N``'s processes (uvicorn imports this
    factory by name in each): settings from the environment, as the parent read them. A
    configured node id gets the process id appended, so ids stay unique across the
    processes (the default one already holds it)."""
    settings = load_settings()
    if "node_id" in settings.model_fields_set:
        settings = settings.model_copy(update={"node_id": f"{settings.node_id}.{os.getpid()}"})
    return create_app(settings)
