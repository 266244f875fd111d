"""The store's lifecycle: start, close, ping (every backend has one)."""

from __future__ import annotations

from abc import abstractmethod
from typing import Protocol

__all__ = ["Lifecycle"]


class Lifecycle(Protocol):
    """Connect, disconnect, answer a ping, say what the store is."""

    def describe(self) -> str:
        """What the store is, for messages: ``Redis at redis://host:6379/0``."""
        return type(self).__name__

    @abstractmethod
    async def start(self) -> None:
        """Connect (and create schema / consumer groups). Idempotent."""

    @abstractmethod
    async def close(self) -> None:
        """Release connections. Idempotent."""

    @abstractmethod
    async def ping(self) -> bool:
        """True when the backend answers."""
