"""One pipelined connection for the store's hot calls (its Lua scripts, task reads).

A command through redis-py's pool costs its caller 60-90 µs of CPU, round trip included
(taking a connection from the pool and giving it back, the retry wrapper, observability
hooks, the reply parser's awaits). A :class:`Lane` writes each command to one connection
at once and hands the replies back in order as they arrive (Redis answers a connection's
commands in the order it got them): 10-20 µs a command (a GET, 1 or 16 callers at once,
a development measurement). The connection is made and set up by redis-py (the URL's host
or socket, TLS, password, database, in RESP2); the lane only takes over its reader and
writer.

Shared, only for commands that answer at once: a blocking read would hold up every call
behind it. A lane of its own serves one caller's blocking reads (a worker's claims, one at
a time). Other blocking reads, pipelines and the rarer calls stay on redis-py's pools.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections import deque
from collections.abc import Sequence
from typing import Any

import hiredis
from redis import exceptions as rexc
from redis._parsers.base import BaseParser
from redis.asyncio import ConnectionPool
from redis.asyncio.connection import AbstractConnection

__all__ = ["Lane", "LaneScript"]

Arg = str | int | float

#: bytes read from the socket at a time
_READ_SIZE = 65536


class _Link:
    """One connection: commands go out as they come; a reader task resolves the oldest
    waiting call with each reply. A call whose caller gave up (timeout, cancel) keeps its
    place in line, and its reply is dropped."""

    def __init__(self, conn: AbstractConnection) -> None:
        self._conn = conn
        reader, writer = conn._reader, conn._writer  # made by conn.connect()
        assert reader is not None and writer is not None
        self._writer = writer
        self._replies = hiredis.Reader(
            protocolError=rexc.InvalidResponse,
            replyError=BaseParser.parse_error,  # redis-py's exception classes
            encoding="utf-8",
        )
        #: each call's future and when it was sent (loop clock)
        self._waiting: deque[tuple[asyncio.Future[Any], float]] = deque()
        self.error: Exception | None = None
        self._reading = asyncio.create_task(self._read(reader), name="redis-lane-reader")

    def oldest(self) -> float | None:
        """When the longest-waiting call was sent (None: none waits)."""
        return self._waiting[0][1] if self._waiting else None

    def send(self, args: Sequence[Arg]) -> asyncio.Future[Any]:
        if self.error is not None:
            raise self.error
        loop = asyncio.get_running_loop()
        command = hiredis.pack_command(tuple(args))  # type: ignore[arg-type]
        try:
            self._writer.write(command)
        except RuntimeError as e:  # uvloop: closed before the reader saw the end
            error = rexc.ConnectionError(f"Error while writing to Redis: {e}")
            self._fail(error)
            raise error from e
        future: asyncio.Future[Any] = loop.create_future()
        self._waiting.append((future, loop.time()))
        return future

    async def _read(self, reader: asyncio.StreamReader) -> None:
        error: Exception = rexc.ConnectionError("Connection closed by server.")
        try:
            while data := await reader.read(_READ_SIZE):
                self._replies.feed(data)
                while (reply := self._replies.gets()) is not False:
                    future, _ = self._waiting.popleft()
                    if future.done():
                        continue  # its caller gave up
                    if isinstance(reply, Exception):  # e.g. LOADING: a ConnectionError
                        future.set_exception(reply)
                    else:
                        future.set_result(reply)
        except Exception as e:  # a broken socket, or a reply that does not parse
            error = rexc.ConnectionError(f"Error while reading from Redis: {e}")
        finally:
            self._fail(error)

    def _fail(self, error: Exception) -> None:
        """No call is sent on this link again; the waiting ones fail with ``error``."""
        if self.error is None:
            self.error = error
        while self._waiting:
            future, _ = self._waiting.popleft()
            if not future.done():
                future.set_exception(error)
                future.exception()  # retrieved: a caller that gave up does not log it

    async def close(self) -> None:
        self._fail(rexc.ConnectionError("the connection was closed"))
        self._reading.cancel()
        await asyncio.gather(self._reading, return_exceptions=True)
        await self._conn.disconnect()


class Lane:
    """Single-command calls over one pipelined connection of ``pool``'s kind.

    A broken connection (closed by Redis, or with a call unanswered for ``stale_s``: a
    Redis that stopped answering) is closed and the next call opens a new one. Each
    caller bounds its own wait (the store's :func:`~ponder.store.redis.base.unavailable`).
    """

    def __init__(self, pool: ConnectionPool, *, stale_s: float) -> None:
        self._pool = pool
        self._stale_s = stale_s
        self._link: _Link | None = None
        self._opening = asyncio.Lock()

    async def call(self, *args: Arg) -> Any:
        """Send one command; its reply (a Redis error reply raises its redis-py error)."""
        link = self._link
        if link is None or not self._usable(link):
            link = await self._open()
        return await link.send(args)

    def script(self, body: str) -> LaneScript:
        return LaneScript(self, body)

    def _usable(self, link: _Link) -> bool:
        oldest = link.oldest()
        return link.error is None and (
            oldest is None or asyncio.get_running_loop().time() - oldest < self._stale_s
        )

    async def _open(self) -> _Link:
        async with self._opening:  # one connect at a time; the others wait for it
            link = self._link
            if link is not None and self._usable(link):
                return link
            self._link = None
            if link is not None:
                await link.close()
            # RESP2: no push messages (RESP3's maintenance notifications, invalidations)
            # can come between the replies
            kwargs = {**self._pool.connection_kwargs, "protocol": 2}
            conn: AbstractConnection = self._pool.connection_class(**kwargs)
            try:
                await conn.connect()  # type: ignore[no-untyped-call]
            except BaseException:
                await conn.disconnect()
                raise
            self._link = _Link(conn)
            return self._link

    async def close(self) -> None:
        async with self._opening:
            link, self._link = self._link, None
            if link is not None:
                await link.close()


class LaneScript:
    """A Lua script run by EVALSHA on a :class:`Lane` (EVAL when Redis lost its cache, as
    after a restart: that loads it again). Called as redis-py's registered scripts are."""

    def __init__(self, lane: Lane, body: str) -> None:
        self._lane = lane
        self.script = body
        self.sha = hashlib.sha1(body.encode(), usedforsecurity=False).hexdigest()

    async def __call__(self, keys: Sequence[Arg] = (), args: Sequence[Arg] = ()) -> Any:
        try:
            return await self._lane.call("EVALSHA", self.sha, len(keys), *keys, *args)
        except rexc.NoScriptError:
            return await self._lane.call("EVAL", self.script, len(keys), *keys, *args)
