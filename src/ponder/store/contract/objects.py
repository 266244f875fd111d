"""The store's block for the OpenAI-compatible APIs: objects, blobs and parts.

(used by api/files.py, api/batches.py, api/responses.py, batch_feeder.py)
"""

from __future__ import annotations

from abc import abstractmethod
from typing import Protocol

from ponder.store.records import StoredObject

__all__ = ["ObjectStore"]


class ObjectStore(Protocol):
    """Records of the OpenAI-compatible APIs (files, batches, responses) and their texts.

    Every object, blob and part has an expiry of its own; an expired one is gone for
    every method at once.
    """

    # --- objects ----------------------------------------------------------------------
    @abstractmethod
    async def create_object(self, obj: StoredObject, *, ttl_s: float) -> bool:
        """Store a new object that expires after ``ttl_s``; False (writing nothing) when
        one of that kind and id exists."""

    @abstractmethod
    async def get_object(self, kind: str, obj_id: str) -> StoredObject | None:
        """The object, or None if unknown or expired."""

    @abstractmethod
    async def update_object(self, obj: StoredObject, *, ttl_s: float | None = None) -> bool:
        """Write ``obj`` if the stored revision is still ``obj.rev`` (then bump it).

        ``ttl_s`` given: the object now expires that long from now (else it keeps its
        expiry). False (writing nothing) when it changed since it was read, or is gone.
        """

    @abstractmethod
    async def delete_object(self, kind: str, obj_id: str) -> bool:
        """Remove the object; False if there was none."""

    @abstractmethod
    async def list_objects(
        self, kind: str, owner: str, *, after: str | None, limit: int
    ) -> tuple[list[StoredObject], bool]:
        """The owner's objects of ``kind``, newest first, starting after the object with
        id ``after``; and whether more follow. ValueError for an unknown ``after``."""

    @abstractmethod
    async def active_objects(self, kind: str) -> list[str]:
        """Ids of the live objects of ``kind`` stored with ``active=True``, oldest first."""

    # --- blobs and parts --------------------------------------------------------------
    @abstractmethod
    async def put_blob(self, key: str, data: str, *, ttl_s: float) -> None:
        """Store a text (a file's content) under ``key`` for ``ttl_s`` seconds."""

    @abstractmethod
    async def get_blob(self, key: str) -> str | None:
        """The text stored under ``key``, or None."""

    @abstractmethod
    async def delete_blob(self, key: str) -> None:
        """Remove the text under ``key`` (nothing if none)."""

    @abstractmethod
    async def put_part(self, key: str, index: int, data: str, *, ttl_s: float) -> None:
        """Set part ``index`` of the collection ``key`` (written again: replaced); each
        part is kept at least ``ttl_s`` after it was written."""

    @abstractmethod
    async def get_parts(self, key: str) -> dict[int, str]:
        """Every part of the collection ``key``."""

    @abstractmethod
    async def delete_parts(self, key: str) -> None:
        """Remove the collection ``key``."""
