"""The Redis store's pipelined connection (ponder.store.redis.lane) against a real Redis."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis
from redis import exceptions as rexc

from ponder.store.redis.lane import Lane

pytestmark = pytest.mark.timeout(30)

#: replies to the commands redis-py sends on a new connection
_HANDSHAKE = {b"HELLO": b"%1\r\n+proto\r\n:3\r\n", b"SETINFO": b"+OK\r\n", b"SELECT": b"+OK\r\n"}


@contextlib.asynccontextmanager
async def _lane_at(url: str, stale_s: float) -> AsyncIterator[Lane]:
    pool = aioredis.ConnectionPool.from_url(url)
    lane = Lane(pool, stale_s=stale_s)
    try:
        yield lane
    finally:
        await lane.close()
        await pool.aclose()


@pytest.fixture
async def lane(redis_url: str) -> AsyncIterator[Lane]:
    async with _lane_at(redis_url, stale_s=5) as lane:
        yield lane


async def test_concurrent_calls_each_get_their_own_reply(lane: Lane, key_prefix: str) -> None:
    keys = [f"{key_prefix}:lane:{i}" for i in range(200)]
    await asyncio.gather(*(lane.call("SET", k, i, "PX", 60_000) for i, k in enumerate(keys)))
    values = await asyncio.gather(*(lane.call("GET", k) for k in keys))
    assert values == [str(i) for i in range(200)]
    assert await lane.call("GET", f"{key_prefix}:lane:none") is None


async def test_a_call_given_up_does_not_shift_the_replies(lane: Lane, key_prefix: str) -> None:
    await lane.call("SET", f"{key_prefix}:a", "a", "PX", 60_000)
    await lane.call("SET", f"{key_prefix}:b", "b", "PX", 60_000)
    link = lane._link
    assert link is not None
    given_up = link.send(("GET", f"{key_prefix}:a"))  # sent, its reply not read yet
    given_up.cancel()
    assert await lane.call("GET", f"{key_prefix}:b") == "b"
    assert given_up.cancelled()


async def test_an_error_reply_raises_for_its_call_only(lane: Lane, key_prefix: str) -> None:
    await lane.call("SET", f"{key_prefix}:s", "text", "PX", 60_000)
    bad = lane.call("HGET", f"{key_prefix}:s", "f")
    good = lane.call("GET", f"{key_prefix}:s")
    result = await asyncio.gather(bad, good, return_exceptions=True)
    assert isinstance(result[0], rexc.ResponseError) and "WRONGTYPE" in str(result[0])
    assert result[1] == "text"


async def test_scripts_survive_a_flushed_script_cache(lane: Lane, raw: aioredis.Redis) -> None:
    echo = lane.script("return ARGV[1] .. KEYS[1]")
    assert await echo(keys=["k"], args=["v"]) == "vk"
    await raw.script_flush()  # as a Redis restart does
    assert await echo(keys=["k"], args=["w"]) == "wk"


async def test_a_killed_connection_is_replaced(lane: Lane, raw: aioredis.Redis) -> None:
    own = await lane.call("CLIENT", "ID")
    link = lane._link
    assert link is not None
    assert await raw.client_kill_filter(_id=own) == 1
    async with asyncio.timeout(5):  # until the lane's reader has seen the close
        await link._reading
    assert link.error is not None
    assert await lane.call("PING") == "PONG"
    assert await lane.call("CLIENT", "ID") != own


async def test_a_call_on_a_connection_closed_under_it_fails_then_the_next_one_reconnects(
    lane: Lane,
) -> None:
    assert await lane.call("PING") == "PONG"
    link = lane._link
    assert link is not None
    link._writer.transport.abort()  # closed before the reader task has seen it
    with pytest.raises(rexc.ConnectionError):
        await lane.call("PING")
    assert await lane.call("PING") == "PONG"
    assert lane._link is not link


class _FakeRedis:
    """A loopback server that answers redis-py's handshake, then ``answer`` to each GET
    (nothing when empty); :attr:`connections` counts the connections it took."""

    def __init__(self, answer: bytes = b"") -> None:
        self.answer = answer
        self.connections = 0

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        while data := await reader.read(65536):
            for word, reply in _HANDSHAKE.items():
                writer.write(reply * data.count(b"$%d\r\n%s\r\n" % (len(word), word)))
            writer.write(self.answer * data.count(b"$3\r\nGET\r\n"))
        writer.close()

    @contextlib.asynccontextmanager
    async def lane(self, stale_s: float) -> AsyncIterator[Lane]:
        server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        async with server, _lane_at(f"redis://127.0.0.1:{port}/0", stale_s) as lane:
            yield lane


async def test_every_kind_of_error_reply_raises() -> None:
    """redis-py maps some error replies to ConnectionError's kin (LOADING: a Redis
    loading its data after a restart); those raise too, not come back as a value."""
    fake = _FakeRedis(b"-LOADING Redis is loading the dataset in memory\r\n")
    async with fake.lane(stale_s=5) as lane:
        with pytest.raises(rexc.BusyLoadingError):
            await lane.call("GET", "k")


async def test_a_connection_that_stopped_answering_is_replaced() -> None:
    """A call left unanswered for stale_s marks the connection dead: the next call
    opens another."""
    fake = _FakeRedis()
    async with fake.lane(stale_s=0.2) as lane:
        for made in (1, 2):
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(0.3):
                    await lane.call("GET", "k")
            assert fake.connections == made
