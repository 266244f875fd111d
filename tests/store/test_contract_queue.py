"""The WorkQueue part of the contract (claims, leases, reclaims, releases), against both
stores (``store`` fixture)."""

from __future__ import annotations

import asyncio
import time

import pytest

from ponder.store import Claim, TaskStore
from ponder.types import Task, TaskStatus

from .helpers import ALL, add, advance, let_time_pass, live


# --- queue ------------------------------------------------------------------------------
async def test_claim_follows_the_priority_order_given_and_fifo_within_a_level(
    store: TaskStore,
) -> None:
    order = [(await add(store, p)).id for p in (3, 1, 3, 1, 5, 0)]
    by_level = {3: [order[0], order[2]], 1: [order[1], order[3]], 5: [order[4]], 0: [order[5]]}
    claims = [await store.claim("w", [5, 1, 3, 0], 0) for _ in range(6)]
    assert [(c.task_id, c.priority) for c in claims if c] == [
        (by_level[5][0], 5),
        (by_level[1][0], 1),
        (by_level[1][1], 1),
        (by_level[3][0], 3),
        (by_level[3][1], 3),
        (by_level[0][0], 0),
    ]


async def test_claim_only_takes_the_levels_given(store: TaskStore) -> None:
    await add(store, 4)
    assert await store.claim("w", [0, 1], 0) is None
    assert await store.claim("w", [4], 0) is not None


async def test_claim_waits_block_ms_then_returns_none(store: TaskStore) -> None:
    started = time.monotonic()
    assert await store.claim("w", ALL, 300) is None
    assert 0.25 <= time.monotonic() - started < 2.0


async def test_claim_wakes_when_a_task_arrives(store: TaskStore) -> None:
    claimer = asyncio.create_task(store.claim("w", ALL, 10_000))
    with pytest.raises(TimeoutError):  # it is waiting, not returning early
        await asyncio.wait_for(asyncio.shield(claimer), 0.3)
    started = time.monotonic()
    task = await add(store, 2)
    claim = await asyncio.wait_for(claimer, 5)
    assert claim is not None and claim.task_id == task.id and claim.priority == 2
    assert time.monotonic() - started < 2.0


async def test_ack_removes_the_entry_for_good(store: TaskStore) -> None:
    await add(store)
    claim = await store.claim("w", ALL, 0)
    assert claim is not None
    await store.ack(claim)
    await store.release(claim)  # a late release must not bring it back
    assert await store.claim("w", ALL, 0) is None
    await let_time_pass(0.05)
    assert await store.reclaim("w2", 0.01) == []


async def test_a_claim_carries_the_record_it_read_or_none(store: TaskStore) -> None:
    task = await add(store, 2)
    await advance(store, task, TaskStatus.pending)  # a record of revision 1
    claim = await store.claim("w", ALL, 0)
    assert claim is not None and claim.task_id == task.id
    if claim.record is not None:  # optional in the contract; both stores read it here
        stored = Task.from_storage(claim.record)
        assert stored == await store.get_task(task.id) and stored.rev == 1
    assert claim == Claim(task.id, 2, claim.receipt)  # the record is not its identity


async def test_a_claim_woken_by_a_blocking_read_carries_a_record_its_write_checks(
    store: TaskStore,
) -> None:
    claimer = asyncio.create_task(store.claim("w", ALL, 10_000))
    with pytest.raises(TimeoutError):  # it is waiting in the blocking read
        await asyncio.wait_for(asyncio.shield(claimer), 0.3)
    task = await add(store, 2)
    claim = await asyncio.wait_for(claimer, 5)
    assert claim is not None and claim.task_id == task.id
    if claim.record is not None:  # the record the task was admitted with (Redis)
        admitted = Task.from_storage(claim.record)
        assert admitted == task
        cancelled = task.model_copy()
        cancelled.status = TaskStatus.cancelled
        assert await store.update_task(cancelled)  # a change while the claim is handed out
        admitted.status = TaskStatus.running
        assert not await store.update_task(admitted)  # the worker's write finds it
        assert (await store.get_task(task.id)).status == TaskStatus.cancelled  # type: ignore[union-attr]


async def test_a_write_with_ack_acks_the_entry_and_a_refused_one_does_not(
    store: TaskStore,
) -> None:
    await live(store, "a", "b")
    first, second = await add(store), await add(store)
    claims = {c.task_id: c for c in [await store.claim("a", ALL, 0) for _ in range(2)] if c}
    stale = first.model_copy()
    first.status = second.status = TaskStatus.done
    assert await store.update_task(first, [("result", {})], ack=claims[first.id])
    stale.status = TaskStatus.cancelled  # an old revision: nothing written, nothing acked
    assert not await store.update_task(stale, ack=claims[first.id])
    second.rev += 1
    assert not await store.update_task(second, ack=claims[second.id])
    await let_time_pass(0.4)
    reclaimed = await store.reclaim("b", 0.3)
    assert [c.task_id for c in reclaimed] == [second.id]  # only the refused write's entry
    assert (await store.get_task(first.id)).status == TaskStatus.done  # type: ignore[union-attr]


async def test_an_idle_lease_is_reclaimed_and_renew_prevents_it(store: TaskStore) -> None:
    await live(store, "a", "b", "c")
    task = await add(store, 1)
    claim = await store.claim("a", ALL, 0)
    assert claim is not None
    await let_time_pass(0.4)
    await store.renew("a", [claim])
    assert await store.reclaim("b", 0.3) == []  # renewed just now

    await let_time_pass(0.4)
    reclaimed = await store.reclaim("b", 0.3)
    assert reclaimed == [Claim(task.id, 1, claim.receipt)]
    assert await store.reclaim("c", 0.3) == []  # reclaiming renews the lease too

    await store.ack(reclaimed[0])
    await let_time_pass(0.4)
    assert await store.reclaim("c", 0.3) == []


async def test_renew_does_not_take_back_a_reclaimed_entry(store: TaskStore) -> None:
    await live(store, "a", "b", "c")
    await add(store)
    claim = await store.claim("a", ALL, 0)
    assert claim is not None
    await let_time_pass(0.4)
    assert len(await store.reclaim("b", 0.3)) == 1
    await let_time_pass(0.4)
    await store.renew("a", [claim])  # "a" lost it: this must not reset b's lease
    assert len(await store.reclaim("c", 0.3)) == 1


async def test_reclaim_respects_the_limit(store: TaskStore) -> None:
    await live(store, "a", "b")
    for p in (5, 0, 3):
        await add(store, p)
    for _ in range(3):
        assert await store.claim("a", ALL, 0) is not None
    await let_time_pass(0.1)
    first = await store.reclaim("b", 0.05, limit=2)
    assert [c.priority for c in first] == [0, 3]
    assert [c.priority for c in await store.reclaim("b", 0.05, limit=2)] == [5]


async def test_a_dead_workers_entries_are_taken_over_at_once(store: TaskStore) -> None:
    """No waiting for each entry's lease: a consumer whose registration has lapsed (or
    that never registered) is dead, and one call takes what the caller has room for."""
    await live(store, "b")
    await store.register_worker("a", 0.2)
    tasks = [await add(store, p) for p in (4, 0, 2, 2, 5)]
    claims = [await store.claim("a", ALL, 0) for _ in tasks]
    await store.claim("ghost", ALL, 0)  # nothing left; "ghost" never registered
    assert await store.reclaim("b", 60, limit=5) == []  # "a" is alive: leases are young
    await let_time_pass(0.3)  # a's registration lapses (a SIGKILLed worker stops renewing it)
    taken = await store.reclaim("b", 60, limit=3)
    assert [c.priority for c in taken] == [0, 2, 2]  # most urgent first, up to the limit
    rest = await store.reclaim("b", 60, limit=10)
    assert sorted(c.task_id for c in taken + rest) == sorted(c.task_id for c in claims if c)
    assert await store.reclaim("b", 60, limit=10) == []
    assert all(t.status is TaskStatus.pending for t in tasks)  # the queue alone changed


async def test_reclaim_never_takes_over_the_callers_own_entries_at_once(store: TaskStore) -> None:
    await add(store)
    mine = await store.claim("b", ALL, 0)  # "b" is not registered: dead to others only
    assert mine is not None
    assert await store.reclaim("b", 60) == []
    await live(store, "c")
    assert [c.receipt for c in await store.reclaim("c", 60)] == [mine.receipt]


async def test_release_makes_the_entry_claimable_at_once(store: TaskStore) -> None:
    task = await add(store)
    claim = await store.claim("a", ALL, 0)
    assert claim is not None
    assert await store.claim("b", ALL, 0) is None
    await store.release(claim)
    again = await store.claim("b", ALL, 0)
    assert again is not None and again.task_id == task.id


async def test_release_wakes_a_waiting_claim(store: TaskStore) -> None:
    await add(store)
    claim = await store.claim("a", ALL, 0)
    assert claim is not None
    waiter = asyncio.create_task(store.claim("b", ALL, 10_000))
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(asyncio.shield(waiter), 0.3)
    await store.release(claim)
    again = await asyncio.wait_for(waiter, 5)
    assert again is not None and again.task_id == claim.task_id
