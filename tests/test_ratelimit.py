"""Per-caller rate limits: the token bucket alone, in Redis, and on the HTTP API."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable

import httpx
import pytest
import redis.asyncio as aioredis

from ponder.api.deps import key_digest
from ponder.config import Settings
from ponder.ratelimit import RateLimiter, create_rate_limiter, retry_after_s
from ponder.store import TaskStore
from ponder.store.sqlite import SqliteStore
from ponder.store.sqlite.ratelimits import MemoryBuckets
from tests.conftest import LiveServer, make_settings, open_store

pytestmark = pytest.mark.timeout(60)


# --- the bucket -----------------------------------------------------------------------


def test_memory_bucket_burst_then_rate() -> None:
    buckets = MemoryBuckets()

    def take(caller: str, now: float) -> float:
        return buckets.take_at(caller, now, 2.0, 3)

    assert [take("a", 100.0) for _ in range(3)] == [0.0, 0.0, 0.0]
    assert take("a", 100.0) == pytest.approx(0.5)  # one token every 0.5 s
    assert take("a", 100.0) == pytest.approx(0.5)  # a refusal takes nothing
    assert take("b", 100.0) == 0.0  # callers do not share a bucket
    assert take("a", 100.5) == 0.0
    assert take("a", 100.5) == pytest.approx(0.5)
    assert take("a", 110.0) == 0.0  # refilled, but never above the burst
    assert take("a", 110.0) == 0.0
    assert take("a", 110.0) == 0.0
    assert take("a", 110.0) > 0


def test_memory_buckets_are_bounded() -> None:
    buckets = MemoryBuckets(max_buckets=100)
    for i in range(1000):
        buckets.take_at(f"caller{i}", float(i) / 1000, 1.0, 2)
    assert len(buckets) <= 100
    # full buckets go first: a caller seen long ago (refilled) is dropped before an active one
    buckets = MemoryBuckets(max_buckets=2)
    buckets.take_at("old", 0.0, 1.0, 2)
    buckets.take_at("busy", 10.0, 1.0, 2)
    buckets.take_at("busy", 10.0, 1.0, 2)
    buckets.take_at("new", 10.0, 1.0, 2)  # over the bound: "old" is full again, so it goes
    assert buckets.take_at("busy", 10.0, 1.0, 2) > 0  # still empty: it was kept


@pytest.mark.parametrize(("wait", "header"), [(0.001, 1), (0.5, 1), (1.0, 1), (1.01, 2), (7.2, 8)])
def test_retry_after_rounds_up_to_whole_seconds(wait: float, header: int) -> None:
    assert retry_after_s(wait) == header


def test_limiter_follows_settings(tmp_path: object) -> None:
    sqlite = SqliteStore(make_settings(sqlite_path=f"{tmp_path}/x.db"))
    assert create_rate_limiter(make_settings(), sqlite) is None  # off by default
    limiter = create_rate_limiter(make_settings(rate_limit_per_s=2.5), sqlite)
    assert isinstance(limiter, RateLimiter)
    assert (limiter.rate, limiter.burst) == (2.5, 5)  # burst 0 means twice the rate
    limiter = create_rate_limiter(make_settings(rate_limit_per_s=10, rate_limit_burst=3), sqlite)
    assert limiter is not None and (limiter.rate, limiter.burst) == (10, 3)
    with pytest.raises(ValueError, match="rate > 0"):
        RateLimiter(sqlite, 0, 1)


async def test_both_stores_keep_the_buckets(store: TaskStore) -> None:
    limiter = RateLimiter(store, rate=0.01, burst=2)
    assert [await limiter.take("alice") for _ in range(2)] == [0.0, 0.0]
    assert 99 < await limiter.take("alice") <= 100  # one token every 100 s
    assert await limiter.take("bob") == 0.0


# --- in Redis -------------------------------------------------------------------------


@pytest.fixture
async def redis_store(redis_settings: Settings) -> AsyncIterator[TaskStore]:
    async with open_store(redis_settings) as store:
        yield store


async def test_redis_bucket(redis_store: TaskStore, redis_url: str, key_prefix: str) -> None:
    def take(caller: str) -> Awaitable[float]:
        return redis_store.take_token(caller, 1.0, 3)

    assert [await take("alice") for _ in range(3)] == [0.0, 0.0, 0.0]
    assert 0 < await take("alice") <= 1.0
    assert await take("bob") == 0.0
    key = f"{key_prefix}:rl:alice"
    async with aioredis.Redis.from_url(redis_url, decode_responses=True) as raw:
        assert 0 < await raw.pttl(key) <= 4000  # gone once the bucket would be full again
        # refill on the server's clock: move the last update 2 s back
        ts = float(await raw.hget(key, "ts"))
        await raw.hset(key, "ts", f"{ts - 2:.6f}")
    assert await take("alice") == 0.0
    assert await take("alice") == 0.0
    assert await take("alice") > 0


async def test_redis_bucket_is_atomic_across_clients(
    redis_store: TaskStore, redis_settings: Settings
) -> None:
    """Two API processes (two stores) share one bucket; no token is spent twice."""
    async with open_store(redis_settings) as other:
        stores = (redis_store, other)
        waits = await asyncio.gather(*(stores[i % 2].take_token("k", 0.01, 10) for i in range(60)))
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
