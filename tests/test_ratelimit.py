"""Per-caller rate limits: the token bucket alone, in Redis, and on the HTTP API."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx
import pytest
import redis.asyncio as aioredis

from ponder.api.deps import key_digest
from ponder.config import Settings
from ponder.ratelimit import (
    MemoryRateLimiter,
    RedisRateLimiter,
    create_rate_limiter,
    retry_after_s,
)
from ponder.store.redis import RedisStore
from ponder.store.sqlite import SqliteStore
from tests.conftest import LiveServer, make_settings

pytestmark = pytest.mark.timeout(60)


# --- the bucket -----------------------------------------------------------------------


def test_memory_bucket_burst_then_rate() -> None:
    limiter = MemoryRateLimiter(rate=2.0, burst=3)
    assert [limiter.take_at("a", 100.0) for _ in range(3)] == [0.0, 0.0, 0.0]
    assert limiter.take_at("a", 100.0) == pytest.approx(0.5)  # one token every 0.5 s
    assert limiter.take_at("a", 100.0) == pytest.approx(0.5)  # a refusal takes nothing
    assert limiter.take_at("b", 100.0) == 0.0  # callers do not share a bucket
    assert limiter.take_at("a", 100.5) == 0.0
    assert limiter.take_at("a", 100.5) == pytest.approx(0.5)
    assert limiter.take_at("a", 110.0) == 0.0  # refilled, but never above the burst
    assert limiter.take_at("a", 110.0) == 0.0
    assert limiter.take_at("a", 110.0) == 0.0
    assert limiter.take_at("a", 110.0) > 0


def test_memory_buckets_are_bounded() -> None:
    limiter = MemoryRateLimiter(rate=1.0, burst=2, max_buckets=100)
    for i in range(1000):
        limiter.take_at(f"caller{i}", float(i) / 1000)
    assert len(limiter) <= 100
    # full buckets go first: a caller seen long ago (refilled) is dropped before an active one
    limiter = MemoryRateLimiter(rate=1.0, burst=2, max_buckets=2)
    limiter.take_at("old", 0.0)
    limiter.take_at("busy", 10.0)
    limiter.take_at("busy", 10.0)
    limiter.take_at("new", 10.0)  # over the bound: "old" is full again, so it goes
    assert limiter.take_at("busy", 10.0) > 0  # still empty: it was kept


@pytest.mark.parametrize(("wait", "header"), [(0.001, 1), (0.5, 1), (1.0, 1), (1.01, 2), (7.2, 8)])
def test_retry_after_rounds_up_to_whole_seconds(wait: float, header: int) -> None:
    assert retry_after_s(wait) == header


def test_limiter_follows_settings(tmp_path: object, redis_settings: Settings) -> None:
    sqlite = SqliteStore(make_settings(sqlite_path=f"{tmp_path}/x.db"))
    assert create_rate_limiter(make_settings(), sqlite) is None  # off by default
    memory = create_rate_limiter(make_settings(rate_limit_per_s=2.5), sqlite)
    assert isinstance(memory, MemoryRateLimiter)
    assert (memory.rate, memory.burst) == (2.5, 5)  # burst 0 means twice the rate
    shared = create_rate_limiter(
        redis_settings.model_copy(update={"rate_limit_per_s": 10, "rate_limit_burst": 3}),
        RedisStore(redis_settings),
    )
    assert isinstance(shared, RedisRateLimiter)
    assert (shared.rate, shared.burst) == (10, 3)


# --- in Redis -------------------------------------------------------------------------


@pytest.fixture
async def redis_store(redis_settings: Settings) -> AsyncIterator[RedisStore]:
    store = RedisStore(redis_settings)
    await store.start()
    try:
        yield store
    finally:
        await store.close()


async def test_redis_bucket(redis_store: RedisStore, key_prefix: str) -> None:
    limiter = RedisRateLimiter(redis_store.client, key_prefix, rate=1.0, burst=3, timeout_s=2.0)
    assert [await limiter.take("alice") for _ in range(3)] == [0.0, 0.0, 0.0]
    wait = await limiter.take("alice")
    assert 0 < wait <= 1.0
    assert await limiter.take("bob") == 0.0
    raw = redis_store.client
    key = f"{key_prefix}:rl:alice"
    assert limiter.key("alice") == key
    assert 0 < await raw.pttl(key) <= 4000  # gone once the bucket would be full again
    # refill on the server's clock: move the last update 2 s back
    ts = float(await raw.hget(key, "ts"))
    await raw.hset(key, "ts", f"{ts - 2:.6f}")
    assert await limiter.take("alice") == 0.0
    assert await limiter.take("alice") == 0.0
    assert await limiter.take("alice") > 0


async def test_redis_bucket_is_atomic_across_clients(
    redis_store: RedisStore, redis_url: str, key_prefix: str
) -> None:
    """Two API processes (two connection pools) share one bucket; no token is spent twice."""
    other = aioredis.Redis.from_url(redis_url, decode_responses=True)
    try:
        limiters = [
            RedisRateLimiter(client, key_prefix, rate=0.01, burst=10, timeout_s=2.0)
            for client in (redis_store.client, other)
        ]
        waits = await asyncio.gather(*(limiters[i % 2].take("k") for i in range(60)))
    finally:
        await other.aclose()
    assert sum(w == 0 for w in waits) == 10


# --- on the API (both stores) ---------------------------------------------------------


def assert_rate_limited(response: httpx.Response) -> None:
    assert response.status_code == 429, response.text
    assert response.json()["error"]["code"] == "rate_limited"
    assert response.json()["error"]["message"]
    assert int(response.headers["retry-after"]) >= 1


async def test_api_limits_each_key(settings: Settings) -> None:
    keys = {"alice": "pk_alice", "bob": "pk_bob"}
    limited = settings.model_copy(
        update={
            "api_keys": [key_digest(k) for k in keys.values()],
            "rate_limit_per_s": 0.05,  # one token per 20 s: nothing refills during the test
            "rate_limit_burst": 3,
        }
    )
    async with LiveServer(limited, workers=0) as live:
        alice, bob = (
            httpx.AsyncClient(base_url=live.url, headers={"Authorization": f"Bearer {key}"})
            for key in keys.values()
        )
        anon = httpx.AsyncClient(base_url=live.url)
        async with alice, bob, anon:
            first = await alice.post("/v1/tasks", json={"prompt": "x"})
            assert first.status_code == 202
            assert (await alice.get(f"/v1/tasks/{first.json()['id']}")).status_code == 200
            assert (await alice.get("/v1/tasks")).status_code == 200
            # every /v1 route takes from the same bucket
            assert_rate_limited(await alice.get("/v1/tasks"))
            assert_rate_limited(await alice.post("/v1/tasks", json={"prompt": "y"}))
            assert_rate_limited(await alice.delete(f"/v1/tasks/{first.json()['id']}"))
            assert_rate_limited(await alice.get(f"/v1/tasks/{first.json()['id']}/events"))
            response = await alice.get("/v1/tasks")
            assert_rate_limited(response)
            assert int(response.headers["retry-after"]) <= 20
            # the limit is per key; operations are not limited; a refused submit stored nothing
            listing = await bob.get("/v1/tasks")
            assert listing.status_code == 200 and listing.json()["data"] == []
            for _ in range(5):
                assert (await anon.get("/healthz")).status_code == 200
            # without a valid key the answer is 401, not a token of someone's bucket
            assert (await anon.get("/v1/tasks")).status_code == 401


async def test_api_without_auth_limits_by_client_address(settings: Settings) -> None:
    limited = settings.model_copy(update={"rate_limit_per_s": 0.05, "rate_limit_burst": 2})
    async with LiveServer(limited, workers=0) as live, httpx.AsyncClient(base_url=live.url) as c:
        assert (await c.get("/v1/tasks")).status_code == 200
        assert (await c.post("/v1/tasks", json={"prompt": "x"})).status_code == 202
        assert_rate_limited(await c.get("/v1/tasks"))
        assert (await c.get("/readyz")).status_code in (200, 503)  # not limited


async def test_api_without_limit_is_unlimited(settings: Settings) -> None:
    async with LiveServer(settings, workers=0) as live, httpx.AsyncClient(base_url=live.url) as c:
        codes = {(await c.get("/v1/tasks")).status_code for _ in range(50)}
    assert codes == {200}
