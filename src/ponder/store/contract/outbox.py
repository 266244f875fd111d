"""The webhook outbox: durable delivery rows, leased to one delivery loop at a time."""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sequence
from typing import Protocol

from ponder.store.deliveries import OutboxEntry
from ponder.store.records import HostRoom

__all__ = ["Outbox"]


class Outbox(Protocol):
    """Webhook deliveries waiting to be sent (rows: :mod:`ponder.store.deliveries`; sent
    by :mod:`ponder.webhooks`).

    An outbox entry is handed to one delivery loop at a time (:meth:`claim_deliveries`,
    a lease); it stays until :meth:`finish_delivery`, its schedule kept across restarts.
    A task's own deliveries are added by the task write that causes them
    (:meth:`~ponder.store.contract.tasks.TaskRecords.update_task`).
    """

    @abstractmethod
    async def enqueue_deliveries(self, entries: Sequence[OutboxEntry]) -> None:
        """Add ``entries``, due at once, and post a :attr:`Notice.outbox`. An id is added
        once: one added before (within ``task_ttl_s``) is left as it is, even if it was
        sent meanwhile. For deliveries no task write causes; a task's own are added by
        :meth:`~ponder.store.contract.tasks.TaskRecords.update_task`."""

    @abstractmethod
    async def claim_deliveries(
        self, consumer: str, limit: int, lease_s: float, room: HostRoom
    ) -> tuple[list[OutboxEntry], float | None]:
        """Take up to ``limit`` due entries, oldest due first, for ``lease_s`` seconds (then
        they are due again, for another loop, unless finished or rescheduled).

        ``room.busy`` is how many more attempts each busy host may get (the caller's own
        attempts in flight), ``room.per_host`` the room of any other host; a due entry of
        a host without room waits a second, letting other hosts by. Returns the entries
        and the seconds until the next entry is due (None: the outbox is empty).
        """

    @abstractmethod
    async def retry_delivery(self, consumer: str, entry: OutboxEntry, delay_s: float) -> bool:
        """Store ``entry`` (its attempt count) and make it due in ``delay_s`` seconds, if
        ``consumer`` still holds it; False when another loop has taken it over."""

    @abstractmethod
    async def finish_delivery(self, webhook_id: str) -> None:
        """Remove an entry for good (delivered, or given up)."""

    @abstractmethod
    async def outbox_depth(self) -> int:
        """Entries in the outbox (due, scheduled or being sent)."""
