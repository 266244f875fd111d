"""The Redis store: shared by any number of API and worker processes.

One class per part of the contract (``tasks``, ``queue``, ``events``, ``objects``,
``outbox``, ``liveness``, ``ratelimits``), each over
:class:`~ponder.store.redis.base.RedisBase` (the connections, scripts and key names);
:class:`RedisStore` is all of them together.

Keys (all under ``settings.key_prefix``, written as ``{p}``):

- ``{p}:task:{id}``: hash ``data`` (:meth:`Task.to_storage`), ``status``, ``rev``,
  ``owner``, ``priority``, and ``model`` for a model other than the default, ``due`` when
  the task has a queue deadline; expires ``task_ttl_s`` after the task reaches a terminal
  state.
- ``{p}:ev:{id}``: the task's event stream (fields ``event``, ``data``); expires with it.
- ``{p}:q:{0..5}``: the default model's (``ponder``) streams, one per priority level
  (field ``task``, and ``data``: the record as admitted), read by the consumer group
  ``workers``; ``{p}:q:{model}:{0..5}``: another model's. An entry's id is the claim's
  receipt; ack deletes the entry, so a stream holds only queued and in-flight tasks. A
  model's groups are made when a worker first reads its queues (and again whenever a read
  finds one missing: NOGROUP).
- ``{p}:pending``: hash of pending counts: ``total``, one field per level (every model's
  tasks) and ``m:{model}:{level}`` for each model other than the default; the default
  model's counts are the levels' less those (so the tasks admitted before there were
  models count as the default's), and the fields name the models with queues: no key is
  scanned for them.
- ``{p}:deadlines``: sorted set of the ids of pending tasks with a queue deadline, scored
  by it (``created_at + queue_timeout_s``, epoch seconds); a task leaves it when a write
  takes it out of ``pending``.
- ``{p}:tasks:{owner}``: sorted set of ``"{sort_key} {id}"``, all with score 0, so a
  lexicographic range walks an owner's tasks in creation order. Entries of expired
  tasks are dropped when a listing meets them.
- ``{p}:idem:{owner}:{key}``: hash ``hash`` + ``id`` of an idempotency key, ``task_ttl_s``.
- ``{p}:workers``: sorted set of worker ids scored by their expiry (Redis server time). A
  consumer of the group that is not in it (or has expired) is dead: :meth:`reclaim` takes
  its entries at once and then removes it from the group. ``{p}:workers:models``: hash
  of each worker's model states (a JSON list), dropped when a reader finds it not live.
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
- ``{p}:rl:{caller}``: a caller's rate-limit bucket, hash ``tokens`` + ``ts``; expires once
  the bucket would be full again.

Every multi-key change is one Lua script (:mod:`ponder.store.redis.lua`), so it is atomic
and needs one round trip.
Scripts read a task record named by id from the idempotency key without declaring it, and
the keys share no hash tag: this store targets a single Redis (or a primary + replicas),
not Redis Cluster.
"""

from __future__ import annotations

from ponder.store.base import TaskStore
from ponder.store.redis.base import GROUP, RedisBase, redacted
from ponder.store.redis.events import RedisEventLog
from ponder.store.redis.liveness import RedisLiveness
from ponder.store.redis.objects import RedisObjects
from ponder.store.redis.outbox import RedisOutbox
from ponder.store.redis.queue import RedisWorkQueue
from ponder.store.redis.ratelimits import RedisRateLimits
from ponder.store.redis.tasks import RedisTaskRecords

__all__ = ["GROUP", "RedisBase", "RedisStore", "redacted"]


class RedisStore(
    RedisTaskRecords,
    RedisWorkQueue,
    RedisEventLog,
    RedisObjects,
    RedisOutbox,
    RedisLiveness,
    RedisRateLimits,
    TaskStore,
):
    """:class:`TaskStore` on Redis (see the module docstring for the key layout)."""
