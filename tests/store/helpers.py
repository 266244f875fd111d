"""What the store tests share: task factories and steps used by every contract part."""

from __future__ import annotations

import asyncio

from ponder.config.models import DEFAULT_MODEL
from ponder.ids import IdGenerator
from ponder.store import TaskStore
from ponder.store.base import Admission
from ponder.types import Task, TaskStatus

__all__ = ["ALL", "add", "advance", "ids", "let_time_pass", "live", "make_task"]

ALL = [0, 1, 2, 3, 4, 5]
#: the one id generator of the store tests (two generators of one node could repeat an id)
ids = IdGenerator("test1")


def make_task(priority: int = 3, owner: str = "", model: str = DEFAULT_MODEL) -> Task:
    return Task(id=ids.new_id(), priority=priority, prompt="x", owner=owner, model=model)


async def add(
    store: TaskStore, priority: int = 3, owner: str = "", model: str = DEFAULT_MODEL
) -> Task:
    task = make_task(priority, owner, model)
    task, created = await store.create_task(task, Admission(max_pending=1000))
    assert created
    return task


async def advance(store: TaskStore, task: Task, status: TaskStatus) -> None:
    task.status = status
    assert await store.update_task(task, [("status", {"status": status.value})])


async def let_time_pass(seconds: float) -> None:
    """Leases and liveness are measured in time: the tests must let it actually pass."""
    await asyncio.sleep(seconds)


async def live(store: TaskStore, *workers: str) -> None:
    """Register ``workers`` as alive: reclaim takes a dead consumer's entries at once."""
    for worker in workers:
        await store.register_worker(worker, 30)
