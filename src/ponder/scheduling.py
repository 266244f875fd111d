"""Weighted fair share across priority levels (0 is the most urgent).

Used three times: by the worker to decide which priority queue to claim from next, by the
engines' :class:`AdmissionQueue` to admit waiting rows when a slot frees, and by the
static batcher to fill a batch when more requests wait than fit. All rest on one smooth
weighted round-robin (the nginx algorithm): every slot, each candidate level earns its
quota in credit, the richest level wins the slot and pays the total quota of the
candidates. Over a cycle of ``sum(quotas)`` slots with every level busy, level *i* wins
exactly ``quotas[i]`` slots, interleaved rather than in runs, so a flood of urgent work
cannot starve the least urgent level: it still wins one slot in every cycle.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Mapping, Sequence
from typing import Generic, Protocol, TypeVar

from ponder.errors import EngineBusy

__all__ = ["AdmissionQueue", "Queued", "WeightedFairPicker"]


class WeightedFairPicker:
    """A stateful weighted round-robin over levels ``0 .. len(quotas) - 1``.

    ``quotas[i]`` is level *i*'s share weight (a positive integer). The picker keeps one
    credit per level between calls, so shares converge to the quotas across calls, not
    just inside one call. Not thread-safe: one owner (an event loop, or a lock) per picker.
    """

    def __init__(self, quotas: Sequence[int]) -> None:
        quotas = list(quotas)
        if not quotas:
            raise ValueError("quotas must name at least one priority level, e.g. 4,3,2,2,1,1")
        for level, quota in enumerate(quotas):
            if isinstance(quota, bool) or not isinstance(quota, int) or quota < 1:
                raise ValueError(
                    f"quota of priority {level} must be a positive integer, got {quota!r}"
                )
        self._quotas: tuple[int, ...] = tuple(quotas)
        self._total = sum(self._quotas)
        self._credit: list[int] = [0] * len(self._quotas)

    @property
    def quotas(self) -> tuple[int, ...]:
        return self._quotas

    @property
    def levels(self) -> int:
        """How many priority levels there are."""
        return len(self._quotas)

    def order(self) -> list[int]:
        """Every level once, in the order to try next; advances the rotation by one slot.

        The first level is this slot's winner of the weighted round-robin over all levels:
        across ``sum(quotas)`` consecutive calls, level *i* comes first ``quotas[i]``
        times. The others follow by credit (the level due soonest first), then by level,
        so a caller that finds the first level empty falls through to the next one due.
        """
        first = self._win(range(self.levels))
        rest = sorted(
            (level for level in range(self.levels) if level != first),
            key=lambda level: (-self._credit[level], level),
        )
        return [first, *rest]

    def pick(self, available: Mapping[int, int], k: int) -> list[int]:
        """How many to take from each level: ``result[i]`` for level *i*.

        ``available[i]`` is how many wait at level *i* (missing levels have none). Takes
        ``min(k, total available)`` in all, never more than a level has. When everything
        fits (``total <= k``) everyone is taken and the rotation does not advance;
        otherwise each of the ``k`` slots goes to the weighted round-robin winner among
        the levels that still have requests, so an idle level banks no credit and a busy
        one gets at least its share. Raises ValueError for an unknown level, a negative
        count or a negative ``k``.
        """
        if k < 0:
            raise ValueError(f"k must be non-negative, got {k}")
        left = [0] * self.levels
        for level, count in available.items():
            if not 0 <= level < self.levels:
                raise ValueError(f"unknown priority level {level}; levels are 0..{self.levels - 1}")
            if count < 0:
                raise ValueError(f"available count of priority {level} is negative: {count}")
            left[level] = count
        if sum(left) <= k:
            return left
        taken = [0] * self.levels
        for _ in range(k):
            level = self._win([lv for lv in range(self.levels) if left[lv] > 0])
            taken[level] += 1
            left[level] -= 1
        return taken

    def _win(self, candidates: Sequence[int] | range) -> int:
        """One slot of smooth weighted round-robin among ``candidates`` (non-empty)."""
        total = 0
        best = -1
        for level in candidates:
            self._credit[level] += self._quotas[level]
            total += self._quotas[level]
            if best < 0 or self._credit[level] > self._credit[best]:
                best = level
        self._credit[best] -= total
        # Candidate sets change between slots; clamping keeps a level that was absent for
        # long from returning with an unbounded debt or an unbounded burst.
        for level in candidates:
            self._credit[level] = max(-self._total, min(self._total, self._credit[level]))
        return best


class Queued(Protocol):
    """What :class:`AdmissionQueue` needs of an item."""

    priority: int
    #: when it was queued (the queue's clock)
    arrival: float


_Q = TypeVar("_Q", bound=Queued)


class AdmissionQueue(Generic[_Q]):
    """Items waiting for an engine slot, one FIFO per priority, taken by weighted fair share.

    Thread-safe: an event loop puts and discards while an engine thread takes. ``put``
    raises :class:`~ponder.errors.EngineBusy` past ``max_size`` items.
    """

    def __init__(self, quotas: Sequence[int], max_size: int) -> None:
        if isinstance(max_size, bool) or not isinstance(max_size, int) or max_size < 1:
            raise ValueError(f"max_size must be a positive integer, got {max_size!r}")
        self._picker = WeightedFairPicker(quotas)
        self._levels: list[dict[_Q, None]] = [{} for _ in range(self._picker.levels)]
        self._max_size = max_size
        self._size = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return self._size

    def put(self, item: _Q) -> None:
        """Queue ``item`` behind the others of its priority."""
        if not 0 <= item.priority < self._picker.levels:
            raise ValueError(f"priority must be 0..{self._picker.levels - 1}, got {item.priority}")
        with self._lock:
            if self._size >= self._max_size:
                raise EngineBusy(
                    f"the engine's admission queue is full ({self._size} rows waiting, "
                    f"PONDER_ENGINE_MAX_QUEUE={self._max_size}); back off and retry"
                )
            self._levels[item.priority][item] = None
            self._size += 1

    def requeue(self, item: _Q) -> None:
        """Put ``item`` back at the head of its priority (it was taken before); the size
        limit does not apply: the item was accepted once."""
        with self._lock:
            level = self._levels[item.priority]
            self._levels[item.priority] = {item: None, **level}
            self._size += 1

    def discard(self, item: _Q) -> bool:
        """Remove ``item`` if it still waits; whether it did."""
        with self._lock:
            level = self._levels[item.priority]
            if item not in level:
                return False
            del level[item]
            self._size -= 1
            return True

    def take(self, k: int) -> list[_Q]:
        """Up to ``k`` items by weighted fair share: most urgent level first, oldest first."""
        with self._lock:
            counts = self._picker.pick({p: len(lv) for p, lv in enumerate(self._levels)}, k)
            taken: list[_Q] = []
            for level, count in zip(self._levels, counts, strict=True):
                for item in list(itertools.islice(level, count)):
                    del level[item]
                    taken.append(item)
            self._size -= len(taken)
            return taken

    def drain(self) -> list[_Q]:
        """Every waiting item, removed."""
        with self._lock:
            items = [item for level in self._levels for item in level]
            for level in self._levels:
                level.clear()
            self._size = 0
            return items

    def heads(self) -> list[tuple[int, float]]:
        """``(priority, arrival)`` of the head of each non-empty priority."""
        with self._lock:
            return [(p, next(iter(lv)).arrival) for p, lv in enumerate(self._levels) if lv]

    def oldest_arrival(self) -> float | None:
        """When the longest-waiting item arrived (None when empty)."""
        return min((arrival for _, arrival in self.heads()), default=None)

    def depths(self) -> list[int]:
        """How many wait at each priority."""
        with self._lock:
            return [len(level) for level in self._levels]
