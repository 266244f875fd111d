"""The OpenAI engine against a real OpenAI-compatible HTTP server on loopback.

The server is a small FastAPI app run by uvicorn on 127.0.0.1, answering
``/v1/chat/completions`` with the real local model (the session's default engine). It
can be told to answer some status codes first, or to ignore ``n`` as some servers do.
"""

from __future__ import annotations

import asyncio
import base64
import json
import math
import socket
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from ponder.config import load_settings
from ponder.engines.base import BaseEngine, SampleOutput, SampleRequest
from ponder.engines.openai import OpenAIEngine, _route_from_env
from ponder.engines.openvino import OpenVINOEngine
from ponder.errors import ConfigError, EngineDeadError, EngineError

pytestmark = pytest.mark.model

CAPITAL = "What is the capital of France?"
HAIKU = "Write a haiku about the sea."


class CompatServer:
    """An OpenAI-compatible chat-completions server over a local engine."""

    def __init__(self, engine: BaseEngine) -> None:
        self.engine = engine
        self.app = FastAPI()
        self.app.post("/v1/chat/completions")(self.complete)
        self.reset()

    def reset(self) -> None:
        #: status codes to answer, one per request, before serving normally
        self.fail_with: list[int] = []
        #: False: answer one choice whatever ``n`` asks (as some servers do)
        self.supports_n = True
        #: the body and the headers of every request received
        self.bodies: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        #: set when a request arrives
        self.received = threading.Event()

    async def complete(self, body: dict[str, Any], request: Request) -> JSONResponse:
        self.bodies.append(body)
        self.headers.append(dict(request.headers))
        self.received.set()
        if self.fail_with:
            status = self.fail_with.pop(0)
            return _error(status, "the server is overloaded", {"Retry-After": "0"})
        temperature = float(body.get("temperature", 1.0))
        if not 0 <= temperature <= 2:
            return _error(400, f"temperature {temperature} is not in [0, 2]")
        n = int(body.get("n", 1)) if self.supports_n else 1
        seed = body.get("seed")
        stop = body.get("stop") or []
        schema, strict = _schema_of(body.get("response_format"))
        requests = [
            SampleRequest(
                messages=body["messages"],
                temperature=temperature,
                top_p=float(body.get("top_p", 1.0)),
                max_new_tokens=int(body.get("max_tokens", 16)),
                # one seed per request: the n samples draw from seed, seed + 1, ...
                seed=None if seed is None else int(seed) + i,
                stop=[stop] if isinstance(stop, str) else list(stop),
                json_schema=schema,
                strict=strict,
            )
            for i in range(n)
        ]
        results = await self.engine.generate(requests)
        outputs = [r for r in results if isinstance(r, SampleOutput)]
        if len(outputs) < len(results):
            return _error(400, str(next(r for r in results if isinstance(r, EngineError))))
        return JSONResponse(
            {
                "object": "chat.completion",
                "model": body.get("model"),
                "choices": [
                    {
                        "index": i,
                        "message": {"role": "assistant", "content": out.text},
                        "finish_reason": out.finish_reason,
                        # the engine knows only the mean log-probability: every token
                        # entry carries it, so that their mean is the engine's
                        "logprobs": {
                            "content": [{"token": "", "logprob": out.mean_logprob}]
                            * out.completion_tokens
                        }
                        if body.get("logprobs")
                        else None,
                    }
                    for i, out in enumerate(outputs)
                ],
                "usage": {
                    "prompt_tokens": outputs[0].prompt_tokens,
                    "completion_tokens": sum(o.completion_tokens for o in outputs),
                },
            }
        )


def _schema_of(response_format: dict[str, Any] | None) -> tuple[dict[str, Any] | None, bool]:
    """The schema (and strict) a ``response_format`` asks for, as OpenAI reads it."""
    if response_format is None or response_format["type"] == "text":
        return None, False
    if response_format["type"] == "json_object":
        return {"type": "object"}, False
    spec = response_format["json_schema"]
    return spec["schema"], bool(spec.get("strict", False))


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    content = {"error": {"message": message, "type": "invalid_request_error"}}
    return JSONResponse(content, status_code=status, headers=headers)


@pytest.fixture(scope="module")
def compat_server(model_engine: OpenVINOEngine) -> Iterator[tuple[CompatServer, str]]:
    """The server and its base URL, run by uvicorn in a thread for this module."""
    compat = CompatServer(model_engine)
    # a socket listening before uvicorn starts: connections wait in its backlog, so the
    # tests need not wait for the server to be up
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    port = sock.getsockname()[1]
    config = uvicorn.Config(compat.app, log_level="warning", lifespan="off", ws="none")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        yield compat, f"http://127.0.0.1:{port}/v1"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()


@pytest.fixture
def server(compat_server: tuple[CompatServer, str]) -> CompatServer:
    compat_server[0].reset()
    return compat_server[0]


def make_engine(base_url: str, **overrides: Any) -> OpenAIEngine:
    settings = load_settings(
        engine="openai", openai_base_url=base_url, openai_model="smollm2", **overrides
    )
    return OpenAIEngine(settings, backoff_s=0.01)


@pytest.fixture
async def engine(
    compat_server: tuple[CompatServer, str], server: CompatServer
) -> AsyncIterator[OpenAIEngine]:
    client = make_engine(compat_server[1])
    await client.start()
    yield client
    await client.close()


def ok(result: SampleOutput | EngineError) -> SampleOutput:
    assert isinstance(result, SampleOutput), result
    return result


async def test_greedy_answers_match_the_local_engine(
    engine: OpenAIEngine, model_engine: OpenVINOEngine
) -> None:
    rows = [
        SampleRequest(prompt=CAPITAL, max_new_tokens=12),
        SampleRequest(prompt=HAIKU, max_new_tokens=3),
        SampleRequest(prompt=CAPITAL, max_new_tokens=12, stop=["Paris"]),
    ]
    remote = [ok(r) for r in await engine.generate(rows)]
    local = [ok(r) for r in await model_engine.generate(rows)]
    for a, b in zip(remote, local, strict=True):
        assert (a.text, a.completion_tokens, a.finish_reason) == (
            b.text,
            b.completion_tokens,
            b.finish_reason,
        )
        assert a.prompt_tokens == b.prompt_tokens
        # float noise: a row's logits in another batch differ by float32 rounding
        assert a.mean_logprob == pytest.approx(b.mean_logprob, abs=2e-3)
    assert remote[1].finish_reason == "length"
    assert "Paris" not in remote[2].text


async def test_rows_sharing_a_prompt_go_as_one_request_with_n(
    engine: OpenAIEngine, server: CompatServer
) -> None:
    rows = [
        SampleRequest(prompt=HAIKU, temperature=1.0, seed=5, max_new_tokens=8, task_id="t1")
        for _ in range(3)
    ]
    other = SampleRequest(prompt=CAPITAL, task_id="t2")
    results = [ok(r) for r in await engine.generate([*rows, other])]
    assert sorted(b.get("n", 1) for b in server.bodies) == [1, 3]
    assert engine.supports_n is True
    assert len({r.text for r in results[:3]}) > 1  # n samples, not one copied
    for r in results:
        assert r.mean_logprob is not None and math.isfinite(r.mean_logprob)
        assert r.mean_logprob < 0 and r.completion_tokens > 0
    assert all(b["logprobs"] is True for b in server.bodies)


async def test_a_server_ignoring_n_gets_one_request_per_row(
    engine: OpenAIEngine, server: CompatServer
) -> None:
    server.supports_n = False
    rows = [
        SampleRequest(prompt=HAIKU, temperature=1.0, max_new_tokens=4, task_id="t1")
        for _ in range(3)
    ]
    assert all(isinstance(r, SampleOutput) for r in await engine.generate(rows))
    assert [b.get("n", 1) for b in server.bodies] == [3, 1, 1]
    assert engine.supports_n is False
    assert all(isinstance(r, SampleOutput) for r in await engine.generate(rows[:2]))
    assert [b.get("n", 1) for b in server.bodies[3:]] == [1, 1]


async def test_a_structured_row_sends_its_schema_as_response_format(
    engine: OpenAIEngine, server: CompatServer
) -> None:
    """The schema goes upstream as OpenAI's ``response_format`` (``json_object`` for the bare
    object); the server here constrains with it (the local engine), and the text comes back
    as the server wrote it."""
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 20}},
        "required": ["city"],
        "additionalProperties": False,
    }
    assert engine.constrains_json and engine.describe()["constrains_json"]
    rows = [
        SampleRequest(prompt=CAPITAL, max_new_tokens=30, json_schema=schema, strict=True),
        SampleRequest(prompt=CAPITAL, max_new_tokens=30, json_schema={"type": "object"}),
        SampleRequest(prompt=CAPITAL, max_new_tokens=8),
    ]
    answers = [ok(r) for r in await engine.generate(rows)]
    formats = sorted(
        (json.dumps(b.get("response_format"), sort_keys=True) for b in server.bodies),
    )
    assert formats == sorted(
        json.dumps(f, sort_keys=True)
        for f in (
            {
                "type": "json_schema",
                "json_schema": {"name": "answer", "schema": schema, "strict": True},
            },
            {"type": "json_object"},
            None,
        )
    )
    jsonschema.validate(json.loads(answers[0].text), schema)
    # a free object may outrun the budget: then it is cut (the vote's validation drops it)
    assert answers[1].text.startswith("{") and answers[1].finish_reason in ("stop", "length")
    assert not answers[2].text.lstrip().startswith("{")


async def test_503_answers_are_retried(engine: OpenAIEngine, server: CompatServer) -> None:
    server.fail_with = [503, 503]
    (result,) = await engine.generate([SampleRequest(prompt=CAPITAL, max_new_tokens=4)])
    assert ok(result).completion_tokens == 4
    assert len(server.bodies) == 3


async def test_retries_are_bounded(
    compat_server: tuple[CompatServer, str], server: CompatServer
) -> None:
    server.fail_with = [429, 500, 502]
    engine = make_engine(compat_server[1], openai_max_retries=1)
    try:
        (result,) = await engine.generate([SampleRequest(prompt=CAPITAL, max_new_tokens=4)])
    finally:
        await engine.close()
    assert isinstance(result, EngineError) and "answered 500" in str(result)
    assert len(server.bodies) == 2


async def test_a_400_fails_its_row_alone(engine: OpenAIEngine, server: CompatServer) -> None:
    good = SampleRequest(prompt=CAPITAL, max_new_tokens=4)
    bad = SampleRequest(prompt=HAIKU, temperature=3.0, max_new_tokens=4)
    results = await engine.generate([good, bad])
    assert ok(results[0]).completion_tokens == 4
    assert isinstance(results[1], EngineError)
    assert "answered 400: temperature 3.0 is not in [0, 2]" in str(results[1])
    assert len(server.bodies) == 2  # no retry


async def test_a_slow_answer_times_out(
    compat_server: tuple[CompatServer, str], server: CompatServer
) -> None:
    engine = make_engine(compat_server[1], openai_timeout_s=0.01)
    try:
        (result,) = await engine.generate([SampleRequest(prompt=HAIKU, max_new_tokens=4)])
    finally:
        await engine.close()
    assert isinstance(result, EngineError) and "within 0.01 s" in str(result)


async def test_a_row_cancelled_in_flight_returns_at_once(
    engine: OpenAIEngine, server: CompatServer
) -> None:
    row = SampleRequest(prompt=HAIKU, max_new_tokens=4)
    call = asyncio.create_task(engine.generate([row]))
    assert await asyncio.to_thread(server.received.wait, 30)
    row.cancel()
    (result,) = await call
    assert ok(result).finish_reason == "cancelled"


async def test_each_row_is_delivered_when_its_own_request_returns(engine: OpenAIEngine) -> None:
    story = "Write a long story about a brave dragon."
    long = asyncio.create_task(engine.submit(SampleRequest(prompt=story, max_new_tokens=48)))
    short = asyncio.create_task(engine.submit(SampleRequest(prompt=CAPITAL, max_new_tokens=3)))
    done, _ = await asyncio.wait({long, short}, return_when=asyncio.FIRST_COMPLETED)
    assert done == {short}
    assert ok(await long).completion_tokens == 48


async def test_requests_in_flight_are_bounded(
    compat_server: tuple[CompatServer, str], server: CompatServer
) -> None:
    engine = make_engine(compat_server[1], openai_max_concurrency=2)
    try:
        rows = [SampleRequest(prompt=f"{CAPITAL} ({i})", max_new_tokens=2) for i in range(5)]
        results = await asyncio.gather(*(engine.submit(r) for r in rows))
    finally:
        await engine.close()
    assert [ok(r).completion_tokens for r in results] == [2] * 5
    assert engine.peak_in_flight == 2
    assert len(server.bodies) == 5


async def test_a_row_over_its_time_limit_ends_timeout(engine: OpenAIEngine) -> None:
    result = await engine.submit(SampleRequest(prompt=HAIKU, max_new_tokens=64, timeout_s=0.05))
    assert result.finish_reason == "timeout"


async def test_refused_credentials_kill_the_engine(
    engine: OpenAIEngine, server: CompatServer
) -> None:
    server.fail_with = [401]
    with pytest.raises(EngineDeadError, match="PONDER_OPENAI_API_KEY"):
        await engine.submit(SampleRequest(prompt=CAPITAL, max_new_tokens=2))
    with pytest.raises(EngineDeadError):
        await engine.submit(SampleRequest(prompt=CAPITAL, max_new_tokens=2))
    assert len(server.bodies) == 1


def test_the_model_name_is_required() -> None:
    with pytest.raises(ConfigError, match="PONDER_OPENAI_MODEL"):
        OpenAIEngine(load_settings(engine="openai", openai_model=""))


def test_a_base_url_that_is_not_a_url_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"PONDER_OPENAI_BASE_URL='http://\[::1/v1'"):
        make_engine("http://[::1/v1")


async def generate_one(engine: OpenAIEngine) -> SampleOutput | EngineError:
    """One short row through ``engine``, then closed."""
    try:
        (result,) = await engine.generate([SampleRequest(prompt=CAPITAL, max_new_tokens=2)])
    finally:
        await engine.close()
    return result


async def test_requests_go_through_the_environment_s_proxy(
    compat_server: tuple[CompatServer, str], server: CompatServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the compat server stands as the proxy of a host that does not resolve: the answer can
    # only come through the proxy, which gets the request for that host
    for name in ("http_proxy", "HTTP_PROXY", "no_proxy", "NO_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
    proxy = compat_server[1].removesuffix("/v1").replace("http://", "http://bob:pw@")
    monkeypatch.setenv("HTTP_PROXY", proxy)
    ok(await generate_one(make_engine("http://upstream.invalid/v1")))
    assert [h["host"] for h in server.headers] == ["upstream.invalid"]
    basic = "Basic " + base64.b64encode(b"bob:pw").decode()
    assert server.headers[0]["proxy-authorization"] == basic  # the proxy URL's credentials
    # NO_PROXY names hosts that are reached directly
    monkeypatch.setenv("NO_PROXY", "upstream.invalid")
    result = await generate_one(make_engine("http://upstream.invalid/v1", openai_max_retries=0))
    assert isinstance(result, EngineError) and "cannot reach" in str(result)
    assert len(server.headers) == 1


def test_a_proxy_s_credentials_go_with_the_tunnel_of_an_https_server(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # (an https server behind a proxy is reached through a CONNECT tunnel, whose request
    # carries them; the test above sees a plain-HTTP proxy read them from each request)
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    monkeypatch.setenv("HTTPS_PROXY", "http://bob:pw@proxy.invalid:3128")
    route = _route_from_env("https://upstream.invalid/v1/chat/completions", netrc=False)
    basic = "Basic " + base64.b64encode(b"bob:pw").decode()
    assert (str(route.proxy), route.proxy_headers, route.headers) == (
        "http://proxy.invalid:3128",
        {"Proxy-Authorization": basic},
        {},
    )


async def test_netrc_credentials_are_sent_unless_an_api_key_is_set(
    compat_server: tuple[CompatServer, str],
    server: CompatServer,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    netrc = tmp_path / "netrc"
    netrc.write_text("machine 127.0.0.1 login ann password s3cret\n")
    netrc.chmod(0o600)
    monkeypatch.setenv("NETRC", str(netrc))
    ok(await generate_one(make_engine(compat_server[1])))
    ok(await generate_one(make_engine(compat_server[1], openai_api_key="sk-test")))
    basic = "Basic " + base64.b64encode(b"ann:s3cret").decode()
    assert [h["authorization"] for h in server.headers] == [basic, "Bearer sk-test"]


async def test_a_server_that_is_not_there_fails_the_row_after_its_retries() -> None:
    with socket.socket() as s:  # a port that nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    engine = make_engine(f"http://127.0.0.1:{port}/v1", openai_max_retries=2)
    try:
        (result,) = await engine.generate([SampleRequest(prompt=CAPITAL, max_new_tokens=2)])
    finally:
        await engine.close()
    assert isinstance(result, EngineError)
    assert f"cannot reach http://127.0.0.1:{port}/v1" in str(result)
    assert engine.requests_sent == 3  # the first try and two retries
