"""Task ids: ``<unix-time-ms, 13 digits>-<node>-<seq>``.

Unique across processes without coordination: the node names the process (configured,
default host + pid) and ``seq`` is that process's counter.
"""

from __future__ import annotations

import itertools
import re
import threading
import time
from typing import NamedTuple

__all__ = ["IdGenerator", "ParsedId", "parse_task_id", "sort_key"]

_ID_RE = re.compile(r"^(\d{13})-([A-Za-z0-9_.]+)-(\d{1,18})$")
NODE_RE = re.compile(r"^[A-Za-z0-9_.]+$")


class ParsedId(NamedTuple):
    ms: int
    node: str
    seq: int


class IdGenerator:
    """Makes task ids for one process (thread-safe)."""

    def __init__(self, node: str) -> None:
        if not NODE_RE.match(node):
            raise ValueError(f"node id {node!r} must match [A-Za-z0-9_.]+")
        self.node = node
        self._counter = itertools.count(1)
        self._lock = threading.Lock()

    def new_id(self) -> str:
        with self._lock:
            seq = next(self._counter)
        return f"{time.time_ns() // 1_000_000:013d}-{self.node}-{seq}"


def parse_task_id(task_id: str) -> ParsedId | None:
    """Split an id into its parts; ``None`` when it is not a well-formed task id."""
    match = _ID_RE.match(task_id)
    if match is None:
        return None
    return ParsedId(int(match[1]), match[2], int(match[3]))


def sort_key(task_id: str) -> str:
    """A string that sorts like the ids' creation order (time, then seq, then node)."""
    parsed = parse_task_id(task_id)
    if parsed is None:
        raise ValueError(f"not a task id: {task_id!r}")
    return f"{parsed.ms:013d}:{parsed.seq:018d}:{parsed.node}"
