"""The worker side of a process: the served models' engines, worker loops (and, for the
static baseline, the batcher), started and stopped together. Used by ``ponder worker``
and ``ponder serve`` (which hands it to the API as a :class:`~ponder.status.Service` to
start and stop and as the :class:`~ponder.status.EngineStatus` that ``/readyz`` and the
console report).

A process serves a set of models (``settings.models``, or the ones ``ponder worker
--models`` names): per model ``workers`` worker loops claiming that model's queues, over the
model's :class:`~ponder.engines.pool.ModelRunner`, which loads its engine on demand
(:mod:`ponder.engines.pool`).

With ``PONDER_BATCHING=continuous`` (the default) the workers hand each sample straight
to the engine, which schedules rows per step. ``static`` puts the
:class:`~ponder.batcher.DynamicBatcher` in front of it: whole batches, each held until its
slowest row ends — kept as the baseline that benchmarks compare against, for one model.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

from ponder.batcher import DynamicBatcher
from ponder.config import Settings
from ponder.config.models import DEFAULT_MODEL, KEEP_LOADED, ModelSpec
from ponder.engines import BaseEngine, create_engine
from ponder.engines.pool import EngineFactory, EnginePool, ModelRunner
from ponder.enhance.mathverify import shutdown_pool
from ponder.errors import ConfigError
from ponder.openai.batch_feeder import BatchFeeder
from ponder.store.base import TaskStore
from ponder.webhooks import WebhookSender
from ponder.worker import SampleRunner, Worker
from ponder.worker.expiry import ExpirySweeper

__all__ = ["WorkerRuntime", "served_models", "worker_id"]

log = logging.getLogger("ponder.worker")


def served_models(settings: Settings, names: Sequence[str] | None = None) -> dict[str, ModelSpec]:
    """The models a process serves: ``names`` (``ponder worker --models``), or every
    configured model; ConfigError naming the configured ones for a name that is not."""
    configured = settings.models
    if not names:
        return dict(configured)
    unknown = [name for name in names if name not in configured]
    if unknown:
        raise ConfigError(
            f"--models: no model named {', '.join(repr(n) for n in unknown)}; the "
            f"configured models are {', '.join(configured)}"
            + ("" if settings.models_file else " (no PONDER_MODELS_FILE)")
        )
    return {name: configured[name] for name in dict.fromkeys(names)}


def worker_id(settings: Settings, model: str, index: int) -> str:
    """``{node}-w{i}`` for the default model without a models file (as before there were
    models), ``{node}-{model}-w{i}`` for any other."""
    if model == DEFAULT_MODEL:
        return f"{settings.node_id}-w{index}"
    return f"{settings.node_id}-{model}-w{index}"


class WorkerRuntime:
    """Owns the served models' engines (an :class:`~ponder.engines.pool.EnginePool`; with
    the static batcher in front of the one model's engine when configured) and
    ``workers`` worker loops per model."""

    def __init__(
        self,
        settings: Settings,
        store: TaskStore,
        *,
        workers: int = 1,
        models: Sequence[str] | None = None,
        factory: EngineFactory = create_engine,
    ) -> None:
        if workers < 1:
            raise ValueError(f"workers must be at least 1, got {workers}")
        self.settings = settings
        self.store = store
        served = served_models(settings, models)
        self.batcher: DynamicBatcher | None = None
        if settings.batching == "static":
            if len(served) > 1:
                raise ConfigError(
                    f"static batching (PONDER_BATCHING=static) serves one model, not "
                    f"{len(served)} ({', '.join(served)}): name one with `ponder worker "
                    "--models`, or use PONDER_BATCHING=continuous"
                )
            # the batcher holds the engine: it stays loaded
            served = {
                n: m.model_copy(update={"keep_alive_s": KEEP_LOADED}) for n, m in served.items()
            }
        self.pool = EnginePool(settings, served, factory=factory)
        runners: dict[str, SampleRunner] = dict(self.pool.runners)
        if settings.batching == "static":
            name, runner = next(iter(self.pool.runners.items()))
            _check_batches_fit(runner.engine, settings)
            self.batcher = DynamicBatcher.from_settings(runner.engine, settings)
            runners[name] = self.batcher
        self.webhooks = WebhookSender(store, settings)
        self.workers = [
            Worker(
                store,
                runners[name],
                settings,
                worker_id=worker_id(settings, name, i),
                model=name,
                loads=runner,
            )
            for name, runner in self.pool.runners.items()
            for i in range(workers)
        ]
        self._loops: list[asyncio.Task[None]] = []
        # the Batch API's feeder and OpenAI-shaped webhooks (one process at a time: a lease)
        self.feeder = BatchFeeder(store, settings, holder=f"{settings.node_id}-f")
        self._feeder_loop: asyncio.Task[None] | None = None
        # queue deadlines: every model's pending tasks past their queue_timeout_s end expired
        self.expiry = ExpirySweeper(store)

    @property
    def runners(self) -> dict[str, ModelRunner]:
        """The served models' runners, by name."""
        return self.pool.runners

    @property
    def engine(self) -> BaseEngine:
        """The first served model's engine (loaded, or the one its next load starts)."""
        return next(iter(self.pool.runners.values())).engine

    async def start(self) -> None:
        await self.pool.start()  # the models kept loaded (the default one without a file)
        if self.batcher is not None:
            await self.batcher.start()
        await self.webhooks.start()  # the outbox's delivery loop of this process
        self._loops = [asyncio.create_task(w.run(), name=w.worker_id) for w in self.workers]
        self._feeder_loop = asyncio.create_task(self.feeder.run(), name="batch-feeder")
        await self.expiry.start()
        for runner in self.pool.runners.values():
            log.info(
                "model %s: %d worker(s), engine %r (%s), %s, %s batching",
                runner.name,
                len(self.workers) // len(self.pool.runners),
                runner.engine.name,
                runner.engine.model_name,
                "loaded" if runner.state == "loaded" else "loads on its first task",
                self.settings.batching,
            )

    def engine_down(self) -> str | None:
        """Why no served model can run rows: each one's engine is down (an unloaded model
        is not down: it loads on its next task). One model: its engine's reason."""
        runners = list(self.pool.runners.values())
        reasons = [(r.name, why) for r in runners if (why := r.health()) is not None]
        if len(reasons) < len(runners):
            return None
        if len(reasons) == 1:
            return reasons[0][1]
        return "; ".join(f"model {name}: {why}" for name, why in reasons)

    def engine_figures(self) -> dict[str, Any]:
        """The first served model's engine as before (name, model, live state), and
        ``models``: each served model's engine, load state and resident memory."""
        runners = list(self.pool.runners.values())
        first = runners[0].engine
        figures: dict[str, Any] = {"name": first.name, "model": first.model_name}
        figures.update(first.describe())
        counted = [r.tokens() for r in runners]
        if any(t is not None for t in counted):
            figures["tokens"] = sum(t or 0 for t in counted)
        figures["models"] = [r.figures() for r in runners]
        figures["max_loaded_models"] = self.pool.max_loaded
        return figures

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
        await self.expiry.stop()
        loops = [*self._loops, *([self._feeder_loop] if self._feeder_loop else [])]
        results = await asyncio.gather(*loops, return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException) and not isinstance(result, asyncio.CancelledError):
                log.error("worker loop ended with an error", exc_info=result)
        try:
            await self.webhooks.close()
            if self.batcher is not None:
                await self.batcher.close()
            await self.pool.close()
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
