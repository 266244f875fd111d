"""What the tests that drive the API with the official OpenAI SDK share."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection
from typing import TYPE_CHECKING, Any

from tests.conftest import until

if TYPE_CHECKING:
    from ponder.config import Settings


async def retrieve_until(
    retrieve: Callable[[str], Awaitable[Any]],
    object_id: str,
    statuses: Collection[str],
    timeout_s: float,
    interval_s: float,
) -> Any:
    """What a client of a background object (a response, a batch) does: retrieve it every
    ``interval_s`` until its status is one of ``statuses``; fail after ``timeout_s``."""

    async def reached() -> Any:
        obj = await retrieve(object_id)
        return obj if obj.status in statuses else None

    return await until(reached, timeout_s, f"{object_id} in {sorted(statuses)}", interval_s)


def fast_settings(settings: Settings, **overrides: Any) -> Settings:
    """A batch feeder that ticks quickly, so the tests do not wait on it."""
    return settings.model_copy(update={"batch_tick_s": 0.02, **overrides})
