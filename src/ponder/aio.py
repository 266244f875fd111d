"""Small asyncio helpers shared by the long-running parts (worker, delivery loop, app)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Iterable
from typing import Any, TypeVar

__all__ = ["cancel_and_wait", "first_of"]

A = TypeVar("A")
B = TypeVar("B")

_RECANCEL_S = 0.1


async def cancel_and_wait(tasks: Iterable[asyncio.Task[Any]], *, grace_s: float = 0.0) -> None:
    """Cancel ``tasks`` and wait until every one has ended (their errors are dropped).

    A task still running a moment after its cancel is cancelled again: on Python 3.11
    ``asyncio.wait_for``, which redis-py uses for socket writes, swallows a cancellation
    that arrives as its inner call completes, and the task goes on as if never cancelled.
    ``grace_s`` lengthens that moment after the first cancel, for tasks whose clean-up
    awaits (a second cancel would cut it short).
    """
    tasks = list(tasks)
    running = {t for t in tasks if not t.done()}
    wait_s = max(grace_s, _RECANCEL_S)
    while running:
        for task in running:
            task.cancel()
        _, running = await asyncio.wait(running, timeout=wait_s)
        wait_s = _RECANCEL_S
    await asyncio.gather(*tasks, return_exceptions=True)


async def first_of(first: Awaitable[A], second: Awaitable[B], *, grace_s: float = 0.0) -> A | B:
    """Run ``first`` and ``second`` together until one ends ("the task ended" or "the
    client left"); cancel the other and wait until it has ended (:func:`cancel_and_wait`:
    its error is dropped, ``grace_s`` as there).

    Returns the result of the one that ended, or raises its error; when both ended in
    the same step, ``first``'s. Cancelled itself, it cancels both and waits for them.
    """
    a, b = asyncio.ensure_future(first), asyncio.ensure_future(second)
    try:
        done, _ = await asyncio.wait((a, b), return_when=asyncio.FIRST_COMPLETED)
    finally:
        await cancel_and_wait((a, b), grace_s=grace_s)
    return a.result() if a in done else b.result()
