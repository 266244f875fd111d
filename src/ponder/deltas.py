"""``delta`` events: the text of a task's running samples, as the engine writes it.

The engine hands each new piece of a running row's text to ``SampleRequest.on_text`` (on
the event loop). A :class:`DeltaPublisher` — one per task run — buffers the pieces and
appends them to the task's event log with :meth:`~ponder.store.base.EventLog.append_events`
(the record is not rewritten; it is still saved at sample boundaries):

- **Coalesced.** A flush writes one ``delta`` event per sample that has new text, all in one
  store call, and flushes come at most once per ``interval_s`` (``PONDER_DELTA_INTERVAL_MS``,
  100 ms): at most 10 events per second per sample, whatever the engine's token rate.
  The first piece after a quiet interval is written at once, so the time to the first delta
  is the engine's time to its first token plus one store write.
- **Placed.** An event is ``{"index": i, "offset": n, "text": "…"}``: ``text`` goes at
  character ``n`` of sample ``i``'s text, so ``text_so_far[:n] + text`` is the sample's
  text so far, also for a client that joined late, and a sample rerun from the start
  (after a worker crash) begins again at offset 0.
- **Ordered before the sample's end.** When a sample ends (:meth:`DeltaPublisher.end`),
  its unwritten text is dropped (its ``sample`` event carries the whole, final text: stop
  strings cut), and the worker awaits :meth:`DeltaPublisher.idle` before each write of the
  task record: a delta write in progress lands first, so no delta of a sample follows its
  ``sample`` event. (Ending a sample does not wait: a sample's end must not be delayed,
  or samples that end together would seem to end apart to the vote.)
- **Best effort.** A failed write (store outage) is logged and dropped: the next delta
  places its text by offset, and the ``sample`` event has it all.
- **Written while followed.** Deltas are for clients that follow the task's text (the
  event stream with deltas: SSE, WebSocket, the OpenAI-compatible streaming APIs); most
  tasks are polled or called back, and nobody reads their deltas. A client that starts
  following a task posts a :attr:`~ponder.store.records.Notice.follow` notice (again every
  :data:`FOLLOW_RENEW_S` while it follows); a worker writes the deltas of a task it heard
  of in the last :data:`FOLLOW_TTL_S`. Until then the publisher keeps the pieces, and its
  first write after the notice places each running sample's whole text so far at offset
  0: a follower misses nothing, and a task nobody follows costs no delta writes. (A
  remote engine streams a row's text only when the task was followed at the row's start,
  ``SampleRequest.stream``: a client that starts following during such a row gets its
  text with its ``sample`` event, and the deltas of the rows that start after.)

The write in progress is the publisher's one background task; its owner, the task run,
awaits it with :meth:`~DeltaPublisher.idle` before each record write and when the run ends.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from ponder.errors import RecoverableError
from ponder.store.base import EventLog
from ponder.types import EventName

__all__ = ["FOLLOW_RENEW_S", "FOLLOW_TTL_S", "DeltaPublisher"]

log = logging.getLogger("ponder.worker")

#: how often a client that follows a task's text posts its follow notice again
FOLLOW_RENEW_S = 10.0
#: how long a follow notice keeps a task followed (a few renewals: one may be late)
FOLLOW_TTL_S = 3 * FOLLOW_RENEW_S


class DeltaPublisher:
    """Coalesces the running samples' text of one task into ``delta`` events.

    ``followed``: whether a client follows the task's text yet; until :meth:`follow`, the
    pieces are kept and nothing is written.
    """

    def __init__(
        self, store: EventLog, task_id: str, interval_s: float, *, followed: bool = True
    ) -> None:
        self.store = store
        self.task_id = task_id
        self.interval_s = interval_s
        self.followed = followed
        #: unwritten pieces of each running sample
        self._pending: dict[int, list[str]] = {}
        #: characters of each running sample already handed to a write
        self._offsets: dict[int, int] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._writing: asyncio.Task[None] | None = None
        self._last_flush = -float("inf")
        #: events handed to the store (tests and benchmarks read it)
        self.events_written = 0

    def writer(self, index: int) -> Callable[[str], None] | None:
        """The ``on_text`` callback of sample ``index`` (None when deltas are off).

        Calling it again for the same index (a sample started anew) starts at offset 0.
        """
        if self.interval_s <= 0:
            return None
        self._pending[index] = []
        self._offsets[index] = 0

        def on_text(piece: str) -> None:
            pending = self._pending.get(index)
            if pending is not None and piece:
                pending.append(piece)
                self._schedule()

        return on_text

    def follow(self) -> None:
        """A client follows the task's text: write what is kept, and from now on."""
        if not self.followed:
            self.followed = True
            if any(self._pending.values()):
                self._schedule()

    def end(self, index: int) -> None:
        """Sample ``index`` ended: drop its unwritten text; later pieces are ignored."""
        self._pending.pop(index, None)
        self._offsets.pop(index, None)
        if not any(self._pending.values()) and self._timer is not None:
            self._timer.cancel()
            self._timer = None

    async def idle(self) -> None:
        """Wait until no delta write is in progress (call before writing the record)."""
        if self._writing is not None:
            # shielded: a caller cancelled while waiting leaves the write to end by itself
            # (it is one store call, bounded by the store's timeout)
            await asyncio.shield(self._writing)

    # --- flushing ---------------------------------------------------------------------
    def _schedule(self) -> None:
        if not self.followed:
            return  # kept for a follower (:meth:`follow`)
        if self._timer is not None or self._writing is not None:
            return  # a flush is due already (the end of a write schedules the next)
        loop = asyncio.get_running_loop()
        delay_s = self._last_flush + self.interval_s - loop.time()
        if delay_s <= 0:
            self._flush()
        else:
            self._timer = loop.call_later(delay_s, self._flush)

    def _flush(self) -> None:
        self._timer = None
        events: list[tuple[str, dict[str, Any]]] = []
        for index, pieces in self._pending.items():
            if not pieces:
                continue
            text = "".join(pieces)
            pieces.clear()
            events.append(
                (EventName.delta, {"index": index, "offset": self._offsets[index], "text": text})
            )
            self._offsets[index] += len(text)
        if not events:
            return
        self._last_flush = asyncio.get_running_loop().time()
        self._writing = asyncio.create_task(self._write(events), name=f"deltas-{self.task_id}")
        self._writing.add_done_callback(self._written)

    async def _write(self, events: list[tuple[str, dict[str, Any]]]) -> None:
        try:
            if await self.store.append_events(self.task_id, events):
                self.events_written += len(events)
        except RecoverableError as e:
            log.debug("task %s: %d delta event(s) dropped: %s", self.task_id, len(events), e)

    def _written(self, task: asyncio.Task[None]) -> None:
        self._writing = None
        if not task.cancelled() and task.exception() is not None:
            log.error("task %s: delta write failed", self.task_id, exc_info=task.exception())
        if any(self._pending.values()):
            self._schedule()
