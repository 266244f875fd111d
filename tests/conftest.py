"""Shared fixtures: a real Redis (isolated by a per-test key prefix), settings, stores."""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import redis

from ponder.config import Settings, load_settings

REDIS_URL = os.environ.get("PONDER_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


@pytest.fixture(scope="session")
def redis_url() -> str:
    """The test Redis; `make test` makes sure one answers (starting redis-server if needed)."""
    client = redis.Redis.from_url(REDIS_URL)
    try:
        client.ping()
    except redis.ConnectionError as e:
        raise RuntimeError(
            f"no Redis answers at {REDIS_URL}; run the suite with `make test`, which starts one"
        ) from e
    finally:
        client.close()
    return REDIS_URL


@pytest.fixture
def key_prefix(redis_url: str) -> Iterator[str]:
    """A key prefix of this test alone; its keys are deleted afterwards."""
    prefix = f"ponder-test-{uuid.uuid4().hex[:12]}"
    yield prefix
    client = redis.Redis.from_url(redis_url)
    try:
        keys = list(client.scan_iter(match=f"{prefix}:*", count=1000))
        if keys:
            client.delete(*keys)
    finally:
        client.close()


def make_settings(**overrides: object) -> Settings:
    """Settings for tests: scripted engine, fast timings, no environment leaks."""
    base: dict[str, object] = {
        "engine": "scripted",
        "node_id": "test1",
        "redis_url": None,
        "claim_block_ms": 100,
        "batch_max_wait_ms": 5.0,
    }
    base.update(overrides)
    return load_settings(**base)


@pytest.fixture
def sqlite_settings(tmp_path: Path) -> Settings:
    return make_settings(sqlite_path=str(tmp_path / "ponder.db"))


@pytest.fixture
def redis_settings(redis_url: str, key_prefix: str) -> Settings:
    return make_settings(redis_url=redis_url, key_prefix=key_prefix)


@pytest.fixture(params=["sqlite", "redis"])
def settings(request: pytest.FixtureRequest) -> Settings:
    """Run a test once per store implementation."""
    name = "sqlite_settings" if request.param == "sqlite" else "redis_settings"
    result: Settings = request.getfixturevalue(name)
    return result


@pytest.fixture
async def store(settings: Settings) -> AsyncIterator[object]:
    from ponder.store import create_store

    s = create_store(settings)
    await s.start()
    try:
        yield s
    finally:
        await s.close()
