"""Who is alive: worker registrations and named leases (one holder at a time)."""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sequence
from typing import Protocol

from ponder.store.records import ModelState

__all__ = ["Liveness"]


class Liveness(Protocol):
    """Workers mark themselves alive for a time; a named lease has one holder at a time.

    A queue consumer that is not a live worker loses its entries at once
    (:meth:`~ponder.store.contract.tasks.WorkQueue.reclaim`); a lease elects one process
    for a job that must run once (the batch feeder).
    """

    # --- workers ----------------------------------------------------------------------
    @abstractmethod
    async def register_worker(
        self, worker_id: str, ttl_s: float, models: Sequence[ModelState] = ()
    ) -> None:
        """Mark the worker alive for ``ttl_s`` seconds, serving ``models`` (their states
        as of now: what :meth:`served_models` reports)."""

    @abstractmethod
    async def served_models(self) -> list[ModelState]:
        """The model states of every live worker (a model served by two workers appears
        twice)."""

    @abstractmethod
    async def unregister_worker(self, worker_id: str) -> None:
        """Mark the worker gone (clean shutdown)."""

    @abstractmethod
    async def live_workers(self) -> int:
        """How many workers are alive."""

    # --- named leases -----------------------------------------------------------------
    @abstractmethod
    async def acquire_lease(self, name: str, holder: str, ttl_s: float) -> bool:
        """Take the named lease for ``ttl_s`` seconds, or renew it if ``holder`` has it;
        False while another holder's lease runs."""

    @abstractmethod
    async def release_lease(self, name: str, holder: str) -> None:
        """Give the lease up if ``holder`` has it."""
