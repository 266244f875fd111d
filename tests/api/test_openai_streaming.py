"""``/v1/chat/completions`` with ``stream: true``: tokens as they are generated, read with
the official ``openai`` SDK."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from openai import AsyncOpenAI

from ponder.config import Settings
from tests.api.test_events import read_stream
from tests.api.test_openai_compat import ask, extra
from tests.conftest import LiveServer

pytestmark = pytest.mark.timeout(60)

#: 40 words at 20 ms a step: a sample writes for ~0.8 s, several delta intervals
SLOW = {"scripted_step_ms": [20.0, 0.0]}


@pytest.fixture
async def live(settings: Settings) -> AsyncIterator[LiveServer]:
    async with LiveServer(settings.model_copy(update=SLOW), workers=1) as server:
        yield server


@pytest.fixture
async def sdk(live: LiveServer) -> AsyncIterator[AsyncOpenAI]:
    async with AsyncOpenAI(base_url=f"{live.url}/v1", api_key="unused", max_retries=0) as c:
        yield c


async def collect(
    stream: Any, live: LiveServer, name: str
) -> tuple[list[Any], list[tuple[str, str]]]:
    """The chunks, and each one's ``name`` field (content or reasoning_content) with the
    task's status when the chunk arrived (read from the service), for those that have text."""
    chunks, written = [], []
    async with httpx.AsyncClient(base_url=live.url) as c:
        async for chunk in stream:
            chunks.append(chunk)
            tasks = (await c.get("/v1/tasks")).json()["data"]
            if piece := delta_field(chunk, name):
                written.append((piece, tasks[0]["status"]))
    return chunks, written


def delta_field(chunk: Any, name: str) -> str:
    if not chunk.choices:
        return ""
    delta = chunk.choices[0].delta
    value = getattr(delta, name, None) if name == "content" else (delta.model_extra or {}).get(name)
    return value or ""


async def test_fast_mode_streams_its_sample_as_the_content(
    sdk: AsyncOpenAI, live: LiveServer
) -> None:
    stream = await sdk.chat.completions.create(
        model="ponder-fast",
        messages=ask("[[answers: 6]] [[tokens: 40]]"),
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks, written = await collect(stream, live, "content")
    # the text came in several pieces, most while the task still ran
    assert len(written) >= 3
    assert sum(status == "running" for _, status in written) >= 2
    text = "".join(p for p, _ in written)
    ponder = extra(next(c for c in chunks if c.choices and c.choices[0].finish_reason))
    assert text == ponder["text"] and text.endswith("The answer is 6.")
    assert all(delta_field(c, "reasoning_content") == "" for c in chunks)
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 40
    # the same answer as without streaming
    plain = await sdk.chat.completions.create(
        model="ponder-fast", messages=ask("[[answers: 6]] [[tokens: 40]]")
    )
    assert plain.choices[0].message.content == text


async def test_standard_mode_streams_the_leader_as_reasoning_then_the_fused_answer(
    sdk: AsyncOpenAI, live: LiveServer
) -> None:
    stream = await sdk.chat.completions.create(
        model="ponder",
        messages=ask("[[answers: 5, 7, 5]] [[tokens: 40]]"),
        stream=True,
        extra_body={"mode": "standard"},
    )
    chunks, reasoning = await collect(stream, live, "reasoning_content")
    assert len(reasoning) >= 3
    assert any(status == "running" for _, status in reasoning)
    content = "".join(delta_field(c, "content") for c in chunks)
    last = next(c for c in chunks if c.choices and c.choices[0].finish_reason)
    ponder = extra(last)
    assert content == ponder["text"] and ponder["answer"] == "5"
    async with httpx.AsyncClient(base_url=live.url) as c:
        task = (await c.get(f"/v1/tasks/{ponder['task_id']}")).json()
    leader_text = "".join(r for r, _ in reasoning)
    assert any(s["text"].startswith(leader_text) for s in task["samples"] if s["text"])


async def test_n_choices_end_with_their_answers(sdk: AsyncOpenAI) -> None:
    stream = await sdk.chat.completions.create(
        model="ponder", messages=ask("[[answers: 1, 2, 1]] [[tokens: 20]]"), stream=True, n=2
    )
    texts: dict[int, str] = {}
    reasoning = ""
    async for chunk in stream:
        reasoning += delta_field(chunk, "reasoning_content")
        for choice in chunk.choices:
            texts[choice.index] = texts.get(choice.index, "") + (choice.delta.content or "")
    assert sorted(texts) == [0, 1] and all(texts.values())
    assert texts[0].endswith("The answer is 1.")
    assert reasoning


async def test_a_client_leaving_mid_stream_cancels_its_task(live: LiveServer) -> None:
    body = {"model": "ponder-fast", "messages": ask("[[tokens: 400]]"), "stream": True}
    async with httpx.AsyncClient(base_url=live.url, timeout=30) as c:
        async with c.stream("POST", "/v1/chat/completions", json=body) as r:
            contents = 0
            async for line in r.aiter_lines():
                contents += '"content":"' in line and '"content":""' not in line
                if contents == 2:
                    break  # tokens are flowing: leave
        (task,) = (await c.get("/v1/tasks")).json()["data"]
        events = await read_stream(c, task["id"])  # ends when the task does
    assert events[-1][1:] == ("status", {"status": "cancelled"})
