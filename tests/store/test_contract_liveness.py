"""The Liveness part of the contract (worker registrations, named leases), against both
stores (``store`` fixture)."""

from __future__ import annotations

import asyncio

from ponder.store import TaskStore


# --- liveness ---------------------------------------------------------------------------
async def test_live_workers_counts_registered_unexpired_workers(store: TaskStore) -> None:
    assert await store.live_workers() == 0
    await store.register_worker("w1", 30)
    await store.register_worker("w2", 30)
    await store.register_worker("w2", 30)  # a heartbeat, not a new worker
    await store.register_worker("gone", 0)  # expired at once
    assert await store.live_workers() == 2
    await store.unregister_worker("w1")
    assert await store.live_workers() == 1
    assert await store.ping()


# --- named leases -----------------------------------------------------------------------
async def test_leases(store: TaskStore) -> None:
    assert await store.acquire_lease("feeder", "a", 0.2)
    assert await store.acquire_lease("feeder", "a", 0.2)  # renewed by its holder
    assert not await store.acquire_lease("feeder", "b", 0.2)
    await store.release_lease("feeder", "b")  # not b's: nothing happens
    assert not await store.acquire_lease("feeder", "b", 0.2)
    await store.release_lease("feeder", "a")
    assert await store.acquire_lease("feeder", "b", 0.1)
    await asyncio.sleep(0.25)
    assert await store.acquire_lease("feeder", "a", 0.2)  # b's lease ran out
