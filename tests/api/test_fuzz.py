"""Fuzzing the HTTP API: schemathesis over the service's own OpenAPI schema, then
hand-made hostile bodies that a schema-driven generator does not produce.

The app runs in-process (schemathesis' ASGI transport) with an in-memory SQLite store,
auth on and one worker loop, so created tasks also run. Every answer must be a non-5xx
that matches the schema the service publishes.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.python import asgi
from schemathesis.specs.openapi.checks import response_schema_conformance

from ponder.api.deps import key_digest
from tests.conftest import LiveServer, make_settings, serving_app

KEY = "pk_fuzz_key"
AUTH = {"Authorization": f"Bearer {KEY}"}

app = serving_app(
    make_settings(sqlite_path=":memory:", api_keys=[key_digest(KEY)], node_id="fuzz"), 1
)
schema = schemathesis.openapi.from_dict(app.openapi())
schema.app = app


@pytest.fixture(scope="module", autouse=True)
def _stop_app() -> Iterator[None]:
    """The ASGI transport starts the app's lifespan on first use; stop it afterwards."""
    yield
    asgi.shutdown_lifespans()


def no_5xx_but_a_readyz_not_ready(ctx: Any, response: Any, case: Any) -> bool | None:
    """No 5xx answer, except ``/readyz``'s documented 503 while the worker loop has not
    registered yet (it does just after the app starts; a loaded machine widens that gap)."""
    if case.path == "/readyz" and response.status_code == 503:
        assert response.json()["status"] == "not_ready"
        return None
    return not_a_server_error(ctx, response, case)


@schema.parametrize()
@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    database=None,
)
@pytest.mark.timeout(120)
def test_no_5xx_and_answers_match_the_schema(case: Any) -> None:
    checks = [no_5xx_but_a_readyz_not_ready, response_schema_conformance]
    case.call_and_validate(headers=AUTH, checks=checks)


# --- hostile bodies -------------------------------------------------------------------


def _nested(depth: int) -> bytes:
    return b'{"prompt": "x", "metadata": {"a": ' + b"[" * depth + b"]" * depth + b"}}"


HOSTILE: list[tuple[str, bytes, str, set[int]]] = [
    ("deep nesting", _nested(50_000), "application/json", {400}),
    # Python's JSON reader takes NaN and Infinity; the API refuses them anywhere
    ("NaN in metadata", b'{"prompt": "x", "metadata": {"v": NaN}}', "application/json", {422}),
    (
        "-Infinity deep in metadata",
        b'{"prompt": "x", "metadata": {"a": [1, {"b": -Infinity}]}}',
        "application/json",
        {422},
    ),
    ("Infinity", b'{"prompt": "x", "temperature": Infinity}', "application/json", {422}),
    ("1e999", b'{"prompt": "x", "timeout_s": 1e999}', "application/json", {422}),
    (
        "huge int",
        b'{"prompt": "x", "samples": 1' + b"0" * 5000 + b"}",
        "application/json",
        {422},
    ),
    (
        "huge int in metadata",
        b'{"prompt": "x", "metadata": {"n": ' + b"9" * 5000 + b"}}",
        "application/json",
        {422},
    ),
    ("invalid UTF-8", b'{"prompt": "\xff\xfe"}', "application/json", {400}),
    ("lone surrogate", b'{"prompt": "\\ud800"}', "application/json", {202, 400, 422}),
    ("NUL in prompt", b'{"prompt": "a\\u0000b"}', "application/json", {202}),
    ("array body", b"[1, 2, 3]", "application/json", {422}),
    ("null body", b"null", "application/json", {422}),
    ("empty body", b"", "application/json", {400, 422}),
    ("form body", b"prompt=x", "application/x-www-form-urlencoded", {415}),
    ("JSON sent as a form", b'{"prompt": "x"}', "application/x-www-form-urlencoded", {415}),
    ("no content type", b'{"prompt": "x"}', "", {415}),
    ("JSON with a charset", b'{"prompt": "x"}', "application/json; charset=utf-8", {202}),
    ("a +json type", b'{"prompt": "x"}', "application/vnd.api+json", {202}),
    ("duplicate keys", b'{"prompt": "x", "prompt": "y"}', "application/json", {202}),
]


@pytest.fixture(scope="module")
def hostile_server_url() -> Iterator[str]:
    """A real uvicorn server (HTTP parsing included), in its own event loop thread."""
    import asyncio
    import threading

    ready = threading.Event()
    box: dict[str, Any] = {}

    async def serve() -> None:
        settings_ = make_settings(
            sqlite_path=":memory:", api_keys=[key_digest(KEY)], node_id="hostile"
        )
        stop = asyncio.Event()
        async with LiveServer(settings_, workers=0) as live:
            box["url"], box["stop"] = live.url, stop
            box["loop"] = asyncio.get_running_loop()
            ready.set()
            await stop.wait()

    def run() -> None:
        try:
            asyncio.run(serve())
        except BaseException as e:  # reported by the fixture
            box["error"] = e
            ready.set()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        assert ready.wait(30), "the server did not start"
        if "error" in box:
            raise box["error"]
        yield box["url"]
    finally:
        if "stop" in box:
            box["loop"].call_soon_threadsafe(box["stop"].set)
        thread.join(30)


@pytest.mark.parametrize(("name", "body", "content_type", "expected"), HOSTILE)
def test_hostile_bodies_get_a_4xx_envelope(
    hostile_server_url: str, name: str, body: bytes, content_type: str, expected: set[int]
) -> None:
    headers = {**AUTH, "content-type": content_type} if content_type else AUTH
    response = httpx.post(f"{hostile_server_url}/v1/tasks", content=body, headers=headers)
    assert response.status_code in expected, (name, response.status_code, response.text[:300])
    answer = strict_json(response.text)
    if response.status_code >= 400:
        assert answer["error"]["code"] and answer["error"]["message"]
    assert "Traceback" not in response.text


def strict_json(text: str) -> Any:
    """Parse as RFC 8259 JSON: no NaN or Infinity tokens."""

    def refuse(token: str) -> None:
        raise AssertionError(f"non-standard JSON token {token} in an answer")

    return json.loads(text, parse_constant=refuse)


@pytest.mark.parametrize(
    "path",
    [
        "/v1/tasks/" + "9" * 13 + "-" + "a" * 5000 + "-1",
        "/v1/tasks/%00",
        "/v1/tasks/..%2F..%2Fetc%2Fpasswd",
        "/v1/tasks/1764412800123-n-99999999999999999999999",
        "/v1/tasks?cursor=" + "z" * 150,
        "/v1/tasks?limit=" + "9" * 400,
        "/v1/tasks?status=%F0%9F%92%A5",
    ],
)
def test_hostile_paths_and_queries(hostile_server_url: str, path: str) -> None:
    response = httpx.get(f"{hostile_server_url}{path}", headers=AUTH)
    assert response.status_code in (404, 422), response.text[:300]
    assert response.json()["error"]["code"] in ("not_found", "invalid")


def test_hostile_headers(hostile_server_url: str) -> None:
    url = f"{hostile_server_url}/v1/tasks"
    for auth in ("Bearer", "Bearer x y", "Basic Zm9vOmJhcg==", "Bearer " + "k" * 8000, "bearer\tx"):
        response = httpx.get(url, headers={"Authorization": auth})
        assert response.status_code == 401, (auth[:20], response.text[:200])
    response = httpx.post(url, json={"prompt": "x"}, headers={**AUTH, "Idempotency-Key": "k" * 300})
    assert response.status_code == 422
    # malformed HTTP that a client library refuses to send
    host, port = httpx.URL(hostile_server_url).host, httpx.URL(hostile_server_url).port
    for head in (
        b"POST /v1/tasks HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n",
        b"POST /v1/tasks HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 9\r\n\r\n",
        b"GET /v1/tasks HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n",
    ):
        with socket.create_connection((host, port or 80), timeout=10) as sock:
            sock.sendall(head)
            status = sock.recv(100).split(b"\r\n", 1)[0]
        assert status.startswith(b"HTTP/1.1 4"), (head, status)
