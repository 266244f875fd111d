"""What the HTTP API is given by the process that composes it (``ponder serve``): the
services it starts and stops with itself, and the status of this process's engine that
``/readyz`` and the console's overview report. The API knows neither workers nor engines;
:class:`ponder.runtime.WorkerRuntime` is both a :class:`Service` and an
:class:`EngineStatus`."""

from __future__ import annotations

from typing import Any, Protocol

__all__ = ["EngineStatus", "Service"]


class Service(Protocol):
    """Something that runs beside the API: started after the store, stopped before it
    closes."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


class EngineStatus(Protocol):
    """This process's engine and workers, as they say of themselves."""

    def engine_down(self) -> str | None:
        """Why no engine can run rows now (its process died and is restarting); None
        while one can."""
        ...

    def engine_figures(self) -> dict[str, Any]:
        """The engine's name, model and live state: rows running, prefilling and queued,
        counters (``tokens`` where it counts them per step), its process."""
        ...

    def tasks_running(self) -> int:
        """Tasks the workers of this process are running."""
        ...
