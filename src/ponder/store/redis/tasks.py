"""Task records on Redis: admission, reads, listings, the compare-and-set write."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any

from ponder.config import NUM_PRIORITIES
from ponder.config.models import DEFAULT_MODEL
from ponder.errors import IdempotencyConflict, QueueFull
from ponder.states import is_terminal
from ponder.store.base import queue_deadline
from ponder.store.contract import TaskRecords
from ponder.store.deliveries import task_deliveries
from ponder.store.records import (
    Admission,
    Claim,
    Notice,
    check_new_task,
    check_page,
    check_priorities,
)
from ponder.store.redis.base import GROUP, RedisBase, index_member, member_id, unavailable
from ponder.types import Task, TaskStatus

__all__ = ["RedisTaskRecords"]


class RedisTaskRecords(RedisBase, TaskRecords):
    """:class:`TaskRecords` on Redis: a hash per task, an owner index, pending counts."""

    # --- api side ---------------------------------------------------------------------
    async def create_task(self, task: Task, admission: Admission) -> tuple[Task, bool]:
        check_new_task(task)
        keys = [
            self._task_key(task.id),
            self._queue_key(task.priority, task.model),
            self._pending_key,
            self._index_key(task.owner),
            self._events_key(task.id),
            self._deadlines_key,
        ]
        if admission.idempotency_key is not None:
            keys.append(f"{self._prefix}:idem:{task.owner}:{admission.idempotency_key}")
        args: list[str | int] = [
            task.id,
            task.to_storage(),
            task.status.value,
            task.rev,
            task.owner,
            task.priority,
            admission.max_pending,
            index_member(task.id),
            json.dumps({"status": task.status.value}),
            admission.body_hash or "",
            self._ttl,
            self._task_key(""),
            "1" if admission.batch else "0",
            "" if task.model == DEFAULT_MODEL else task.model,
            "" if (deadline := queue_deadline(task)) is None else repr(deadline),
        ]
        async with unavailable(self._timeout):
            outcome = await self._create(keys=keys, args=args)
        if outcome[0] == "full":
            raise QueueFull(admission.max_pending)
        if outcome[0] == "conflict":
            raise IdempotencyConflict("the Idempotency-Key was used with another request body")
        if outcome[0] == "existing":
            return Task.from_storage(outcome[1]), False
        return task, True

    async def get_task(self, task_id: str) -> Task | None:
        async with unavailable(self._timeout):
            data = await self._lane.call("HGET", self._task_key(task_id), "data")
        return None if data is None else Task.from_storage(data)

    async def get_tasks(self, task_ids: Sequence[str]) -> list[Task | None]:
        if not task_ids:
            return []
        async with unavailable(self._timeout), self._r.pipeline(transaction=False) as pipe:
            for task_id in task_ids:
                pipe.hget(self._task_key(task_id), "data")
            found: list[str | None] = await pipe.execute()
        return [None if d is None else Task.from_storage(d) for d in found]

    async def list_tasks(
        self, owner: str, *, status: TaskStatus | None, limit: int, cursor: str | None
    ) -> tuple[list[Task], str | None]:
        check_page(limit, cursor)
        index = self._index_key(owner)
        top = "+" if cursor is None else f"({index_member(cursor)}"
        # limit + 1 matches tell whether another page follows; a status filter reads
        # statuses in larger batches since many entries may not match
        batch = limit + 1 if status is None else max(limit + 1, 100)
        found: list[Task] = []
        async with unavailable(self._timeout):
            while len(found) <= limit:
                members: list[Any] = await self._r.zrevrangebylex(index, top, "-", 0, batch)
                if not members:
                    break
                async with self._r.pipeline(transaction=False) as pipe:
                    for member in members:
                        pipe.hget(self._task_key(member_id(member)), "status")
                    statuses: list[str | None] = await pipe.execute()
                matches = [
                    m
                    for m, s in zip(members, statuses, strict=True)
                    if s is not None and (status is None or s == status.value)
                ]
                taken = matches[: limit + 1 - len(found)]
                async with self._r.pipeline(transaction=False) as pipe:
                    for member in taken:
                        pipe.hget(self._task_key(member_id(member)), "data")
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
        async with unavailable(self._timeout):
            total = await self._r.hget(self._pending_key, "total")
        return int(total or 0)

    async def batch_pending_count(self) -> int:
        async with unavailable(self._timeout):
            lines = await self._r.hget(self._pending_key, "batch")
        return int(lines or 0)

    async def queue_depths(self, model: str | None = None) -> dict[int, int]:
        """One HMGET of the pending counts: the levels' (every model's), or the model's.

        The default model's figures are the levels' less the other models' (its tasks
        have no counts of their own: those admitted before there were models are counted
        right).
        """
        if model == DEFAULT_MODEL:
            return (await self.queue_depths_by_model()).get(model, _levels())
        levels = range(NUM_PRIORITIES)
        fields = [str(p) if model is None else _model_field(model, p) for p in levels]
        async with unavailable(self._timeout):
            counts = await self._r.hmget(self._pending_key, fields)
        return {p: int(n or 0) for p, n in enumerate(counts)}

    async def queue_depths_by_model(self) -> dict[str, dict[int, int]]:
        """One HGETALL of the pending counts (a few fields per model, no key scan)."""
        async with unavailable(self._timeout):
            flat: list[str] = await self._lane.call("HGETALL", self._pending_key)
        counts = dict(zip(flat[::2], flat[1::2], strict=True))
        by_model: dict[str, dict[int, int]] = {}
        default = {p: int(counts.get(str(p)) or 0) for p in range(NUM_PRIORITIES)}
        for name, n in counts.items():
            if name.startswith("m:"):
                model, _, level = name[2:].rpartition(":")
                depths = by_model.setdefault(model, _levels())
                depths[int(level)] = int(n)
                default[int(level)] -= int(n)
        return {DEFAULT_MODEL: default} | by_model

    async def expire_due(self, limit: int = 100) -> list[str]:
        """One script over the deadlines' sorted set (ids past their deadline, scored by
        it); it drops an entry whose task is gone or not pending (never left by
        :meth:`update_task`, which removes a task's entry when it leaves ``pending``)."""
        if limit < 1:
            return []
        args: list[str | int] = [repr(time.time()), limit, self._task_key("")]
        async with unavailable(self._timeout):
            due: list[str] = await self._expire_due(keys=[self._deadlines_key], args=args)
        return due

    # --- both -------------------------------------------------------------------------
    async def update_task(
        self,
        task: Task,
        events: Sequence[tuple[str, dict[str, Any]]] = (),
        *,
        ack: Claim | None = None,
    ) -> bool:
        new_rev = task.rev + 1
        deliveries = task_deliveries(task, events)
        args: list[str | int] = [
            task.rev,
            new_rev,
            task.to_storage(rev=new_rev),
            task.status.value,
            "1" if is_terminal(task.status) else "0",
            self._ttl,
            task.id,
            self._delivery_key(""),
            len(deliveries),
            GROUP,
            "" if ack is None else ack.receipt,
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
            self._deadlines_key,
        ]
        if ack is not None:
            keys.append(self._queue_key(ack.priority, ack.model))
        async with unavailable(self._timeout):
            written = await self._update(keys=keys, args=args)
        if written:
            task.rev = new_rev
        return bool(written)

    async def hand_over(
        self, task: Task, claim: Claim, events: Sequence[tuple[str, dict[str, Any]]] = ()
    ) -> bool:
        if task.status is not TaskStatus.running:
            raise ValueError("only a running task is handed over to another model")
        check_priorities([task.priority])
        new_rev = task.rev + 1
        deliveries = task_deliveries(task, events)
        args: list[str | int] = [
            task.rev,
            new_rev,
            task.to_storage(rev=new_rev),
            task.status.value,
            "" if task.model == DEFAULT_MODEL else task.model,
            task.priority,
            task.id,
            GROUP,
            claim.receipt,
            self._delivery_key(""),
            self._ttl,
            len(deliveries),
        ]
        for entry in deliveries:
            args += [entry.webhook_id, entry.to_storage(), entry.host]
        for name, data in events:
            args += [name, json.dumps(data)]
        keys = [
            self._task_key(task.id),
            self._events_key(task.id),
            self._outbox_key,
            self._notice_key(Notice.outbox),
            self._queue_key(claim.priority, claim.model),
            self._queue_key(task.priority, task.model),
        ]
        async with unavailable(self._timeout):
            written = await self._hand_over(keys=keys, args=args)
        if written:
            task.rev = new_rev
        return bool(written)


def _levels() -> dict[int, int]:
    return dict.fromkeys(range(NUM_PRIORITIES), 0)


def _model_field(model: str, priority: int) -> str:
    """The field of ``{p}:pending`` that counts ``model``'s pending tasks at a level
    (models other than the default only)."""
    return f"m:{model}:{priority}"
