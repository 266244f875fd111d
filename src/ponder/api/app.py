"""The FastAPI application: routes, error envelope, limits and the process lifecycle."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from ponder import __version__
from ponder.aio import cancel_and_wait
from ponder.api import events, openai_compat, ops, tasks
from ponder.api.deps import AppState
from ponder.api.errors import install_error_handlers
from ponder.api.limits import BodySizeLimit
from ponder.config import Settings
from ponder.ids import IdGenerator
from ponder.store import create_store, start_store

__all__ = ["create_app"]

log = logging.getLogger("ponder.api")


def create_app(settings: Settings, *, workers: int = 0) -> FastAPI:
    """The HTTP API; with ``workers`` > 0 the process also runs that many worker loops
    over one engine and batcher (the all-in-one ``ponder serve``)."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        store = create_store(settings)
        app.state.ponder = AppState(
            settings=settings, store=store, ids=IdGenerator(settings.node_id)
        )
        # Serve at once even if the store is away: /healthz answers 200, /readyz and the
        # task routes 503 until it answers (worker loops wait for it by themselves).
        connecting: asyncio.Task[bool] | None = None
        if not await start_store(store, attempts=1):
            connecting = asyncio.create_task(start_store(store), name="store-start")
        runtime = None
        if workers:
            from ponder.runtime import WorkerRuntime  # the API-only process needs no engine

            runtime = WorkerRuntime(settings, store, workers=workers)
        try:
            if runtime is not None:
                await runtime.start()
            yield
        finally:
            if connecting is not None:
                await cancel_and_wait([connecting])
            if runtime is not None:
                await runtime.stop()
            await store.close()

    app = FastAPI(
        title="ponder",
        version=__version__,
        summary="Asynchronous LLM inference: submit a task, get an id, collect a better answer.",
        lifespan=lifespan,
    )
    install_error_handlers(app)
    app.add_middleware(BodySizeLimit, max_bytes=settings.max_body_bytes)
    app.include_router(tasks.router)
    app.include_router(events.router)
    app.include_router(openai_compat.router)
    app.include_router(ops.router)
    return app
