"""Files of the OpenAI-compatible Files API: batch input files and batch output files.

A file's record (OpenAI's ``file`` object) is a store object of kind ``file``; its content
is a store blob, or a file in ``PONDER_FILES_DIR`` when that is set (large files: the
directory must be shared by every ponder process). Both expire after
``PONDER_FILES_TTL_S``; files in the directory whose record is gone are removed by
:meth:`FileStore.sweep`, which the batch feeder runs.

Contents are text (JSON Lines, UTF-8): the Batch API reads and writes nothing else.
"""

from __future__ import annotations

import asyncio
import os
import re
import time
from pathlib import Path
from typing import Any

from ponder.config import Settings
from ponder.ids import sort_key
from ponder.store.base import ObjectStore, StoredObject

__all__ = ["KIND", "FileStore", "file_id_of"]

KIND = "file"
_SAFE_ID = re.compile(r"^file-[A-Za-z0-9_.-]+$")


def file_id_of(raw_id: str, suffix: str = "") -> str:
    """The file id made from a task-style id (and a suffix for derived files)."""
    return f"file-{raw_id}{suffix}"


class FileStore:
    """Create, read and delete files (records in the store; contents in the store or in
    the configured directory)."""

    def __init__(self, store: ObjectStore, settings: Settings) -> None:
        self.store = store
        self.ttl_s = settings.files_ttl_s
        self.dir = Path(settings.files_dir).expanduser() if settings.files_dir else None

    async def create(
        self,
        *,
        file_id: str,
        raw_id: str,
        owner: str,
        filename: str,
        purpose: str,
        content: str,
        extra: dict[str, Any] | None = None,
    ) -> StoredObject:
        """Store a file (written again under the same id: its content is replaced)."""
        if not _SAFE_ID.match(file_id):
            raise ValueError(f"not a file id: {file_id!r}")
        now = int(time.time())
        data = {
            "id": file_id,
            "object": "file",
            "bytes": len(content.encode()),
            "created_at": now,
            "filename": filename,
            "purpose": purpose,
            "status": "processed",
            "status_details": None,
            "expires_at": now + self.ttl_s,
            **(extra or {}),
        }
        obj = StoredObject(KIND, file_id, owner, sort_key(raw_id), data)
        await self._write(file_id, content)
        if not await self.store.create_object(obj, ttl_s=self.ttl_s):
            stored = await self.store.get_object(KIND, file_id)
            if stored is None or not await self.store.update_object(
                StoredObject(KIND, file_id, owner, stored.sort_key, data, stored.rev),
                ttl_s=self.ttl_s,
            ):
                raise RuntimeError(f"file {file_id} changed while it was written")
        return obj

    async def get(self, file_id: str, owner: str) -> StoredObject | None:
        """The owner's file (None: unknown, expired, or another key's)."""
        obj = await self.store.get_object(KIND, file_id)
        return obj if obj is not None and obj.owner == owner else None

    async def content(self, file_id: str) -> str | None:
        if self.dir is None:
            return await self.store.get_blob(f"{KIND}:{file_id}")
        path = self.dir / file_id
        try:
            return await asyncio.to_thread(path.read_text, encoding="utf-8")
        except FileNotFoundError:
            return None

    async def delete(self, file_id: str) -> bool:
        deleted = await self.store.delete_object(KIND, file_id)
        if self.dir is None:
            await self.store.delete_blob(f"{KIND}:{file_id}")
        else:
            await asyncio.to_thread((self.dir / file_id).unlink, missing_ok=True)
        return deleted

    async def sweep(self) -> int:
        """Remove contents in the directory whose record is gone; how many."""
        if self.dir is None:
            return 0
        names = await asyncio.to_thread(_listing, self.dir)
        removed = 0
        for name in names:
            if await self.store.get_object(KIND, name) is None:
                await asyncio.to_thread((self.dir / name).unlink, missing_ok=True)
                removed += 1
        return removed

    async def _write(self, file_id: str, content: str) -> None:
        if self.dir is None:
            await self.store.put_blob(f"{KIND}:{file_id}", content, ttl_s=self.ttl_s)
        else:
            await asyncio.to_thread(_write_atomically, self.dir, file_id, content)


def _write_atomically(directory: Path, name: str, content: str) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    partial = directory / f".{name}.{os.getpid()}.partial"
    partial.write_text(content, encoding="utf-8")
    partial.replace(directory / name)


def _listing(directory: Path) -> list[str]:
    if not directory.is_dir():
        return []
    return [p.name for p in directory.iterdir() if _SAFE_ID.match(p.name) and p.is_file()]
