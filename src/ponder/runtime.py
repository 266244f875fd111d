"""The worker side of a process: engine, worker loops (and, for the static baseline, the
batcher), started and stopped together. Used by ``ponder worker`` and ``ponder serve``
(which hands it to the API as a :class:`~ponder.status.Service` to start and stop and as
the :class:`~ponder.status.EngineStatus` that ``/readyz`` and the console report).

With ``PONDER_BATCHING=continuous`` (the default) the workers hand each sample straight
to the engine, which schedules rows per step. ``static`` puts the
:class:`~ponder.batcher.DynamicBatcher` in front of it: whole batches, each held until its
slowest row ends — kept as the baseline that benchmarks compare against.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from ponder.batcher import DynamicBatcher
from ponder.config import Settings
from ponder.engines import BaseEngine, create_engine
from ponder.enhance.mathverify import shutdown_pool
from ponder.errors import ConfigError
from ponder.openai.batch_feeder import BatchFeeder
from ponder.store.base import TaskStore
from ponder.webhooks import WebhookSender
from ponder.worker import SampleRunner, Worker

__all__ = ["WorkerRuntime"]

log = logging.getLogger("ponder.worker")


class WorkerRuntime:
    """Owns one engine (with the static batcher in front when configured) and ``workers``
    worker loops."""

    def __init__(self, settings: Settings, store: TaskStore, *, workers: int = 1) -> None:
        if workers < 1:
            raise ValueError(f"workers must be at least 1, got {workers}")
        self.settings = settings
        self.store = store
        self.engine = create_engine(settings)
        self.batcher: DynamicBatcher | None = None
        runner: SampleRunner = self.engine
        if settings.batching == "static":
            _check_batches_fit(self.engine, settings)
            self.batcher = DynamicBatcher.from_settings(self.engine, settings)
            runner = self.batcher
        self.webhooks = WebhookSender(store, settings)
        self.workers = [
            Worker(store, runner, settings, worker_id=f"{settings.node_id}-w{i}")
            for i in range(workers)
        ]
        self._loops: list[asyncio.Task[None]] = []
        # the Batch API's feeder and OpenAI-shaped webhooks (one process at a time: a lease)
        self.feeder = BatchFeeder(store, settings, holder=f"{settings.node_id}-f")
        self._feeder_loop: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self.engine.start()
        if self.batcher is not None:
            await self.batcher.start()
        await self.webhooks.start()  # the outbox's delivery loop of this process
        self._loops = [asyncio.create_task(w.run(), name=w.worker_id) for w in self.workers]
        self._feeder_loop = asyncio.create_task(self.feeder.run(), name="batch-feeder")
        log.info(
            "%d worker(s) running engine %r (%s), %s batching",
            len(self.workers),
            self.engine.name,
            self.engine.model_name,
            self.settings.batching,
        )

    def engine_down(self) -> str | None:
        return self.engine.health()

    def engine_figures(self) -> dict[str, Any]:
        return {"name": self.engine.name, "model": self.engine.model_name, **self.engine.describe()}

    def tasks_running(self) -> int:
        return sum(worker.in_flight for worker in self.workers)

    async def wait(self) -> None:
        """Until every worker loop has ended (after :meth:`stop` or a fatal error)."""
        await asyncio.gather(*self._loops)

    async def stop(self) -> None:
        """Stop claiming, let running tasks finish within the grace period, close."""
        for worker in self.workers:
            worker.stop()
        self.feeder.stop()
        loops = [*self._loops, *([self._feeder_loop] if self._feeder_loop else [])]
        results = await asyncio.gather(*loops, return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException) and not isinstance(result, asyncio.CancelledError):
                log.error("worker loop ended with an error", exc_info=result)
        try:
            await self.webhooks.close()
            if self.batcher is not None:
                await self.batcher.close()
            await self.engine.close()
        finally:
            # The math-verify pool's process ends with the workers that used it, not at
            # exit: a process that ends by a signal runs no atexit handler (uvicorn
            # re-raises SIGTERM after its graceful shutdown), and the pool's semaphores
            # would be left to the resource tracker, which warns of them as leaked.
            await asyncio.to_thread(shutdown_pool)


def _check_batches_fit(engine: BaseEngine, settings: Settings) -> None:
    """ConfigError when a static batcher's batches can hold more rows than the engine runs
    at once (an engine with no cap of its own, such as openai's server, takes any)."""
    rows = settings.batch_max_size * settings.batch_max_concurrent
    if engine.max_rows is not None and rows > engine.max_rows:
        raise ConfigError(
            f"static batching runs up to {rows} rows at once (PONDER_BATCH_MAX_SIZE "
            f"{settings.batch_max_size} x PONDER_BATCH_MAX_CONCURRENT "
            f"{settings.batch_max_concurrent}), more than the engine takes "
            f"(PONDER_ENGINE_MAX_ROWS {engine.max_rows}): raise PONDER_ENGINE_MAX_ROWS or "
            "lower the batch size"
        )
