"""The OpenAI engine's streaming (``stream: true`` upstream, text to ``on_text``), against a
real OpenAI-compatible streaming server on loopback that runs the real local model.

The server answers ``stream: true`` with ``chat.completion.chunk`` events as OpenAI does:
a role chunk, one chunk per piece of text the model writes (``on_text`` of the local
engine), a last chunk per choice with its finish reason and log-probabilities, the usage
chunk when ``stream_options.include_usage`` asks, then ``data: [DONE]``. It can be told
to break the stream after its first piece.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest
from fastapi import Request
from fastapi.responses import StreamingResponse
from openai import AsyncOpenAI

from ponder.config import Settings
from ponder.engines.base import SampleOutput, SampleRequest
from ponder.engines.openai import OpenAIEngine
from ponder.engines.openvino import OpenVINOEngine
from ponder.errors import EngineError
from tests.conftest import LiveServer, ThreadedServer
from tests.engines.test_openai import CAPITAL, HAIKU, CompatServer, make_engine

pytestmark = [pytest.mark.model, pytest.mark.timeout(120)]


class StreamingServer(CompatServer):
    """The compat server of ``test_openai``, streaming when the body asks."""

    def reset(self) -> None:
        super().reset()
        #: end the connection abruptly after the first piece of text
        self.break_after_first = False

    async def complete(self, body: dict[str, Any], request: Request) -> Any:
        if not body.get("stream"):
            return await super().complete(body, request)
        self.bodies.append(body)
        return StreamingResponse(self._chunks(body), media_type="text/event-stream")

    async def _chunks(self, body: dict[str, Any]) -> AsyncIterator[bytes]:
        n = int(body.get("n", 1))
        pieces: asyncio.Queue[tuple[int, str]] = asyncio.Queue()

        def listener(i: int) -> Callable[[str], None]:
            return lambda text: pieces.put_nowait((i, text))

        rows = [
            SampleRequest(
                messages=body["messages"],
                temperature=float(body.get("temperature", 1.0)),
                max_new_tokens=int(body.get("max_tokens", 16)),
                seed=None if body.get("seed") is None else int(body["seed"]) + i,
                on_text=listener(i),
            )
            for i in range(n)
        ]
        runs = [asyncio.create_task(self.engine.submit(row)) for row in rows]
        head = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "model": body["model"]}

        def chunk(**fields: Any) -> bytes:
            return f"data: {json.dumps({**head, **fields})}\n\n".encode()

        try:
            for i in range(n):
                yield chunk(choices=[{"index": i, "delta": {"role": "assistant"}}])
            sent = 0
            while not all(run.done() for run in runs) or not pieces.empty():
                getter = asyncio.ensure_future(pieces.get())
                await asyncio.wait([getter, *runs], return_when=asyncio.FIRST_COMPLETED)
                if not getter.done():
                    getter.cancel()
                    continue
                i, text = getter.result()
                yield chunk(choices=[{"index": i, "delta": {"content": text}}])
                sent += 1
                if self.break_after_first and sent == 1:
                    raise RuntimeError("the server fails mid-stream")  # uvicorn drops it
            outputs = [run.result() for run in runs]
            for i, out in enumerate(outputs):
                logprobs = [{"token": "", "logprob": p} for p in out.token_logprobs or []]
                last = {"index": i, "delta": {}, "finish_reason": out.finish_reason,
                        "logprobs": {"content": logprobs}}  # fmt: skip
                yield chunk(choices=[last])
            if (body.get("stream_options") or {}).get("include_usage"):
                completion = sum(o.completion_tokens for o in outputs)
                usage = {"prompt_tokens": outputs[0].prompt_tokens, "completion_tokens": completion}
                yield chunk(choices=[], usage=usage)
            yield b"data: [DONE]\n\n"
        finally:
            for run in runs:
                run.cancel()


@pytest.fixture(scope="module")
def streaming_server(model_engine: OpenVINOEngine) -> Iterator[tuple[StreamingServer, str]]:
    compat = StreamingServer(model_engine)
    with ThreadedServer(compat.app, lifespan="off", log_level="critical") as live:
        yield compat, f"{live.url}/v1"


@pytest.fixture
async def engine(streaming_server: tuple[StreamingServer, str]) -> AsyncIterator[OpenAIEngine]:
    streaming_server[0].reset()
    client = make_engine(streaming_server[1], openai_max_retries=2)
    await client.start()
    yield client
    await client.close()


async def test_a_listened_row_streams_its_text_as_it_arrives(
    engine: OpenAIEngine, streaming_server: tuple[StreamingServer, str],
    model_engine: OpenVINOEngine,
) -> None:  # fmt: skip
    loop = asyncio.get_running_loop()
    pieces: list[tuple[float, str]] = []
    row = SampleRequest(
        prompt=HAIKU, max_new_tokens=24, on_text=lambda t: pieces.append((loop.time(), t))
    )
    output = await engine.submit(row)
    done_at = loop.time()
    body = streaming_server[0].bodies[-1]
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert len(pieces) > 1 and pieces[0][0] < done_at  # text came before the answer
    assert "".join(text for _, text in pieces) == output.text
    # the same answer a plain request to the local engine gets
    local = await model_engine.submit(SampleRequest(prompt=HAIKU, max_new_tokens=24))
    assert (output.text, output.finish_reason) == (local.text, local.finish_reason)
    assert output.completion_tokens == local.completion_tokens == 24
    assert output.prompt_tokens == local.prompt_tokens
    assert output.mean_logprob == pytest.approx(local.mean_logprob, abs=1e-4)


async def test_choices_of_one_request_reach_their_own_rows(
    engine: OpenAIEngine, streaming_server: tuple[StreamingServer, str]
) -> None:
    texts: list[list[str]] = [[], [], []]
    rows = [
        SampleRequest(
            prompt=HAIKU,
            temperature=1.0,
            seed=7,
            max_new_tokens=12,
            task_id="t1",
            on_text=texts[i].append,
        )
        for i in range(3)
    ]
    outputs = await asyncio.gather(*(engine.submit(r) for r in rows))
    assert [b.get("n", 1) for b in streaming_server[0].bodies] == [3]
    for out, pieces in zip(outputs, texts, strict=True):
        assert out.text and "".join(pieces) == out.text
    assert len({out.text for out in outputs}) > 1


async def test_rows_without_listeners_or_followers_are_not_streamed(
    engine: OpenAIEngine, streaming_server: tuple[StreamingServer, str]
) -> None:
    output = await engine.submit(SampleRequest(prompt=CAPITAL, max_new_tokens=4))
    assert output.completion_tokens == 4
    assert "stream" not in streaming_server[0].bodies[-1]
    # a listener whose text nobody follows yet (the worker's, before a follow notice)
    pieces: list[str] = []
    row = SampleRequest(prompt=CAPITAL, max_new_tokens=4, on_text=pieces.append, stream=False)
    assert (await engine.submit(row)).text == output.text
    assert "stream" not in streaming_server[0].bodies[-1] and pieces == []


async def test_a_stream_broken_after_its_first_piece_fails_the_row_without_a_retry(
    engine: OpenAIEngine, streaming_server: tuple[StreamingServer, str]
) -> None:
    streaming_server[0].break_after_first = True
    pieces: list[str] = []
    row = SampleRequest(prompt=HAIKU, max_new_tokens=24, on_text=pieces.append)
    with pytest.raises(EngineError, match="broke"):
        await engine.submit(row)
    assert len(streaming_server[0].bodies) == 1  # the text already given is not given twice
    assert len(pieces) == 1


async def test_a_cancelled_row_abandons_its_stream(engine: OpenAIEngine) -> None:
    started = asyncio.Event()
    row = SampleRequest(
        prompt="Write a long story about a brave dragon.", max_new_tokens=200,
        on_text=lambda _: started.set(),
    )  # fmt: skip
    call = asyncio.create_task(engine.submit(row))
    await asyncio.wait_for(started.wait(), 60)
    row.cancel()
    result: SampleOutput = await asyncio.wait_for(call, 10)
    assert result.finish_reason == "cancelled"


async def test_a_server_that_ignores_stream_answers_plain_json_and_the_row_still_ends(
    model_engine: OpenVINOEngine,
) -> None:
    """Servers that do not stream answer ``stream: true`` with a plain completion: the row
    gets that answer (its text reaches no listener; there is nothing to stream)."""
    plain = CompatServer(model_engine)  # answers every request as plain JSON
    with ThreadedServer(plain.app, lifespan="off", log_level="critical") as live:
        client = make_engine(f"{live.url}/v1")
        await client.start()
        try:
            pieces: list[str] = []
            row = SampleRequest(prompt=CAPITAL, max_new_tokens=4, on_text=pieces.append)
            output = await client.submit(row)
        finally:
            await client.close()
    assert plain.bodies[-1]["stream"] is True
    assert output.completion_tokens == 4 and output.text and pieces == []


async def test_the_service_streams_from_the_server_only_text_that_is_followed(
    settings: Settings, streaming_server: tuple[StreamingServer, str]
) -> None:
    """Through ponder's API and worker: a streamed chat completion (its text followed from
    before its task exists) is streamed from the server; the same request unstreamed is
    asked for a plain answer (nobody reads its text before the end)."""
    server, url = streaming_server
    server.reset()
    opts = {"engine": "openai", "openai_base_url": url, "openai_model": "smollm2"}
    question = [{"role": "user", "content": HAIKU}]
    async with (
        LiveServer(settings.model_copy(update=opts), workers=1) as live,
        AsyncOpenAI(base_url=f"{live.url}/v1", api_key="unused", max_retries=0) as sdk,
    ):
        stream = await sdk.chat.completions.create(
            model="ponder-fast", messages=question, max_tokens=24, temperature=0, stream=True
        )
        pieces = [c.choices[0].delta.content async for c in stream if c.choices]
        assert len([p for p in pieces if p]) > 2  # token by token
        assert [body.get("stream") for body in server.bodies] == [True]
        plain = await sdk.chat.completions.create(
            model="ponder-fast", messages=question, max_tokens=24, temperature=0
        )
        assert plain.choices[0].message.content == "".join(p or "" for p in pieces)
        assert [body.get("stream") for body in server.bodies] == [True, None]
