"""The worker side of a process: engine, batcher and worker loops, started and stopped
together. Used by ``ponder worker`` and by the all-in-one ``ponder serve``."""

from __future__ import annotations

import asyncio
import logging

from ponder.batcher import DynamicBatcher
from ponder.config import Settings
from ponder.engines import create_engine
from ponder.store.base import TaskStore
from ponder.webhooks import WebhookSender
from ponder.worker import Worker

__all__ = ["WorkerRuntime"]

log = logging.getLogger("ponder.worker")


class WorkerRuntime:
    """Owns one engine, one batcher in front of it and ``workers`` worker loops."""

    def __init__(self, settings: Settings, store: TaskStore, *, workers: int = 1) -> None:
        if workers < 1:
            raise ValueError(f"workers must be at least 1, got {workers}")
        self.settings = settings
        self.store = store
        self.engine = create_engine(settings)
        self.batcher = DynamicBatcher.from_settings(self.engine, settings)
        self.webhooks = WebhookSender(store, settings)
        self.workers = [
            Worker(store, self.batcher, settings, worker_id=f"{settings.node_id}-w{i}")
            for i in range(workers)
        ]
        self._loops: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        await self.engine.start()
        await self.batcher.start()
        await self.webhooks.start()  # the outbox's delivery loop of this process
        self._loops = [asyncio.create_task(w.run(), name=w.worker_id) for w in self.workers]
        log.info(
            "%d worker(s) running engine %r (%s)",
            len(self.workers),
            self.engine.name,
            self.engine.model_name,
        )

    async def wait(self) -> None:
        """Until every worker loop has ended (after :meth:`stop` or a fatal error)."""
        await asyncio.gather(*self._loops)

    async def stop(self) -> None:
        """Stop claiming, let running tasks finish within the grace period, close."""
        for worker in self.workers:
            worker.stop()
        results = await asyncio.gather(*self._loops, return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException) and not isinstance(result, asyncio.CancelledError):
                log.error("worker loop ended with an error", exc_info=result)
        await self.webhooks.close()
        await self.batcher.close()
        await self.engine.close()
