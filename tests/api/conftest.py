"""What the OpenAI API tests share: the live service (one worker loop, a quick batch
feeder) and the official OpenAI SDK on it. A test module may define its own."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from openai import AsyncOpenAI

from ponder.config import Settings
from tests.api.sdk import fast_settings
from tests.conftest import LiveServer


@pytest.fixture
async def live(settings: Settings) -> AsyncIterator[LiveServer]:
    async with LiveServer(fast_settings(settings), workers=1) as server:
        yield server


@pytest.fixture
async def sdk(live: LiveServer) -> AsyncIterator[AsyncOpenAI]:
    async with AsyncOpenAI(base_url=f"{live.url}/v1", api_key="unused", max_retries=0) as c:
        yield c
