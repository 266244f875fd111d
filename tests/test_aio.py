"""ponder.aio: first of two, the other cancelled and awaited."""

from __future__ import annotations

import asyncio

import pytest

from ponder.aio import first_of

pytestmark = pytest.mark.timeout(10)


async def forever(ended: list[str], name: str, started: asyncio.Event | None = None) -> str:
    if started is not None:
        started.set()
    try:
        await asyncio.Event().wait()
    finally:
        ended.append(name)
    return name


async def test_the_first_to_end_wins_and_the_other_is_cancelled_and_awaited() -> None:
    ended: list[str] = []
    gate = asyncio.Event()

    async def soon() -> int:
        await gate.wait()
        return 7

    gate.set()
    assert await first_of(forever(ended, "a"), soon()) == 7
    assert ended == ["a"]  # its clean-up ran before first_of returned
    assert await first_of(soon(), forever(ended, "b")) == 7
    assert ended == ["a", "b"]


async def test_the_winners_error_is_raised() -> None:
    ended: list[str] = []

    async def fails() -> None:
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        await first_of(forever(ended, "a"), fails())
    assert ended == ["a"]


async def test_when_both_end_together_the_first_given_wins() -> None:
    done: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    done.set_result("x")
    other: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    other.set_result("y")
    assert await first_of(done, other) == "x"
    assert await first_of(other, done) == "y"


async def test_a_cancel_cancels_both() -> None:
    ended: list[str] = []
    started = asyncio.Event()
    waiting = asyncio.create_task(first_of(forever(ended, "a"), forever(ended, "b", started)))
    await started.wait()  # both run (the second starts after the first)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert sorted(ended) == ["a", "b"]
