"""The HTTP API (FastAPI). It never touches the model: it validates, admits, stores."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ponder.api.app import create_app

__all__ = ["create_app"]


def __getattr__(name: str) -> Any:
    # Imported on first use: the SDK reads the request schemas (ponder.api.schemas)
    # without loading the app, its stores and FastAPI.
    if name == "create_app":
        from ponder.api.app import create_app

        return create_app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
