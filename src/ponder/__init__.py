"""ponder: asynchronous LLM inference as tasks, with answers made better while you wait."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ponder.version import __version__

__all__ = ["AsyncClient", "Client", "__version__"]

if TYPE_CHECKING:
    from ponder.client import AsyncClient, Client


def __getattr__(name: str) -> Any:
    # The SDK loads on first use: processes that never use it (workers) skip httpx.
    if name in ("AsyncClient", "Client"):
        from ponder import client

        return getattr(client, name)
    raise AttributeError(f"module 'ponder' has no attribute {name!r}")
