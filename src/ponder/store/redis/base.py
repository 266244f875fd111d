"""What every part of the Redis store shares: the connections, the registered scripts,
the key names, the lifecycle and the error mapping."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from types import TracebackType
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

from redis import exceptions as rexc
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from ponder.config import NUM_PRIORITIES, Settings
from ponder.config.models import DEFAULT_MODEL
from ponder.errors import StoreUnavailable
from ponder.ids import sort_key
from ponder.store.contract import Lifecycle
from ponder.store.records import Notice
from ponder.store.redis import lua
from ponder.store.redis.lane import Lane

__all__ = ["GROUP", "RedisBase", "redacted"]

log = logging.getLogger("ponder.store")

_T = TypeVar("_T")

GROUP = "workers"
# Every answer Redis can give that is not ours to fix: connections refused, reset or
# killed (CLIENT KILL), LOADING, READONLY (a replica after a failover), OOM, MISCONF, …
# A ResponseError that a queue command can fix (NOGROUP, UNBLOCKED) is handled first.
_UNAVAILABLE = (rexc.ConnectionError, rexc.TimeoutError, rexc.ResponseError, TimeoutError)
GROUP_LOST = ("NOGROUP", "UNBLOCKED")
# (the scripts cap each notice stream at about 1,000 entries: XADD MAXLEN ~ 1000)


def unavailable(seconds: float) -> AbstractAsyncContextManager[None]:
    """``async with unavailable(seconds):`` around one store call: it is cut off after
    ``seconds`` (``store_timeout_s``; a blocking read adds its block time), and its
    connection failures and timeouts become :class:`StoreUnavailable`.

    The store's pools have no socket timeout: redis-py would bound each write with
    ``asyncio.wait_for`` (a task of its own per command) and each read with a timer; one
    bound a call is cheaper and covers pipelines and blocking reads alike. A call cut off
    mid-way closes its pooled connection (redis-py drops it on cancellation), so no reply
    is left for the next call to read; on the pipelined connection (:class:`Lane`) its
    reply is dropped when it comes.
    """
    return _StoreCall(seconds)


class _StoreCall:
    """:func:`unavailable`'s context (a class, not ``@asynccontextmanager``: it is on
    every store call, and a generator-based one costs more)."""

    __slots__ = ("_limit", "_seconds")

    def __init__(self, seconds: float) -> None:
        self._seconds = seconds
        self._limit = asyncio.timeout(seconds)

    async def __aenter__(self) -> None:
        await self._limit.__aenter__()

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        try:
            await self._limit.__aexit__(kind, error, traceback)
        except TimeoutError as e:
            raise StoreUnavailable(
                f"Redis is unavailable: no answer within {self._seconds:g}s"
            ) from e
        if isinstance(error, _UNAVAILABLE):
            raise StoreUnavailable(f"Redis is unavailable: {error}") from error


def redacted(url: str) -> str:
    """``url`` without its password (for messages)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rpartition("@")
    user = (parts.username or "") + ":***"
    return urlunsplit(parts._replace(netloc=f"{user}@{netloc[2]}"))


def ms(seconds: float) -> int:
    return max(1, int(seconds * 1000))


def index_member(task_id: str) -> str:
    """The owner index's member of a task: sorts like creation order, holds the id."""
    return f"{sort_key(task_id)} {task_id}"


def member_id(member: str) -> str:
    """The id in an index member (``"{sort_key} {id}"``)."""
    return member.split(" ", 1)[1]


class RedisBase(Lifecycle):
    """The connections, scripts and keys of :class:`~ponder.store.redis.RedisStore`, and
    its lifecycle; each part of the store is a subclass of this one."""

    def __init__(self, settings: Settings) -> None:
        if not settings.redis_url:
            raise ValueError("RedisStore needs settings.redis_url")
        self._prefix = settings.key_prefix
        self._ttl = settings.task_ttl_s
        self._timeout = settings.store_timeout_s
        # One quick retry on a connection error covers a pooled connection that a Redis
        # restart closed; the default policy (10 retries with backoff) would stretch a
        # call far past store_timeout_s.
        common: dict[str, Any] = {
            "decode_responses": True,
            "socket_connect_timeout": self._timeout,
            "retry": Retry(NoBackoff(), 1, supported_errors=(rexc.ConnectionError,)),
            # (redis-py's default of 100 would refuse the 101st SSE follower with a 503)
            "max_connections": settings.redis_max_connections,
        }
        # no socket timeout: every call is bounded by :func:`unavailable` instead
        self._r = Redis.from_url(settings.redis_url, socket_timeout=None, **common)
        # Blocking reads (claims, followed event streams) wait in a pool of their own, so
        # that many waiting followers cannot take every connection from the other calls.
        self._rb = Redis.from_url(settings.redis_url, socket_timeout=None, **common)
        # the hot calls (every script, task reads) go over one pipelined connection
        self._lane = Lane(self._r.connection_pool, stale_s=self._timeout)
        # each consumer's blocking claim reads over a connection of its own (one read at a
        # time: nothing waits behind it), without the pool's cost per call
        self._claim_lanes: dict[str, Lane] = {}
        script = self._lane.script
        # tasks, queues, events
        self._create = script(lua.CREATE)
        self._update = script(lua.UPDATE)
        self._claim = script(lua.CLAIM)
        self._reclaim = script(lua.RECLAIM)
        self._renew = script(lua.RENEW)
        self._release = script(lua.RELEASE)
        self._append = script(lua.APPEND)
        self._hand_over = script(lua.HAND_OVER)
        self._expire_due = script(lua.EXPIRE_DUE)
        # liveness and leases
        self._register = script(lua.REGISTER)
        self._live = script(lua.LIVE)
        self._served = script(lua.SERVED)
        self._acquire_lease = script(lua.ACQUIRE_LEASE)
        self._release_lease = script(lua.RELEASE_LEASE)
        # the webhook outbox
        self._enqueue = script(lua.ENQUEUE)
        self._claim_deliveries = script(lua.CLAIM_DELIVERIES)
        self._retry_delivery = script(lua.RETRY_DELIVERY)
        # the OpenAI-compatible APIs' objects
        self._create_object = script(lua.CREATE_OBJECT)
        self._update_object = script(lua.UPDATE_OBJECT)
        # rate limits
        self._take_token = script(lua.TAKE_TOKEN)
        self._url = settings.redis_url

    def _blocking(self, block_ms: int) -> float:
        """The time limit of a call that may block for ``block_ms`` (0: does not block)."""
        return max(0, block_ms) / 1000 + self._timeout

    # --- keys -------------------------------------------------------------------------
    def _task_key(self, task_id: str) -> str:
        return f"{self._prefix}:task:{task_id}"

    def _events_key(self, task_id: str) -> str:
        return f"{self._prefix}:ev:{task_id}"

    def _queue_key(self, priority: int, model: str = DEFAULT_MODEL) -> str:
        """``{p}:q:{level}`` for the default model (the keys from before there were
        models), ``{p}:q:{model}:{level}`` for another."""
        if model == DEFAULT_MODEL:
            return f"{self._prefix}:q:{priority}"
        return f"{self._prefix}:q:{model}:{priority}"

    def _queue_keys(self, model: str = DEFAULT_MODEL) -> list[str]:
        """The queues of every level of ``model``, most urgent first."""
        return [self._queue_key(p, model) for p in range(NUM_PRIORITIES)]

    def _index_key(self, owner: str) -> str:
        return f"{self._prefix}:tasks:{owner}"

    @property
    def _pending_key(self) -> str:
        return f"{self._prefix}:pending"

    @property
    def _deadlines_key(self) -> str:
        return f"{self._prefix}:deadlines"

    @property
    def _workers_key(self) -> str:
        return f"{self._prefix}:workers"

    @property
    def _worker_models_key(self) -> str:
        return f"{self._prefix}:workers:models"

    @property
    def _outbox_key(self) -> str:
        return f"{self._prefix}:outbox"

    def _delivery_key(self, webhook_id: str) -> str:
        return f"{self._prefix}:dlv:{webhook_id}"

    def _notice_key(self, topic: Notice) -> str:
        return f"{self._prefix}:notice:{topic.value}"

    # --- lifecycle --------------------------------------------------------------------
    def describe(self) -> str:
        return f"Redis at {redacted(self._url)}"

    async def start(self) -> None:
        async with unavailable(self._timeout):
            await self._create_groups(self._queue_keys())

    async def _create_groups(self, keys: Sequence[str]) -> None:
        """The consumer group of each queue in ``keys`` (the stream made if need be)."""
        for key in keys:
            try:
                # id 0: entries added before the group existed are delivered too
                await self._r.xgroup_create(key, GROUP, id="0", mkstream=True)
            except rexc.ResponseError as e:
                if "BUSYGROUP" not in str(e):
                    raise

    async def _grouped(
        self, keys: Sequence[str], call: Callable[[], Awaitable[_T]], *, again: bool = True
    ) -> _T:
        """Run a queue command over the queues ``keys``; if a consumer group is missing
        (NOGROUP: the model's first read, Redis restarted without persistence, or the
        streams were deleted; UNBLOCKED: a stream was deleted under a blocking read),
        create the groups of ``keys`` and run it again (``again``; else the ResponseError
        is raised, for the caller to treat as "nothing read").

        A model's groups are made on demand this way: a model other than the default has
        no group until a worker first reads its queues."""
        try:
            return await call()
        except rexc.ResponseError as e:
            if not str(e).startswith(GROUP_LOST):
                raise
            log.info("a queue read failed (%s); creating the consumer groups", e)
            await self._create_groups(keys)
            if not again:
                raise
        return await call()

    def _claim_lane(self, consumer: str) -> Lane:
        lane = self._claim_lanes.get(consumer)
        if lane is None:
            lane = Lane(self._rb.connection_pool, stale_s=self._timeout)
            self._claim_lanes[consumer] = lane
        return lane

    async def close(self) -> None:
        for lane in self._claim_lanes.values():
            await lane.close()
        await self._lane.close()
        await self._r.aclose()
        await self._rb.aclose()

    async def ping(self) -> bool:
        try:
            async with unavailable(self._timeout):
                return bool(await self._r.ping())
        except StoreUnavailable:
            return False
