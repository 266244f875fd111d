"""The engines of one worker process, one per served model, loaded on demand.

Each served model has a :class:`ModelRunner`: the worker's
:class:`~ponder.worker.task_run.SampleRunner` for that model. A local model's engine starts
on the first row submitted to it (rows that come while it loads wait for the same start)
and stops once no row has been in flight for the model's ``keep_alive_s``
(:data:`~ponder.config.models.KEEP_LOADED`: never; such models, and the remote ``openai``
engine, start with the pool). At most ``max_loaded`` local models are loaded at once
(:class:`EnginePool`): a model that needs room unloads the least recently used idle one;
when every loaded model is busy, the least recently used one is *drained* (its new rows
wait for its next load, its running rows finish) and unloaded to make room, so models
take turns rather than one holding the room while it has work. A row waiting for its
model's engine ends when its request is cancelled (the task's deadline: the task run
cancels its rows then) with ``finish_reason="cancelled"``, as a row queued on an engine
does; a failed load fails the rows that waited for it (:class:`~ponder.errors.EngineError`)
and the next row tries again.

Everything here runs on the worker's event loop: the loads, unloads and idle timers are
tasks and timer handles of the pool, which :meth:`EnginePool.close` ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable, Coroutine
from typing import Any, Literal

from ponder import metrics
from ponder.config import Settings
from ponder.config.models import KEEP_LOADED, ModelSpec, engine_settings
from ponder.engines import BaseEngine, create_engine
from ponder.engines.base import SampleOutput, SampleRequest
from ponder.errors import ConfigError, EngineError

__all__ = ["EngineFactory", "EnginePool", "ModelRunner", "resident_mb"]

log = logging.getLogger("ponder.worker")

EngineFactory = Callable[[Settings], BaseEngine]
LoadState = Literal["unloaded", "loading", "loaded", "unloading"]


def resident_mb(engine: BaseEngine) -> float | None:
    """The resident memory of the engine's own process (an engine that runs in a process
    of its own: openvino), in MiB, from ``/proc/<pid>/status``; None where it has none or
    it cannot be read."""
    pid = getattr(engine, "process_pid", None)
    if not isinstance(pid, int):
        return None
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return round(int(line.split()[1]) / 1024, 1)  # kB
    except (OSError, ValueError, IndexError):
        return None
    return None


class ModelRunner:
    """One served model's engine, loaded on demand (a SampleRunner for its workers)."""

    def __init__(
        self,
        name: str,
        spec: ModelSpec,
        settings: Settings,
        pool: EnginePool,
        factory: EngineFactory,
    ) -> None:
        self.name = name
        self.spec = spec
        self._pool = pool
        self._settings = engine_settings(settings, spec)
        self._factory = factory
        #: the engine: the loaded one, else the one the next load starts (made now, so
        #: that a bad setting is known at the start)
        self.engine = self._new_engine()
        self._state: LoadState = "unloaded"
        #: set (and replaced) at each change of state: what a worker's registration waits on
        self._changed = asyncio.Event()
        #: the model's next engine, for the rows waiting for it (None: none waits)
        self._next: asyncio.Future[BaseEngine] | None = None
        #: rows waiting for ``_next``
        self._waiting = 0
        #: rows given the loaded engine (running on it, or about to)
        self.running = 0
        #: no new row is given the loaded engine: it unloads when its rows end (room for
        #: another model)
        self.draining = False
        self.last_used = time.monotonic()
        self.loads = 0
        #: tokens counted by the engines unloaded before this one
        self._tokens_before = 0
        self._idle_timer: asyncio.TimerHandle | None = None

    def _new_engine(self) -> BaseEngine:
        engine = self._factory(self._settings)
        engine.served_model = self.name
        return engine

    @property
    def state(self) -> LoadState:
        """unloaded, loading, loaded or unloading (its engine still holds its memory)."""
        return self._state

    @state.setter
    def state(self, state: LoadState) -> None:
        if state != self._state:
            self._state = state
            changed, self._changed = self._changed, asyncio.Event()
            changed.set()

    def changed(self) -> asyncio.Event:
        """An event set at the next change of :attr:`state`."""
        return self._changed

    @property
    def local(self) -> bool:
        return self.spec.local

    @property
    def keep_loaded(self) -> bool:
        """Started with the pool, never unloaded: a remote engine, or keep_alive_s -1."""
        return not self.local or self.spec.keep_alive_s == KEEP_LOADED

    @property
    def idle(self) -> bool:
        """Loaded with no row using or waiting for it."""
        return self.state == "loaded" and self.running == 0 and self._waiting == 0

    def load_state(self) -> Literal["loaded", "loading", "unloaded"]:
        """As a worker registration reports it (an engine being unloaded still holds its
        memory: loaded)."""
        return "loaded" if self.state == "unloading" else self.state

    def resident_mb(self) -> float | None:
        return resident_mb(self.engine) if self.state in ("loaded", "unloading") else None

    def health(self) -> str | None:
        """Why the loaded engine cannot run rows (None while it can, or is not loaded)."""
        return self.engine.health() if self.state == "loaded" else None

    def tokens(self) -> int | None:
        """Completion tokens its engines generated, counted per step (None: its engine
        does not count them, as the openai engine)."""
        tokens = self.engine.describe().get("tokens")
        return None if tokens is None else self._tokens_before + int(tokens)

    def figures(self) -> dict[str, Any]:
        """The model as the console shows it: its engine, load state and memory, and the
        loaded engine's live state (rows, counters)."""
        state = self.load_state()
        return {
            "model": self.name,
            "engine": self.engine.name,
            "engine_model": self.engine.model_name,
            "state": state,
            "resident_mb": self.resident_mb(),
            "keep_alive_s": self.spec.keep_alive_s,
            "loads": self.loads,
            "live": self.engine.describe() if state == "loaded" else None,
        }

    # --- rows -------------------------------------------------------------------------
    async def submit(self, request: SampleRequest) -> SampleOutput:
        """Run one row on the model's engine, loading it first when it is not loaded."""
        engine = await self._acquire(request)
        if engine is None:
            return SampleOutput(text="", finish_reason="cancelled")
        try:
            return await engine.submit(request)
        finally:
            self._release()

    async def _acquire(self, request: SampleRequest) -> BaseEngine | None:
        """The loaded engine, with a row's place on it held (None: the request was
        cancelled while it waited)."""
        cancelled: asyncio.Future[None] | None = None
        while True:
            if self.state == "loaded" and not self.draining:
                self._take()
                return self.engine
            if request.is_cancelled:
                return None
            if cancelled is None:
                cancelled = _cancel_future(request)
            engine = await self._wait_for_load(cancelled)
            if engine is not None:  # the load gave this row its place
                if not request.is_cancelled:
                    return engine
                self._release()
                return None

    async def _wait_for_load(self, cancelled: asyncio.Future[None]) -> BaseEngine | None:
        """Wait for the model's next engine; None when the request is cancelled first."""
        ready = self._next
        if ready is None:
            ready = self._next = asyncio.get_running_loop().create_future()
            ready.add_done_callback(_retrieve)
            if self.state == "unloaded":
                self._pool.want(self)
        self._waiting += 1
        try:
            await asyncio.wait((ready, cancelled), return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            if not ready.done():
                self._leave()
            elif not ready.cancelled() and ready.exception() is None:
                self._release()  # given a place on the engine, but cancelled before using it
            raise
        if not ready.done():
            self._leave()
            return None
        error = ready.exception()
        if error is not None:
            raise EngineError(f"model {self.name!r} could not be loaded: {error}") from error
        return ready.result()

    def _leave(self) -> None:
        """A row stops waiting for the next load (its request was cancelled); the last
        one to leave withdraws the load unless it has begun."""
        self._waiting -= 1
        if self._waiting == 0 and self.state != "loading" and self._next is not None:
            self._next.cancel()
            self._next = None
        self._pool.changed()

    def _take(self) -> None:
        self.running += 1
        self.last_used = time.monotonic()
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None

    def _release(self) -> None:
        self.running -= 1
        self.last_used = time.monotonic()
        if self.running == 0:
            self._became_free()

    def _became_free(self) -> None:
        """No row runs on the loaded engine: unload it when it drains, else time its
        keep-alive; the pool may want the room."""
        if self.state != "loaded" or self.running:
            return
        if self.draining:
            self._pool.unload(self, "room for another model")
            return
        if self._waiting == 0 and not self.keep_loaded and self._idle_timer is None:
            self._idle_timer = asyncio.get_running_loop().call_later(
                self.spec.keep_alive_s, self._idle_expired
            )
        self._pool.changed()

    def _idle_expired(self) -> None:
        self._idle_timer = None
        if self.idle:
            self._pool.unload(self, f"idle for {self.spec.keep_alive_s:g} s")

    # --- loading (run by the pool) ------------------------------------------------------
    async def load(self, *, eager: bool = False) -> None:
        """Start the engine; the rows waiting for it are given their places on it. A failed
        start fails them (``eager``: raises)."""
        self.state = "loading"
        started = time.monotonic()
        try:
            await self.engine.start()
        except Exception as e:
            log.error("model %s: its engine did not start: %s", self.name, e)
            await _quiet_close(self.engine)
            self.engine = self._new_engine()
            # the rows waiting now, including those that came during the start
            ready, self._next, self._waiting = self._next, None, 0
            self.state = "unloaded"
            if ready is not None and not ready.done():
                ready.set_exception(e)
            if eager:
                raise
            return
        self.loads += 1
        metrics.MODEL_LOADS.labels(model=self.name).inc()
        self.state, self.draining, self.last_used = "loaded", False, time.monotonic()
        metrics.MODEL_LOADED.labels(model=self.name).set(1)
        log.info(
            "model %s loaded (%s, %.1f s)", self.name, self.engine.name, time.monotonic() - started
        )
        ready, self._next = self._next, None  # the rows waiting now
        self.running += self._waiting  # their places, held before they wake
        self._waiting = 0
        if ready is not None and not ready.done():
            ready.set_result(self.engine)
        if self.running == 0:
            self._became_free()

    async def unload(self, why: str) -> None:
        """Stop the engine (no row runs on it); rows that came meanwhile wait for the next
        load."""
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None
        self.state = "unloading"
        log.info("model %s unloading: %s", self.name, why)
        try:
            await self.engine.close()
        finally:
            self._tokens_before += int(self.engine.describe().get("tokens", 0))
            self.engine = self._new_engine()
            self.state, self.draining = "unloaded", False
            metrics.MODEL_LOADED.labels(model=self.name).set(0)
            metrics.ENGINE_TOKENS_PER_S.labels(model=self.name).set(0)
            if self._next is not None:
                self._pool.want(self)

    async def close(self) -> None:
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None
        if self._next is not None and not self._next.done():
            self._next.set_exception(EngineError("the worker is stopping"))
        await self.engine.close()
        self.state = "unloaded"


class EnginePool:
    """The served models' runners, at most ``max_loaded`` local models loaded at once."""

    def __init__(
        self,
        settings: Settings,
        models: dict[str, ModelSpec],
        *,
        factory: EngineFactory = create_engine,
    ) -> None:
        self.max_loaded = settings.max_loaded_models
        self.runners = {
            name: ModelRunner(name, spec, settings, self, factory) for name, spec in models.items()
        }
        pinned = [r.name for r in self.runners.values() if r.local and r.keep_loaded]
        on_demand = [r.name for r in self.runners.values() if r.local and not r.keep_loaded]
        if len(pinned) > self.max_loaded or (on_demand and len(pinned) == self.max_loaded):
            raise ConfigError(
                f"models kept loaded (keep_alive_s -1): {', '.join(pinned)}; "
                f"PONDER_MAX_LOADED_MODELS={self.max_loaded} leaves no room"
                + (f" for {', '.join(on_demand)}" if on_demand else "")
                + ": raise PONDER_MAX_LOADED_MODELS or give them a keep_alive_s"
            )
        #: runners waiting for room to load, first come first served
        self._queue: deque[ModelRunner] = deque()
        self._jobs: set[asyncio.Task[None]] = set()
        self._closed = False

    async def start(self) -> None:
        """Start the engines kept loaded (a remote server's, and keep_alive_s -1)."""
        for runner in self.runners.values():  # each served model's series, from the start
            metrics.MODEL_LOADED.labels(model=runner.name).set(0)
            metrics.ENGINE_TOKENS_PER_S.labels(model=runner.name).set(0)
        for runner in self.runners.values():
            if runner.keep_loaded:
                await runner.load(eager=True)

    async def close(self) -> None:
        self._closed = True
        self._queue.clear()
        jobs = list(self._jobs)
        for job in jobs:
            job.cancel()
        await asyncio.gather(*jobs, return_exceptions=True)
        errors = await asyncio.gather(
            *(r.close() for r in self.runners.values()), return_exceptions=True
        )
        for runner, error in zip(self.runners.values(), errors, strict=True):
            if isinstance(error, Exception):
                log.error("model %s: closing its engine failed", runner.name, exc_info=error)

    def loaded(self) -> list[str]:
        """The models whose engines hold memory now (loaded, loading or unloading)."""
        return [r.name for r in self.runners.values() if r.state != "unloaded"]

    # --- room -------------------------------------------------------------------------
    def want(self, runner: ModelRunner) -> None:
        """``runner`` has rows waiting for its engine: load it when there is room."""
        if self._closed:
            return
        if runner not in self._queue:
            self._queue.append(runner)
        self.changed()

    def unload(self, runner: ModelRunner, why: str) -> None:
        runner.state = "unloading"  # now: the room is counted before the job runs
        self._spawn(runner.unload(why), f"unload-{runner.name}")

    def changed(self) -> None:
        """Something the room depends on changed: load the waiting models that fit, make
        room for the first that does not."""
        while self._queue:
            first = self._queue[0]
            if first.state != "unloaded" or first._next is None:  # loaded, or wanted no more
                self._queue.popleft()
                continue
            if not first.local or self._held() < self.max_loaded:
                self._queue.popleft()
                first.state = "loading"  # now: the room is counted before the job runs
                self._spawn(first.load(), f"load-{first.name}")
                continue
            self._make_room()
            return

    def _held(self) -> int:
        return sum(r.local and r.state != "unloaded" for r in self.runners.values())

    def _make_room(self) -> None:
        """Unload the least recently used idle model; when none is idle, drain the least
        recently used busy one (unless one drains or unloads already)."""
        movable = [r for r in self.runners.values() if r.local and not r.keep_loaded]
        if any(r.state == "unloading" or r.draining for r in movable):
            return  # room is being made
        idle = [r for r in movable if r.idle]
        if idle:
            self.unload(min(idle, key=lambda r: r.last_used), "room for another model")
            return
        busy = [r for r in movable if r.state == "loaded"]
        if busy:
            victim = min(busy, key=lambda r: r.last_used)
            victim.draining = True
            log.info("model %s drains: another model waits for room", victim.name)
            if victim.running == 0:
                self.unload(victim, "room for another model")

    def _spawn(self, job: Coroutine[Any, Any, None], name: str) -> None:
        task = asyncio.create_task(job, name=name)
        self._jobs.add(task)

        def done(t: asyncio.Task[None]) -> None:
            self._jobs.discard(t)
            if not t.cancelled() and t.exception() is not None:
                log.error("%s failed", name, exc_info=t.exception())
            if not self._closed:
                self.changed()

        task.add_done_callback(done)


def _cancel_future(request: SampleRequest) -> asyncio.Future[None]:
    """A future that completes when ``request`` is cancelled (from any thread)."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[None] = loop.create_future()

    def settle() -> None:
        if not future.done():
            future.set_result(None)

    request.on_cancel(lambda: loop.call_soon_threadsafe(settle))
    return future


def _retrieve(future: asyncio.Future[Any]) -> None:
    """Mark a load's error seen (no row may be left to read it)."""
    if not future.cancelled():
        future.exception()


async def _quiet_close(engine: BaseEngine) -> None:
    with contextlib.suppress(Exception):
        await engine.close()
