"""RedisStore beyond the contract: key layout, TTLs, stream hygiene, unreachable Redis."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis

from ponder.config import Settings
from ponder.errors import StoreUnavailable
from ponder.store.base import Admission, ModelState
from ponder.store.redis import RedisStore, redacted
from ponder.types import TaskStatus
from tests.conftest import open_store

from .helpers import ALL, add, advance, make_task


@pytest.fixture
async def store(redis_settings: Settings) -> AsyncIterator[RedisStore]:
    async with open_store(redis_settings) as s:
        assert isinstance(s, RedisStore)
        yield s


async def test_start_and_close_are_idempotent(redis_settings: Settings) -> None:
    store = RedisStore(redis_settings)
    await store.start()
    await store.start()
    await add(store)
    assert await store.claim("w", ALL, 0) is not None
    await store.close()
    await store.close()


async def test_terminal_tasks_and_their_events_expire(
    store: RedisStore, raw: aioredis.Redis, key_prefix: str
) -> None:
    task = await add(store)
    task_key, events_key = f"{key_prefix}:task:{task.id}", f"{key_prefix}:ev:{task.id}"
    await advance(store, task, TaskStatus.running)
    assert await raw.ttl(task_key) == -1 and await raw.ttl(events_key) == -1
    await advance(store, task, TaskStatus.done)
    assert 0 < await raw.ttl(task_key) <= store._ttl
    assert 0 < await raw.ttl(events_key) <= store._ttl


async def test_ack_deletes_stream_entries(
    store: RedisStore, raw: aioredis.Redis, key_prefix: str
) -> None:
    for p in (0, 3, 3, 5):
        await add(store, p)
    queues = [f"{key_prefix}:q:{p}" for p in ALL]
    assert sum([await raw.xlen(q) for q in queues]) == 4
    while (claim := await store.claim("w", ALL, 0)) is not None:
        await store.ack(claim)
    assert sum([await raw.xlen(q) for q in queues]) == 0
    for q in queues:
        assert (await raw.xpending(q, "workers"))["pending"] == 0


async def test_release_requeues_at_the_end_of_its_level(store: RedisStore) -> None:
    first, second = await add(store), await add(store)
    claim = await store.claim("a", ALL, 0)
    assert claim is not None and claim.task_id == first.id
    await store.release(claim)
    order = [await store.claim("b", ALL, 0) for _ in range(2)]
    assert [c.task_id for c in order if c] == [second.id, first.id]


async def test_listing_drops_index_entries_of_expired_tasks(
    store: RedisStore, raw: aioredis.Redis, key_prefix: str
) -> None:
    kept, expired = await add(store, owner="k"), await add(store, owner="k")
    await raw.delete(f"{key_prefix}:task:{expired.id}")  # as if its TTL ran out
    tasks, cursor = await store.list_tasks("k", status=None, limit=10, cursor=None)
    assert [t.id for t in tasks] == [kept.id] and cursor is None
    assert await raw.zcard(f"{key_prefix}:tasks:k") == 1


async def test_blocking_calls_may_outlast_the_store_timeout(redis_settings: Settings) -> None:
    store = RedisStore(redis_settings.model_copy(update={"store_timeout_s": 0.2}))
    await store.start()
    try:
        started = time.monotonic()
        assert await store.claim("w", ALL, 600) is None
        task = await add(store)
        (first,) = await store.read_events(task.id, None)
        assert await store.read_events(task.id, first.id, block_ms=600) == []
        assert time.monotonic() - started >= 1.1
    finally:
        await store.close()


async def test_unreachable_redis_raises_store_unavailable(redis_settings: Settings) -> None:
    settings = redis_settings.model_copy(
        update={"redis_url": "redis://127.0.0.1:1/0", "store_timeout_s": 0.3}
    )
    store = RedisStore(settings)
    started = time.monotonic()
    try:
        assert not await store.ping()
        with pytest.raises(StoreUnavailable) as info:
            await store.start()
        assert info.value.__cause__ is not None
        with pytest.raises(StoreUnavailable):
            await store.get_task("1764412800123-api1-42")
        with pytest.raises(StoreUnavailable):
            await store.claim("w", ALL, 100)
    finally:
        await store.close()
    assert time.monotonic() - started < 3.0


async def test_a_redis_that_never_answers_fails_each_call_within_its_time_limit(
    redis_settings: Settings,
) -> None:
    """A server that takes connections and reads commands but never answers (a hung
    Redis): each call, pipelined or blocking, ends with StoreUnavailable once its time
    limit (store_timeout_s, plus the block time of a blocking read) is up."""
    requests = 0

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal requests
        while await reader.read(65536):
            requests += 1
        writer.close()

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    settings = redis_settings.model_copy(
        update={"redis_url": f"redis://127.0.0.1:{port}/0", "store_timeout_s": 0.3}
    )
    store = RedisStore(settings)
    calls = {
        "get_task": (lambda: store.get_task("1764412800123-api1-42"), 0.3),
        "get_tasks (a pipeline)": (lambda: store.get_tasks(["1764412800123-api1-42"] * 3), 0.3),
        "claim": (lambda: store.claim("w", ALL, 400), 0.3),  # its first try does not block
        "read_events blocking 400 ms": (
            lambda: store.read_events("1764412800123-api1-42", "0-0", block_ms=400),
            0.7,
        ),
    }
    try:
        async with server:
            for name, (call, limit_s) in calls.items():
                started = time.monotonic()
                with pytest.raises(StoreUnavailable, match="no answer within"):
                    async with asyncio.timeout(5):  # the test's own guard
                        await call()
                elapsed = time.monotonic() - started
                assert limit_s - 0.05 <= elapsed < limit_s + 0.5, (name, elapsed)
    finally:
        await store.close()
    assert requests >= len(calls)  # the commands reached the server


async def test_a_blocking_read_that_gets_several_levels_keeps_the_first_in_order(
    store: RedisStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    low, high = await add(store, 4), await add(store, 1)

    async def nothing_yet(**_: object) -> None:
        return None  # as if both entries arrived just after the non-blocking tries

    monkeypatch.setattr(store, "_claim", nothing_yet)
    claim = await store.claim("w", [1, 4], 1000)
    assert claim is not None and claim.task_id == high.id
    monkeypatch.undo()
    rest = await store.claim("w2", ALL, 0)  # the other entry was given back, not held
    assert rest is not None and rest.task_id == low.id


async def test_dead_consumers_leave_the_group_once_their_entries_moved(
    store: RedisStore, raw: aioredis.Redis, key_prefix: str
) -> None:
    await store.register_worker("alive", 30)
    await store.register_worker("taker", 30)
    for _ in range(3):
        await add(store, 2)
    for consumer in ("dead", "dead", "alive"):
        assert await store.claim(consumer, ALL, 0) is not None
    queue = f"{key_prefix}:q:2"

    async def consumers() -> dict[str, int]:
        return {c["name"]: c["pending"] for c in await raw.xinfo_consumers(queue, "workers")}

    assert await consumers() == {"dead": 2, "alive": 1}
    assert len(await store.reclaim("taker", 60, limit=1)) == 1
    assert await consumers() == {"dead": 1, "alive": 1, "taker": 1}  # one still to move
    assert len(await store.reclaim("taker", 60, limit=5)) == 1
    assert await consumers() == {"alive": 1, "taker": 2}  # the live one keeps its entry


async def test_a_deleted_stream_unblocks_a_claim_and_comes_back(
    store: RedisStore, raw: aioredis.Redis, key_prefix: str
) -> None:
    """DEL of a queue under a blocking XREADGROUP answers UNBLOCKED: the claim returns
    nothing, the groups are recreated, and the next claim works."""
    claimer = asyncio.create_task(store.claim("w", ALL, 10_000))
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(asyncio.shield(claimer), 0.3)
    await raw.delete(*(f"{key_prefix}:q:{p}" for p in ALL))
    assert await asyncio.wait_for(claimer, 5) is None
    for p in ALL:
        assert [g["name"] for g in await raw.xinfo_groups(f"{key_prefix}:q:{p}")] == ["workers"]
    task = await add(store)
    claim = await store.claim("w", ALL, 1000)
    assert claim is not None and claim.task_id == task.id


async def test_other_redis_errors_are_store_unavailable(
    store: RedisStore, raw: aioredis.Redis, key_prefix: str
) -> None:
    await raw.set(f"{key_prefix}:pending", "not a hash")  # WRONGTYPE on the next submit
    with pytest.raises(StoreUnavailable, match="WRONGTYPE"):
        await add(store)


def test_messages_hide_the_password() -> None:
    assert redacted("redis://:s3cret@host:6379/0") == "redis://:***@host:6379/0"
    assert redacted("redis://user:s3cret@host/0") == "redis://user:***@host/0"
    assert redacted("redis://host:6379/0") == "redis://host:6379/0"


# --- several models (#45) ---------------------------------------------------------------
async def test_the_default_models_queues_keep_their_keys(
    store: RedisStore, raw: aioredis.Redis, key_prefix: str
) -> None:
    """A running deployment's entries (``{p}:q:{level}``) are still the default model's
    after an upgrade; another model's queues have keys of their own."""
    old = await add(store, 3)
    big = await add(store, 3, model="big")
    assert await raw.xlen(f"{key_prefix}:q:3") == 1
    assert await raw.xlen(f"{key_prefix}:q:big:3") == 1
    assert await raw.hgetall(f"{key_prefix}:pending") == {
        "total": "2",
        "3": "2",
        "m:big:3": "1",
    }
    claim = await store.claim("w", ALL, 0)
    assert claim is not None and claim.task_id == old.id
    claim = await store.claim("w", ALL, 0, model="big")
    assert claim is not None and claim.task_id == big.id


async def test_a_models_consumer_group_is_made_at_its_first_read_and_again_when_lost(
    store: RedisStore, raw: aioredis.Redis, key_prefix: str
) -> None:
    queue = f"{key_prefix}:q:big:2"
    first = await add(store, 2, model="big")
    assert await raw.xinfo_groups(queue) == []  # the stream came with the entry
    claim = await store.claim("w", [2], 0, model="big")
    assert claim is not None and claim.task_id == first.id
    assert [g["name"] for g in await raw.xinfo_groups(queue)] == ["workers"]
    await raw.xgroup_destroy(queue, "workers")  # e.g. a restart without persistence
    second = await add(store, 2, model="big")
    claim = await store.claim("w", [2], 0, model="big")
    assert claim is not None and claim.task_id in {first.id, second.id}
    assert await store.reclaim("w", 60, model="new") == []  # no stream yet: made
    assert [g["name"] for g in await raw.xinfo_groups(f"{key_prefix}:q:new:0")] == ["workers"]


async def test_an_expired_task_expires_and_leaves_the_deadlines(
    store: RedisStore, raw: aioredis.Redis, key_prefix: str
) -> None:
    task = make_task()
    task.queue_timeout_s = 0.0
    task, _ = await store.create_task(task, Admission(max_pending=10))
    deadlines = f"{key_prefix}:deadlines"
    assert await raw.zscore(deadlines, task.id) == task.created_at.timestamp()
    assert await store.expire_due() == [task.id]
    await advance(store, task, TaskStatus.expired)
    assert await raw.zscore(deadlines, task.id) is None
    assert 0 < await raw.ttl(f"{key_prefix}:task:{task.id}") <= store._ttl
    assert await raw.hget(f"{key_prefix}:pending", "total") == "0"


async def test_expire_due_drops_entries_of_tasks_gone(
    store: RedisStore, raw: aioredis.Redis, key_prefix: str
) -> None:
    gone, kept = make_task(), make_task()
    for task in (gone, kept):
        task.queue_timeout_s = 0.0
        await store.create_task(task, Admission(max_pending=10))
    await raw.delete(f"{key_prefix}:task:{gone.id}")
    assert await store.expire_due(limit=1) == [kept.id]
    assert await raw.zrange(f"{key_prefix}:deadlines", 0, -1) == [kept.id]


async def test_model_states_of_workers_gone_are_dropped(
    store: RedisStore, raw: aioredis.Redis, key_prefix: str
) -> None:
    await store.register_worker("w", 30, [ModelState("big", "w", "loaded")])
    await store.register_worker("gone", 0, [ModelState("big", "gone", "loaded")])
    assert await store.served_models() == [ModelState("big", "w", "loaded")]
    assert await raw.hkeys(f"{key_prefix}:workers:models") == ["w"]
    await store.unregister_worker("w")
    assert await raw.exists(f"{key_prefix}:workers:models") == 0
