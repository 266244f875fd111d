"""The Redis store: shared by any number of API and worker processes.

Keys (all under ``settings.key_prefix``, written as ``{p}``):

- ``{p}:task:{id}``: hash ``data`` (:meth:`Task.to_storage`), ``status``, ``rev``,
  ``owner``, ``priority``; expires ``task_ttl_s`` after the task reaches a terminal state.
- ``{p}:ev:{id}``: the task's event stream (fields ``event``, ``data``); expires with it.
- ``{p}:q:{0..5}``: one stream per priority level (field ``task``), read by the consumer
  group ``workers``. An entry's id is the claim's receipt; ack deletes the entry, so a
  stream holds only queued and in-flight tasks.
- ``{p}:pending``: hash of pending counts: ``total`` and one field per level.
- ``{p}:tasks:{owner}``: sorted set of ``"{sort_key} {id}"``, all with score 0, so a
  lexicographic range walks an owner's tasks in creation order. Entries of expired
  tasks are dropped when a listing meets them.
- ``{p}:idem:{owner}:{key}``: hash ``hash`` + ``id`` of an idempotency key, ``task_ttl_s``.
- ``{p}:workers``: sorted set of worker ids scored by their expiry (Redis server time). A
  consumer of the group that is not in it (or has expired) is dead: :meth:`reclaim` takes
  its entries at once and then removes it from the group.
- ``{p}:outbox``: sorted set of webhook ids scored by when each is due (ms, server time;
  a claimed delivery's score is the end of its lease). ``{p}:dlv:{webhook_id}``: hash
  ``data`` (the :class:`OutboxEntry`), ``host``, ``owner`` (the delivery loop holding it).
- ``{p}:notice:{topic}``: streams of notices (field ``v``), capped at about 1,000:
  ``cancel`` (a task id, written by the cancel itself), ``outbox`` (deliveries added).
- The OpenAI-compatible APIs: ``{p}:obj:{kind}:{id}`` (hash ``data``, ``owner``, ``rev``,
  ``sort_key``; its own expiry), ``{p}:objs:{kind}:{owner}`` and ``{p}:active:{kind}``
  (lexicographic sorted sets of ``"{sort_key} {id}"``, like the task index),
  ``{p}:blob:{key}`` (a string), ``{p}:parts:{key}`` (a hash), ``{p}:lease:{name}``.
  A batch line's task hash has ``lane`` = ``batch`` and is counted in the ``batch`` field
  of ``{p}:pending`` as well as in ``total``; other tasks are admitted against
  ``total - batch``.

Every multi-key change is one Lua script, so it is atomic and needs one round trip.
Scripts read a task record named by id from the idempotency key without declaring it, and
the keys share no hash tag: this store targets a single Redis (or a primary + replicas),
not Redis Cluster.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from functools import cached_property
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

from redis import exceptions as rexc
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.commands.core import AsyncScript

from ponder.config import NUM_PRIORITIES, Settings
from ponder.errors import IdempotencyConflict, QueueFull, StoreUnavailable
from ponder.ids import parse_task_id, sort_key
from ponder.outbox import OutboxEntry, task_deliveries
from ponder.states import is_terminal
from ponder.store.base import (
    Claim,
    Event,
    Notice,
    StoredObject,
    TaskStore,
    check_new_task,
    check_priorities,
)
from ponder.types import Task, TaskStatus

__all__ = ["RedisStore"]

log = logging.getLogger("ponder.store")

_T = TypeVar("_T")

GROUP = "workers"
_STREAM_ID = re.compile(r"^\d+(-\d+)?$")
# Every answer Redis can give that is not ours to fix: connections refused, reset or
# killed (CLIENT KILL), LOADING, READONLY (a replica after a failover), OOM, MISCONF, …
# A ResponseError that a queue command can fix (NOGROUP, UNBLOCKED) is handled first.
_UNAVAILABLE = (rexc.ConnectionError, rexc.TimeoutError, rexc.ResponseError, TimeoutError)
_GROUP_LOST = ("NOGROUP", "UNBLOCKED")
# (the scripts cap each notice stream at about 1,000 entries: XADD MAXLEN ~ 1000)
#: rows looked at per claim of deliveries, beyond the limit (some may be for busy hosts)
_DELIVERY_SCAN = 64
#: a due delivery whose host is at its limit waits this long before it is looked at again
_BUSY_HOST_DEFER_MS = 1000

# Shared by the scripts that add webhook deliveries (ARGV-free helpers).
_LUA_OUTBOX = """
local function now_ms()
  local t = redis.call('TIME')
  return t[1] * 1000 + math.floor(t[2] / 1000)
end
-- a delivery id is added once (its ':once' key outlives the row, for the ttl)
local function add_delivery(outbox, key, id, data, host, ttl, due)
  if not redis.call('SET', key .. ':once', 1, 'NX', 'EX', ttl) then return 0 end
  redis.call('HSET', key, 'data', data, 'host', host, 'owner', '')
  redis.call('EXPIRE', key, ttl)
  redis.call('ZADD', outbox, due, id)
  return 1
end
"""

# KEYS: task, queue, pending, index, events[, idem]
# ARGV: id, data, status, rev, owner, priority, max_pending, member, event, hash, ttl,
#       task key prefix, batch ('1': a batch line, admitted against the batch lines only)
_CREATE = """
local idem = KEYS[6]
if idem then
  local prev = redis.call('HMGET', idem, 'hash', 'id')
  -- an idempotency key whose task has expired is free again
  local data = prev[2] and redis.call('HGET', ARGV[12] .. prev[2], 'data')
  if data then
    if prev[1] ~= ARGV[10] then return {'conflict'} end
    return {'existing', data}
  end
end
local batch = ARGV[13] == '1'
local lines = tonumber(redis.call('HGET', KEYS[3], 'batch') or '0')
local backlog = batch and lines or tonumber(redis.call('HGET', KEYS[3], 'total') or '0') - lines
if backlog >= tonumber(ARGV[7]) then
  return {'full'}
end
redis.call('HSET', KEYS[1], 'data', ARGV[2], 'status', ARGV[3], 'rev', ARGV[4],
           'owner', ARGV[5], 'priority', ARGV[6])
if batch then
  redis.call('HSET', KEYS[1], 'lane', 'batch')
  redis.call('HINCRBY', KEYS[3], 'batch', 1)
end
redis.call('XADD', KEYS[2], '*', 'task', ARGV[1])
redis.call('HINCRBY', KEYS[3], 'total', 1)
redis.call('HINCRBY', KEYS[3], ARGV[6], 1)
redis.call('ZADD', KEYS[4], 0, ARGV[8])
redis.call('XADD', KEYS[5], '*', 'event', 'status', 'data', ARGV[9])
if idem then
  redis.call('HSET', idem, 'hash', ARGV[10], 'id', ARGV[1])
  redis.call('EXPIRE', idem, ARGV[11])
end
return {'created'}
"""

# KEYS: task, pending, events, outbox, cancel notices, outbox notices
# ARGV: expected rev, new rev, data, status, terminal, ttl, task id, delivery key prefix,
#       number of deliveries, then 3 per delivery: webhook id, data, host; then event
#       name/data pairs
_UPDATE = (
    _LUA_OUTBOX
    + """
local cur = redis.call('HMGET', KEYS[1], 'rev', 'status', 'priority', 'lane')
if cur[1] ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'data', ARGV[3], 'status', ARGV[4], 'rev', ARGV[2])
if cur[2] == 'pending' and ARGV[4] ~= 'pending' then
  redis.call('HINCRBY', KEYS[2], 'total', -1)
  redis.call('HINCRBY', KEYS[2], cur[3], -1)
  if cur[4] == 'batch' then redis.call('HINCRBY', KEYS[2], 'batch', -1) end
end
local n = tonumber(ARGV[9])
local added, now = 0, now_ms()
for i = 10, 9 + 3 * n, 3 do
  added = added + add_delivery(KEYS[4], ARGV[8] .. ARGV[i], ARGV[i], ARGV[i + 1], ARGV[i + 2],
                               ARGV[6], now)
end
if added > 0 then
  redis.call('XADD', KEYS[6], 'MAXLEN', '~', 1000, '*', 'v', added)
end
if ARGV[4] == 'cancelled' and cur[2] ~= 'cancelled' then
  redis.call('XADD', KEYS[5], 'MAXLEN', '~', 1000, '*', 'v', ARGV[7])
end
for i = 10 + 3 * n, #ARGV, 2 do
  redis.call('XADD', KEYS[3], '*', 'event', ARGV[i], 'data', ARGV[i + 1])
end
if ARGV[5] == '1' then
  redis.call('EXPIRE', KEYS[1], ARGV[6])
  redis.call('EXPIRE', KEYS[3], ARGV[6])
end
return 1
"""
)

# KEYS: queues in the order to try; ARGV: group, consumer. Returns {key index, id, task}.
_CLAIM = """
for i, key in ipairs(KEYS) do
  local r = redis.call('XREADGROUP', 'GROUP', ARGV[1], ARGV[2], 'COUNT', 1,
                       'STREAMS', key, '>')
  if r then
    local entry = r[1][2][1]
    return {i, entry[1], entry[2][2]}
  end
end
return false
"""

# KEYS: queues 0..5, workers; ARGV: group, consumer, min idle ms, limit.
# Returns {level, id, task}s. Per level, most urgent first: every entry of a dead consumer
# (not a live registered worker) at once, removing the consumer once it holds none; then
# entries of any consumer idle for the lease (XAUTOCLAIM).
_RECLAIM = """
local t = redis.call('TIME')
local now = t[1] + t[2] / 1e6
local group, me = ARGV[1], ARGV[2]
local out, left = {}, tonumber(ARGV[4])
local function keep(level, entries)
  for _, entry in ipairs(entries) do
    -- an entry deleted from the stream is dropped from the pending list, not returned
    if type(entry) == 'table' and entry[2] then
      table.insert(out, {level, entry[1], entry[2][2]})
      left = left - 1
    end
  end
end
for i = 1, #KEYS - 1 do
  local key = KEYS[i]
  if redis.call('EXISTS', key) == 0 then  -- XINFO would say "no such key"
    return redis.error_reply('NOGROUP the queue ' .. key .. ' is gone')
  end
  for _, c in ipairs(redis.call('XINFO', 'CONSUMERS', key, group)) do
    local info = {}
    for j = 1, #c, 2 do info[c[j]] = c[j + 1] end
    local expiry = redis.call('ZSCORE', KEYS[#KEYS], info.name)
    if info.name ~= me and (not expiry or tonumber(expiry) <= now) then
      local pending = info.pending
      if pending > 0 and left > 0 then
        local ids = {}
        for _, p in ipairs(redis.call('XPENDING', key, group, '-', '+', left, info.name)) do
          table.insert(ids, p[1])
        end
        keep(i - 1, redis.call('XCLAIM', key, group, me, 0, unpack(ids)))
        pending = #redis.call('XPENDING', key, group, '-', '+', 1, info.name)
      end
      if pending == 0 then
        redis.call('XGROUP', 'DELCONSUMER', key, group, info.name)
      end
    end
  end
  local start = '0-0'
  while left > 0 do
    local r = redis.call('XAUTOCLAIM', key, group, me, ARGV[3], start, 'COUNT', left)
    start = r[1]
    keep(i - 1, r[2])
    if start == '0-0' then break end
  end
  if left <= 0 then break end
end
return out
"""

# KEYS: the queue of each claim; ARGV: group, consumer, then the entry ids. An entry that
# another consumer has reclaimed meanwhile stays with it.
_RENEW = """
for i, key in ipairs(KEYS) do
  local id = ARGV[i + 2]
  if redis.call('XPENDING', key, ARGV[1], id, id, 1, ARGV[2])[1] then
    redis.call('XCLAIM', key, ARGV[1], ARGV[2], 0, id, 'JUSTID')
  end
end
return 0
"""

# KEYS: queue; ARGV: group, entry id, task id. Requeued only if still unacked, so a
# release after an ack (or a second release) adds nothing.
_RELEASE = """
if redis.call('XACK', KEYS[1], ARGV[1], ARGV[2]) == 1 then
  redis.call('XDEL', KEYS[1], ARGV[2])
  redis.call('XADD', KEYS[1], '*', 'task', ARGV[3])
end
return 0
"""

# KEYS: task, events; ARGV: event name/data pairs. Only while the task runs: nothing is
# appended after its terminal event, and no stream is made for a task that is gone.
_APPEND = """
if redis.call('HGET', KEYS[1], 'status') ~= 'running' then return 0 end
for i = 1, #ARGV, 2 do
  redis.call('XADD', KEYS[2], '*', 'event', ARGV[i], 'data', ARGV[i + 1])
end
return 1
"""

# Worker expiry uses the server's clock, so workers on machines with skewed clocks agree.
_REGISTER = """
local t = redis.call('TIME')
redis.call('ZADD', KEYS[1], t[1] + t[2] / 1e6 + tonumber(ARGV[2]), ARGV[1])
return 0
"""

_LIVE = """
local t = redis.call('TIME')
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', t[1] + t[2] / 1e6)
return redis.call('ZCARD', KEYS[1])
"""

# --- the OpenAI-compatible APIs -------------------------------------------------------
# KEYS: object, owner index, active index; ARGV: data, owner, sort_key, active, ttl ms,
# member
_CREATE_OBJECT = """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('HSET', KEYS[1], 'data', ARGV[1], 'owner', ARGV[2], 'rev', 0, 'sort_key', ARGV[3],
           'active', ARGV[4])
redis.call('PEXPIRE', KEYS[1], ARGV[5])
redis.call('ZADD', KEYS[2], 0, ARGV[6])
if ARGV[4] == '1' then redis.call('ZADD', KEYS[3], 0, ARGV[6]) end
return 1
"""

# KEYS: object, active index; ARGV: expected rev, data, active, ttl ms ('' keeps it), member
_UPDATE_OBJECT = """
if redis.call('HGET', KEYS[1], 'rev') ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'data', ARGV[2], 'rev', tonumber(ARGV[1]) + 1, 'active', ARGV[3])
if ARGV[4] ~= '' then redis.call('PEXPIRE', KEYS[1], ARGV[4]) end
if ARGV[3] == '1' then
  redis.call('ZADD', KEYS[2], 0, ARGV[5])
else
  redis.call('ZREM', KEYS[2], ARGV[5])
end
return 1
"""

# KEYS: lease; ARGV: holder, ttl ms
_ACQUIRE_LEASE = """
local cur = redis.call('GET', KEYS[1])
if cur and cur ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1
"""

_RELEASE_LEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]) end
return 0
"""


def _ms(seconds: float) -> int:
    return max(1, int(seconds * 1000))


# KEYS: outbox, delivery notices; ARGV: delivery key prefix, ttl, then 3 per delivery:
# webhook id, data, host
_ENQUEUE = (
    _LUA_OUTBOX
    + """
local added, now = 0, now_ms()
for i = 3, #ARGV, 3 do
  added = added + add_delivery(KEYS[1], ARGV[1] .. ARGV[i], ARGV[i], ARGV[i + 1], ARGV[i + 2],
                               ARGV[2], now)
end
if added > 0 then
  redis.call('XADD', KEYS[2], 'MAXLEN', '~', 1000, '*', 'v', added)
end
return added
"""
)

# KEYS: outbox; ARGV: consumer, limit, lease ms, room of a host not in the pairs, delivery
# key prefix, rows to look at, defer ms, then host/room pairs.
# Returns {datas, ms until the next entry is due or false}.
_CLAIM_DELIVERIES = (
    _LUA_OUTBOX
    + """
local now = now_ms()
local room = {}
for i = 8, #ARGV, 2 do room[ARGV[i]] = tonumber(ARGV[i + 1]) end
local limit, out = tonumber(ARGV[2]), {}
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[6]))
for _, id in ipairs(due) do
  local key = ARGV[5] .. id
  local row = redis.call('HMGET', key, 'data', 'host')
  if not row[1] then
    redis.call('ZREM', KEYS[1], id)  -- its row expired with its task
  else
    local left = room[row[2]] or tonumber(ARGV[4])
    if left > 0 and #out < limit then
      room[row[2]] = left - 1
      redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), id)
      redis.call('HSET', key, 'owner', ARGV[1])
      table.insert(out, row[1])
    elseif left <= 0 then
      redis.call('ZADD', KEYS[1], now + tonumber(ARGV[7]), id)  -- let other hosts by
    end
  end
end
local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
local wait = false
if first[2] then wait = tonumber(first[2]) - now end
return {out, wait}
"""
)

# KEYS: outbox, delivery row; ARGV: consumer, webhook id, data, delay ms
_RETRY_DELIVERY = (
    _LUA_OUTBOX
    + """
if redis.call('HGET', KEYS[2], 'owner') ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[2], 'data', ARGV[3], 'owner', '')
redis.call('ZADD', KEYS[1], now_ms() + tonumber(ARGV[4]), ARGV[2])
return 1
"""
)


@contextmanager
def _unavailable() -> Iterator[None]:
    """Turn connection failures and timeouts into :class:`StoreUnavailable`."""
    try:
        yield
    except _UNAVAILABLE as e:
        raise StoreUnavailable(f"Redis is unavailable: {e}") from e


def redacted(url: str) -> str:
    """``url`` without its password (for messages)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rpartition("@")
    user = (parts.username or "") + ":***"
    return urlunsplit(parts._replace(netloc=f"{user}@{netloc[2]}"))


def _index_member(task_id: str) -> str:
    """The owner index's member of a task: sorts like creation order, holds the id."""
    return f"{sort_key(task_id)} {task_id}"


def _task_id(member: str) -> str:
    return member.split(" ", 1)[1]


class RedisStore(TaskStore):
    """:class:`TaskStore` on Redis (see the module docstring for the key layout)."""

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
        self._r = Redis.from_url(settings.redis_url, socket_timeout=self._timeout, **common)
        # Blocking reads (claim, read_events) wait longer than the socket timeout allows;
        # they use their own pool without one, bounded by asyncio.timeout instead.
        self._rb = Redis.from_url(settings.redis_url, socket_timeout=None, **common)
        self._create = self._r.register_script(_CREATE)
        self._update = self._r.register_script(_UPDATE)
        self._claim = self._r.register_script(_CLAIM)
        self._reclaim = self._r.register_script(_RECLAIM)
        self._renew = self._r.register_script(_RENEW)
        self._release = self._r.register_script(_RELEASE)
        self._register = self._r.register_script(_REGISTER)
        self._live = self._r.register_script(_LIVE)
        self._append = self._r.register_script(_APPEND)
        self._enqueue = self._r.register_script(_ENQUEUE)
        self._claim_deliveries = self._r.register_script(_CLAIM_DELIVERIES)
        self._retry_delivery = self._r.register_script(_RETRY_DELIVERY)
        self._url = settings.redis_url

    @property
    def client(self) -> Redis:
        """The store's connection pool, for features that live beside it (rate limits)."""
        return self._r

    # --- keys -------------------------------------------------------------------------
    def _task_key(self, task_id: str) -> str:
        return f"{self._prefix}:task:{task_id}"

    def _events_key(self, task_id: str) -> str:
        return f"{self._prefix}:ev:{task_id}"

    def _queue_key(self, priority: int) -> str:
        return f"{self._prefix}:q:{priority}"

    def _index_key(self, owner: str) -> str:
        return f"{self._prefix}:tasks:{owner}"

    @property
    def _pending_key(self) -> str:
        return f"{self._prefix}:pending"

    @property
    def _workers_key(self) -> str:
        return f"{self._prefix}:workers"

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
        with _unavailable():
            await self._create_groups()

    async def _create_groups(self) -> None:
        for p in range(NUM_PRIORITIES):
            try:
                # id 0: entries added before the group existed are delivered too
                await self._r.xgroup_create(self._queue_key(p), GROUP, id="0", mkstream=True)
            except rexc.ResponseError as e:
                if "BUSYGROUP" not in str(e):
                    raise

    async def _grouped(self, call: Callable[[], Awaitable[_T]], *, again: bool = True) -> _T:
        """Run a queue command; if the consumer group is gone (NOGROUP: Redis restarted
        without persistence, or the streams were deleted; UNBLOCKED: a stream was deleted
        under a blocking read), recreate the groups and run it again (``again``; else the
        ResponseError is raised, for the caller to treat as "nothing read")."""
        try:
            return await call()
        except rexc.ResponseError as e:
            if not str(e).startswith(_GROUP_LOST):
                raise
            log.warning("a queue read failed (%s); recreating the consumer groups", e)
            await self._create_groups()
            if not again:
                raise
        return await call()

    async def close(self) -> None:
        await self._r.aclose()
        await self._rb.aclose()

    async def ping(self) -> bool:
        try:
            with _unavailable():
                return bool(await self._r.ping())
        except StoreUnavailable:
            return False

    # --- api side ---------------------------------------------------------------------
    async def create_task(
        self,
        task: Task,
        *,
        max_pending: int,
        idempotency_key: str | None = None,
        body_hash: str | None = None,
        batch: bool = False,
    ) -> tuple[Task, bool]:
        check_new_task(task)
        keys = [
            self._task_key(task.id),
            self._queue_key(task.priority),
            self._pending_key,
            self._index_key(task.owner),
            self._events_key(task.id),
        ]
        if idempotency_key is not None:
            keys.append(f"{self._prefix}:idem:{task.owner}:{idempotency_key}")
        args: list[str | int] = [
            task.id,
            task.to_storage(),
            task.status.value,
            task.rev,
            task.owner,
            task.priority,
            max_pending,
            _index_member(task.id),
            json.dumps({"status": task.status.value}),
            body_hash or "",
            self._ttl,
            self._task_key(""),
            "1" if batch else "0",
        ]
        with _unavailable():
            outcome = await self._create(keys=keys, args=args)
        if outcome[0] == "full":
            raise QueueFull(max_pending)
        if outcome[0] == "conflict":
            raise IdempotencyConflict("the Idempotency-Key was used with another request body")
        if outcome[0] == "existing":
            return Task.from_storage(outcome[1]), False
        return task, True

    async def get_task(self, task_id: str) -> Task | None:
        with _unavailable():
            data = await self._r.hget(self._task_key(task_id), "data")
        return None if data is None else Task.from_storage(data)

    async def list_tasks(
        self, owner: str, *, status: TaskStatus | None, limit: int, cursor: str | None
    ) -> tuple[list[Task], str | None]:
        """Newest first; the cursor is the id of the page's last task.

        Raises ValueError for a cursor this store did not hand out.
        """
        if limit < 1:
            raise ValueError("limit must be at least 1")
        index = self._index_key(owner)
        if cursor is not None and parse_task_id(cursor) is None:
            raise ValueError(f"invalid cursor {cursor!r}")
        top = "+" if cursor is None else f"({_index_member(cursor)}"
        # limit + 1 matches tell whether another page follows; a status filter reads
        # statuses in larger batches since many entries may not match
        batch = limit + 1 if status is None else max(limit + 1, 100)
        found: list[Task] = []
        with _unavailable():
            while len(found) <= limit:
                members: list[Any] = await self._r.zrevrangebylex(index, top, "-", 0, batch)
                if not members:
                    break
                async with self._r.pipeline(transaction=False) as pipe:
                    for member in members:
                        pipe.hget(self._task_key(_task_id(member)), "status")
                    statuses: list[str | None] = await pipe.execute()
                matches = [
                    m
                    for m, s in zip(members, statuses, strict=True)
                    if s is not None and (status is None or s == status.value)
                ]
                taken = matches[: limit + 1 - len(found)]
                async with self._r.pipeline(transaction=False) as pipe:
                    for member in taken:
                        pipe.hget(self._task_key(_task_id(member)), "data")
                    found += [Task.from_storage(d) for d in await pipe.execute() if d]
                gone = [m for m, s in zip(members, statuses, strict=True) if s is None]
                if gone:
                    await self._r.zrem(index, *gone)
                if len(members) < batch and len(taken) == len(matches):
                    break
                # resume after the last entry looked at (a task may have expired between
                # the two reads, leaving this page short)
                top = f"({taken[-1] if len(taken) < len(matches) else members[-1]}"
        if len(found) > limit:
            return found[:limit], found[limit - 1].id
        return found, None

    async def pending_count(self) -> int:
        with _unavailable():
            total = await self._r.hget(self._pending_key, "total")
        return int(total or 0)

    async def queue_depths(self) -> dict[int, int]:
        levels = list(range(NUM_PRIORITIES))
        with _unavailable():
            counts = await self._r.hmget(self._pending_key, [str(p) for p in levels])
        return {p: int(n or 0) for p, n in zip(levels, counts, strict=True)}

    # --- both -------------------------------------------------------------------------
    async def update_task(
        self, task: Task, events: Sequence[tuple[str, dict[str, Any]]] = ()
    ) -> bool:
        new_rev = task.rev + 1
        deliveries = task_deliveries(task, events)
        args: list[str | int] = [
            task.rev,
            new_rev,
            task.model_copy(update={"rev": new_rev}).to_storage(),
            task.status.value,
            "1" if is_terminal(task.status) else "0",
            self._ttl,
            task.id,
            self._delivery_key(""),
            len(deliveries),
        ]
        for entry in deliveries:
            args += [entry.webhook_id, entry.to_storage(), entry.host]
        for name, data in events:
            args += [name, json.dumps(data)]
        keys = [
            self._task_key(task.id),
            self._pending_key,
            self._events_key(task.id),
            self._outbox_key,
            self._notice_key(Notice.cancel),
            self._notice_key(Notice.outbox),
        ]
        with _unavailable():
            written = await self._update(keys=keys, args=args)
        if written:
            task.rev = new_rev
        return bool(written)

    # --- worker side ------------------------------------------------------------------
    async def claim(self, consumer: str, priorities: Sequence[int], block_ms: int) -> Claim | None:
        """Tries the levels in order, then one XREADGROUP BLOCK over them all.

        That blocking read can return entries of several levels at once (when they arrive
        between the two calls); the first in ``priorities`` order is kept and the others
        are released, which puts them at the end of their queues.
        """
        check_priorities(priorities)
        keys = [self._queue_key(p) for p in priorities]
        with _unavailable():
            hit = await self._grouped(lambda: self._claim(keys=keys, args=[GROUP, consumer]))
        if hit:
            return Claim(hit[2], priorities[hit[0] - 1], hit[1])
        if block_ms <= 0:  # BLOCK 0 would wait forever
            return None
        with _unavailable():
            async with asyncio.timeout(block_ms / 1000 + self._timeout):
                try:
                    reply: Any = await self._grouped(
                        lambda: self._rb.xreadgroup(
                            GROUP, consumer, dict.fromkeys(keys, ">"), count=1, block=block_ms
                        ),
                        again=False,
                    )
                except rexc.ResponseError as e:
                    if not str(e).startswith(_GROUP_LOST):
                        raise
                    return None  # the groups are back: the next claim reads them
        got = {
            keys.index(key): Claim(fields["task"], priorities[keys.index(key)], entry_id)
            for key, entries in reply
            for entry_id, fields in entries
        }
        if not got:
            return None
        first, *rest = (got[i] for i in sorted(got))
        for extra in rest:
            await self.release(extra)
        return first

    async def reclaim(self, consumer: str, min_idle_s: float, limit: int = 10) -> list[Claim]:
        if limit < 1:
            return []
        keys = [*(self._queue_key(p) for p in range(NUM_PRIORITIES)), self._workers_key]
        args: list[str | int] = [GROUP, consumer, int(min_idle_s * 1000), limit]
        with _unavailable():
            taken = await self._grouped(lambda: self._reclaim(keys=keys, args=args))
        return [Claim(task_id, int(p), entry_id) for p, entry_id, task_id in taken]

    async def renew(self, consumer: str, claims: Sequence[Claim]) -> None:
        """Resets the idle time of the claims ``consumer`` still holds; others are skipped."""
        if not claims:
            return
        keys = [self._queue_key(c.priority) for c in claims]
        with _unavailable():
            args = [GROUP, consumer, *(c.receipt for c in claims)]
            await self._grouped(lambda: self._renew(keys=keys, args=args))

    async def ack(self, claim: Claim) -> None:
        key = self._queue_key(claim.priority)
        with _unavailable():
            async with self._r.pipeline(transaction=True) as pipe:
                pipe.xack(key, GROUP, claim.receipt)
                pipe.xdel(key, claim.receipt)
                await pipe.execute()

    async def release(self, claim: Claim) -> None:
        keys = [self._queue_key(claim.priority)]
        with _unavailable():
            await self._release(keys=keys, args=[GROUP, claim.receipt, claim.task_id])

    # --- events -----------------------------------------------------------------------
    async def read_events(
        self, task_id: str, after: str | None, block_ms: int = 0, limit: int = 100
    ) -> list[Event]:
        """Event ids are stream ids; an ``after`` that is not one reads from the start."""
        key = self._events_key(task_id)
        if after is not None and not _STREAM_ID.match(after):
            after = None
        with _unavailable():
            entries: Any = await self._r.xrange(
                key, "-" if after is None else f"({after}", "+", limit
            )
            if not entries and block_ms > 0:
                async with asyncio.timeout(block_ms / 1000 + self._timeout):
                    reply: Any = await self._rb.xread(
                        {key: after or "0-0"}, count=limit, block=block_ms
                    )
                entries = [entry for _, stream_entries in reply for entry in stream_entries]
        return [Event(i, f["event"], json.loads(f["data"])) for i, f in entries]

    # --- streamed text (delta events) -------------------------------------------------
    async def append_events(
        self, task_id: str, events: Sequence[tuple[str, dict[str, Any]]]
    ) -> bool:
        if not events:
            return True
        args = [part for name, data in events for part in (name, json.dumps(data))]
        keys = [self._task_key(task_id), self._events_key(task_id)]
        with _unavailable():
            return bool(await self._append(keys=keys, args=args))

    # --- notices ----------------------------------------------------------------------
    async def read_notices(
        self, topic: Notice, after: str | None, block_ms: int
    ) -> tuple[str, list[str]]:
        """The cursor is a stream id; None starts after the newest notice."""
        key = self._notice_key(topic)
        with _unavailable():
            if after is None:
                newest: Any = await self._r.xrevrange(key, "+", "-", count=1)
                after = newest[0][0] if newest else "0-0"
            entries: Any = await self._r.xrange(key, f"({after}", "+", 100)
            if not entries and block_ms > 0:
                async with asyncio.timeout(block_ms / 1000 + self._timeout):
                    reply: Any = await self._rb.xread({key: after}, count=100, block=block_ms)
                entries = [entry for _, stream_entries in reply for entry in stream_entries]
        if not entries:
            return after, []
        return entries[-1][0], [fields["v"] for _, fields in entries]

    # --- webhook outbox ---------------------------------------------------------------
    async def enqueue_deliveries(self, entries: Sequence[OutboxEntry]) -> None:
        if not entries:
            return
        args: list[str | int] = [self._delivery_key(""), self._ttl]
        for entry in entries:
            args += [entry.webhook_id, entry.to_storage(), entry.host]
        keys = [self._outbox_key, self._notice_key(Notice.outbox)]
        with _unavailable():
            await self._enqueue(keys=keys, args=args)

    async def claim_deliveries(
        self,
        consumer: str,
        limit: int,
        lease_s: float,
        *,
        host_room: Mapping[str, int],
        per_host: int,
    ) -> tuple[list[OutboxEntry], float | None]:
        if limit < 1:
            return [], None
        args: list[str | int] = [
            consumer,
            limit,
            round(lease_s * 1000),
            per_host,
            self._delivery_key(""),
            limit + _DELIVERY_SCAN,
            _BUSY_HOST_DEFER_MS,
        ]
        for host, room in host_room.items():
            args += [host, room]
        with _unavailable():
            datas, wait_ms = await self._claim_deliveries(keys=[self._outbox_key], args=args)
        entries = [OutboxEntry.from_storage(d) for d in datas]
        return entries, None if wait_ms is None else int(wait_ms) / 1000

    async def retry_delivery(self, consumer: str, entry: OutboxEntry, delay_s: float) -> bool:
        keys = [self._outbox_key, self._delivery_key(entry.webhook_id)]
        args: list[str | int] = [
            consumer,
            entry.webhook_id,
            entry.to_storage(),
            round(delay_s * 1000),
        ]
        with _unavailable():
            return bool(await self._retry_delivery(keys=keys, args=args))

    async def finish_delivery(self, webhook_id: str) -> None:
        with _unavailable():
            async with self._r.pipeline(transaction=True) as pipe:
                pipe.zrem(self._outbox_key, webhook_id)
                pipe.delete(self._delivery_key(webhook_id))
                await pipe.execute()

    async def outbox_depth(self) -> int:
        with _unavailable():
            return int(await self._r.zcard(self._outbox_key))

    # --- liveness ---------------------------------------------------------------------
    async def register_worker(self, worker_id: str, ttl_s: float) -> None:
        with _unavailable():
            await self._register(keys=[self._workers_key], args=[worker_id, ttl_s])

    async def unregister_worker(self, worker_id: str) -> None:
        with _unavailable():
            await self._r.zrem(self._workers_key, worker_id)

    async def live_workers(self) -> int:
        with _unavailable():
            return int(await self._live(keys=[self._workers_key]))

    # --- the OpenAI-compatible APIs: files, batches, responses --------------------------
    @cached_property
    def _object_scripts(self) -> dict[str, AsyncScript]:
        sources = {
            "create": _CREATE_OBJECT,
            "update": _UPDATE_OBJECT,
            "acquire": _ACQUIRE_LEASE,
            "release": _RELEASE_LEASE,
        }
        return {name: self._r.register_script(src) for name, src in sources.items()}

    def _object_key(self, kind: str, obj_id: str) -> str:
        return f"{self._prefix}:obj:{kind}:{obj_id}"

    def _objects_key(self, kind: str, owner: str) -> str:
        return f"{self._prefix}:objs:{kind}:{owner}"

    def _active_key(self, kind: str) -> str:
        return f"{self._prefix}:active:{kind}"

    async def batch_pending_count(self) -> int:
        with _unavailable():
            lines = await self._r.hget(self._pending_key, "batch")
        return int(lines or 0)

    async def get_tasks(self, task_ids: Sequence[str]) -> list[Task | None]:
        if not task_ids:
            return []
        with _unavailable():
            async with self._r.pipeline(transaction=False) as pipe:
                for task_id in task_ids:
                    pipe.hget(self._task_key(task_id), "data")
                found: list[str | None] = await pipe.execute()
        return [None if d is None else Task.from_storage(d) for d in found]

    async def create_object(self, obj: StoredObject, *, ttl_s: float) -> bool:
        keys = [
            self._object_key(obj.kind, obj.id),
            self._objects_key(obj.kind, obj.owner),
            self._active_key(obj.kind),
        ]
        active = "1" if obj.active else "0"
        member = f"{obj.sort_key} {obj.id}"
        args: list[str | int] = [
            json.dumps(obj.data),
            obj.owner,
            obj.sort_key,
            active,
            _ms(ttl_s),
            member,
        ]
        with _unavailable():
            created = await self._object_scripts["create"](keys=keys, args=args)
        if created:
            obj.rev = 0
        return bool(created)

    async def get_object(self, kind: str, obj_id: str) -> StoredObject | None:
        with _unavailable():
            fields: Any = await self._r.hgetall(self._object_key(kind, obj_id))
        return _object(kind, obj_id, fields)

    async def update_object(self, obj: StoredObject, *, ttl_s: float | None = None) -> bool:
        keys = [self._object_key(obj.kind, obj.id), self._active_key(obj.kind)]
        args: list[str | int] = [
            obj.rev,
            json.dumps(obj.data),
            "1" if obj.active else "0",
            "" if ttl_s is None else _ms(ttl_s),
            f"{obj.sort_key} {obj.id}",
        ]
        with _unavailable():
            written = await self._object_scripts["update"](keys=keys, args=args)
        if written:
            obj.rev += 1
        return bool(written)

    async def delete_object(self, kind: str, obj_id: str) -> bool:
        obj = await self.get_object(kind, obj_id)
        if obj is None:
            return False
        member = f"{obj.sort_key} {obj.id}"
        with _unavailable():
            async with self._r.pipeline(transaction=True) as pipe:
                pipe.delete(self._object_key(kind, obj_id))
                pipe.zrem(self._objects_key(kind, obj.owner), member)
                pipe.zrem(self._active_key(kind), member)
                deleted, *_ = await pipe.execute()
        return bool(deleted)

    async def list_objects(
        self, kind: str, owner: str, *, after: str | None, limit: int
    ) -> tuple[list[StoredObject], bool]:
        if limit < 1:
            raise ValueError("limit must be at least 1")
        top = "+"
        if after is not None:
            last = await self.get_object(kind, after)
            if last is None or last.owner != owner:
                raise ValueError(f"unknown cursor {after!r}")
            top = f"({last.sort_key} {last.id}"
        index = self._objects_key(kind, owner)
        found: list[StoredObject] = []
        with _unavailable():
            while len(found) <= limit:
                members: list[Any] = await self._r.zrevrangebylex(index, top, "-", 0, limit + 1)
                if not members:
                    break
                async with self._r.pipeline(transaction=False) as pipe:
                    for member in members:
                        pipe.hgetall(self._object_key(kind, _task_id(member)))
                    rows: list[Any] = await pipe.execute()
                gone = []
                for member, fields in zip(members, rows, strict=True):
                    obj = _object(kind, _task_id(member), fields)
                    if obj is None:
                        gone.append(member)
                    else:
                        found.append(obj)
                if gone:
                    await self._r.zrem(index, *gone)
                top = f"({members[-1]}"
        return found[:limit], len(found) > limit

    async def active_objects(self, kind: str) -> list[str]:
        key = self._active_key(kind)
        with _unavailable():
            members: list[Any] = await self._r.zrangebylex(key, "-", "+")
            if not members:
                return []
            async with self._r.pipeline(transaction=False) as pipe:
                for member in members:
                    pipe.exists(self._object_key(kind, _task_id(member)))
                alive: list[int] = await pipe.execute()
            gone = [m for m, live in zip(members, alive, strict=True) if not live]
            if gone:
                await self._r.zrem(key, *gone)
        return [_task_id(m) for m, live in zip(members, alive, strict=True) if live]

    async def put_blob(self, key: str, data: str, *, ttl_s: float) -> None:
        with _unavailable():
            await self._r.set(f"{self._prefix}:blob:{key}", data, px=_ms(ttl_s))

    async def get_blob(self, key: str) -> str | None:
        with _unavailable():
            data: Any = await self._r.get(f"{self._prefix}:blob:{key}")
        return None if data is None else str(data)

    async def delete_blob(self, key: str) -> None:
        with _unavailable():
            await self._r.delete(f"{self._prefix}:blob:{key}")

    async def put_part(self, key: str, index: int, data: str, *, ttl_s: float) -> None:
        name = f"{self._prefix}:parts:{key}"
        with _unavailable():
            async with self._r.pipeline(transaction=True) as pipe:
                pipe.hset(name, str(index), data)
                pipe.pexpire(name, _ms(ttl_s))
                await pipe.execute()

    async def get_parts(self, key: str) -> dict[int, str]:
        with _unavailable():
            parts: Any = await self._r.hgetall(f"{self._prefix}:parts:{key}")
        return {int(i): data for i, data in parts.items()}

    async def delete_parts(self, key: str) -> None:
        with _unavailable():
            await self._r.delete(f"{self._prefix}:parts:{key}")

    async def acquire_lease(self, name: str, holder: str, ttl_s: float) -> bool:
        keys = [f"{self._prefix}:lease:{name}"]
        with _unavailable():
            return bool(await self._object_scripts["acquire"](keys=keys, args=[holder, _ms(ttl_s)]))

    async def release_lease(self, name: str, holder: str) -> None:
        keys = [f"{self._prefix}:lease:{name}"]
        with _unavailable():
            await self._object_scripts["release"](keys=keys, args=[holder])


def _object(kind: str, obj_id: str, fields: dict[str, str]) -> StoredObject | None:
    """The object of a hash read by HGETALL (empty: gone)."""
    if "data" not in fields:
        return None
    return StoredObject(
        kind=kind,
        id=obj_id,
        owner=fields.get("owner", ""),
        sort_key=fields.get("sort_key", ""),
        data=json.loads(fields["data"]),
        rev=int(fields.get("rev", 0)),
        active=fields.get("active") == "1",
    )
