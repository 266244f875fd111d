"""The FastAPI application: routes, error envelope, limits and the process lifecycle."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from ponder import __version__
from ponder.api import batches, events, files, openai_compat, ops, responses, tasks
from ponder.api.deps import AppState
from ponder.api.errors import install_error_handlers
from ponder.api.limits import BodySizeLimit
from ponder.config import Settings
from ponder.ids import IdGenerator
from ponder.store import create_store

__all__ = ["create_app"]

log = logging.getLogger("ponder.api")


def create_app(settings: Settings, *, workers: int = 0) -> FastAPI:
    """The HTTP API; with ``workers`` > 0 the process also runs that many worker loops
    over one engine (the all-in-one ``ponder serve``); ``app.state.runtime`` holds it."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        store = create_store(settings)
        await store.start()
        app.state.ponder = AppState(
            settings=settings, store=store, ids=IdGenerator(settings.node_id)
        )
        runtime = None
        if workers:
            from ponder.runtime import WorkerRuntime  # the API-only process needs no engine

            runtime = WorkerRuntime(settings, store, workers=workers)
        app.state.runtime = runtime  # None in an API-only process
        try:
            if runtime is not None:
                await runtime.start()
            yield
        finally:
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
    app.add_middleware(
        BodySizeLimit,
        max_bytes=settings.max_body_bytes,
        # a file upload's limit is its own, plus the multipart framing
        path_limits={"/v1/files": settings.files_max_bytes + 65_536},
    )
    app.include_router(tasks.router)
    app.include_router(events.router)
    app.include_router(openai_compat.router)
    app.include_router(responses.router)
    app.include_router(files.router)
    app.include_router(batches.router)
    app.include_router(ops.router)
    return app
