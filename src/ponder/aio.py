"""Small asyncio helpers shared by the long-running parts (worker, delivery loop, app)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

__all__ = ["cancel_and_wait"]

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
