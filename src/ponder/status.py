"""What the HTTP API is given by the process that composes it (``ponder serve``): the
services it starts and stops with itself, and the status of this process's engines (one
per served model) that ``/readyz`` and the console's overview report. The API knows
neither workers nor engines; :class:`ponder.runtime.WorkerRuntime` is both a
:class:`Service` and an :class:`EngineStatus`."""

from __future__ import annotations

from typing import Any, Protocol

__all__ = ["EngineStatus", "Service"]


class Service(Protocol):
    """Something that runs beside the API: started after the store, stopped before it
    closes."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


class EngineStatus(Protocol):
    """This process's engines and workers, as they say of themselves."""

    def engine_down(self) -> str | None:
        """Why no engine can run rows now (each served model's engine process died and is
        restarting; a model not loaded is not down: it loads on its next task); None
        while one can."""
        ...

    def engine_figures(self) -> dict[str, Any]:
        """The first served model's engine: its name, model and live state (rows running,
        prefilling and queued, counters, its process); ``tokens``: completion tokens
        counted per step by every served model's engines (absent where none counts them);
        ``models``: each served model (``model``, ``engine``, ``engine_model``, ``state``
        loaded/loading/unloaded, ``resident_mb``, ``keep_alive_s``, ``loads``, ``live``:
        its engine's live state while loaded, else None); ``max_loaded_models``."""
        ...

    def tasks_running(self) -> int:
        """Tasks the workers of this process are running."""
        ...
