"""Shared fixtures: a real Redis (isolated by a per-test key prefix), settings, stores."""

from __future__ import annotations

import asyncio
import contextlib
import faulthandler
import os
import socket
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest
import redis
import uvicorn

from ponder.config import Settings, load_settings

if TYPE_CHECKING:
    from fastapi import FastAPI

    from ponder.store import TaskStore
    from ponder.types import Task

REDIS_URL = os.environ.get("PONDER_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


#: how long the interpreter may take to exit after the last test
EXIT_DEADLINE_S = 60


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Under pytest-xdist (``make test``: ``--dist loadgroup``), the tests that load the real
    model run in one worker, so that each model is loaded once per run, the browser tests
    in one, so that one Chromium serves them, and the sandbox's in one: as root, every
    bwrap run's program is uid 65534, whose process limit they share, so a contained fork
    bomb fills it for the others while it lasts (a fork in another run then fails)."""
    for item in items:
        if item.get_closest_marker("model"):
            item.add_marker(pytest.mark.xdist_group("model"))
        elif item.path.parent.name == "console":
            item.add_marker(pytest.mark.xdist_group("browser"))
        elif item.path.name == "test_sandbox.py":
            item.add_marker(pytest.mark.xdist_group("sandbox"))


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    """A run whose process does not exit (a thread that is not a daemon left running, such
    as an unclosed aiosqlite connection's) fails after EXIT_DEADLINE_S with every thread's
    stack, instead of holding CI until its own timeout."""
    faulthandler.dump_traceback_later(EXIT_DEADLINE_S, exit=True, file=sys.__stderr__)


@pytest.fixture(scope="session")
def redis_url() -> str:
    """The test Redis; `make test` makes sure one answers (starting redis-server if needed)."""
    client = redis.Redis.from_url(REDIS_URL)
    try:
        client.ping()
    except redis.ConnectionError as e:
        raise RuntimeError(
            f"no Redis answers at {REDIS_URL}; run the suite with `make test`, which starts one"
        ) from e
    finally:
        client.close()
    return REDIS_URL


@pytest.fixture
def key_prefix(redis_url: str) -> Iterator[str]:
    """A key prefix of this test alone; its keys are deleted afterwards."""
    prefix = f"ponder-test-{uuid.uuid4().hex[:12]}"
    yield prefix
    client = redis.Redis.from_url(redis_url)
    try:
        keys = list(client.scan_iter(match=f"{prefix}:*", count=1000))
        if keys:
            client.delete(*keys)
    finally:
        client.close()


def make_settings(**overrides: object) -> Settings:
    """Settings for tests: scripted engine, fast timings, no environment leaks."""
    base: dict[str, object] = {
        "engine": "scripted",
        "node_id": "test1",
        "redis_url": None,
        "claim_block_ms": 100,
        "batch_max_wait_ms": 5.0,
    }
    base.update(overrides)
    return load_settings(**base)


@pytest.fixture
def sqlite_settings(tmp_path: Path) -> Settings:
    return make_settings(sqlite_path=str(tmp_path / "ponder.db"))


@pytest.fixture
def redis_settings(redis_url: str, key_prefix: str) -> Settings:
    return make_settings(redis_url=redis_url, key_prefix=key_prefix)


@pytest.fixture(params=["sqlite", "redis"])
def store_keys(request: pytest.FixtureRequest, tmp_path: Path) -> dict[str, object]:
    """The settings that name a store, once per store implementation (for tests that make
    their settings with other keys, such as a models file)."""
    if request.param == "sqlite":
        return {"sqlite_path": str(tmp_path / "ponder.db")}
    return {
        "redis_url": request.getfixturevalue("redis_url"),
        "key_prefix": request.getfixturevalue("key_prefix"),
    }


@pytest.fixture(params=["sqlite", "redis"])
def settings(request: pytest.FixtureRequest) -> Settings:
    """Run a test once per store implementation."""
    name = "sqlite_settings" if request.param == "sqlite" else "redis_settings"
    result: Settings = request.getfixturevalue(name)
    return result


@contextlib.asynccontextmanager
async def open_store(settings: Settings) -> AsyncIterator[TaskStore]:
    """The store ``settings`` name (Redis when ``redis_url`` is set), started; closed on
    leaving: every store fixture is this."""
    from ponder.store import create_store

    store = create_store(settings)
    await store.start()
    try:
        yield store
    finally:
        await store.close()


@pytest.fixture
async def store(settings: Settings) -> AsyncIterator[TaskStore]:
    async with open_store(settings) as s:
        yield s


# --- a real HTTP server on loopback ---------------------------------------------------


async def start_uvicorn(server: uvicorn.Server) -> tuple[asyncio.Task[None], int]:
    """Serve in the test's loop; return the serving task and the bound port.

    uvicorn offers no start-up event, so this watches ``server.started`` (bounded by the
    test's timeout) and fails at once if serving ended instead.
    """
    task = asyncio.create_task(server.serve())
    while not server.started:
        if task.done():
            task.result()
            raise RuntimeError("the server stopped during start-up")
        await asyncio.sleep(0.01)
    port: int = server.servers[0].sockets[0].getsockname()[1]
    return task, port


def serving_app(settings: Settings, workers: int) -> FastAPI:
    """What ``ponder serve`` serves (the API, starting ``workers`` worker loops over one
    engine), or with no workers what ``ponder api`` serves."""
    from ponder.api import create_app
    from ponder.compose import all_in_one

    return all_in_one(settings, workers=workers).app if workers else create_app(settings)


class LiveServer:
    """uvicorn serving the API (with ``workers`` worker loops, as ``ponder serve``, when
    above 0) on 127.0.0.1 (a free port) inside the test's loop."""

    def __init__(self, settings: Settings, workers: int) -> None:
        self.app = serving_app(settings, workers)
        config = uvicorn.Config(
            self.app, host="127.0.0.1", port=0, log_level="warning", lifespan="on"
        )
        self.server = uvicorn.Server(config)
        self.url = ""
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> LiveServer:
        self._task, port = await start_uvicorn(self.server)
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.server.should_exit = True
        if self._task is not None:
            await asyncio.wait_for(self._task, 30)


class ThreadedServer:
    """An ASGI app served by uvicorn on 127.0.0.1 (a free port) in a thread of its own, with
    its own event loop: for tests that block (a browser driven by Selenium, a model call).

    The socket listens before uvicorn starts: connections wait in its backlog until the app
    has started, so nobody needs to wait for the server to be up.
    """

    def __init__(self, app: Any, **config: Any) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(128)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        options = {"log_level": "warning", "ws": "none", **config}
        self.server = uvicorn.Server(uvicorn.Config(app, **options))
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True
        )

    def __enter__(self) -> ThreadedServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)
        self.sock.close()


@pytest.fixture
async def server(settings: Settings) -> AsyncIterator[LiveServer]:
    """The all-in-one service (API + one worker, scripted engine) on loopback."""
    async with LiveServer(settings, workers=1) as live:
        yield live


@pytest.fixture
async def client(server: LiveServer) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=server.url, timeout=10) as c:
        yield c


async def wait_for_task(
    client: httpx.AsyncClient, task_id: str, timeout_s: float = 15.0
) -> dict[str, object]:
    """Follow the task's event stream (no polling) until it ends; return the final Task.

    The stream closes after the event that carries a terminal status (API.md).
    """
    url = f"/v1/tasks/{task_id}/events"
    try:
        async with (
            asyncio.timeout(timeout_s),
            client.stream("GET", url, timeout=httpx.Timeout(timeout_s)) as stream,
        ):
            assert stream.status_code == 200, await stream.aread()
            async for _ in stream.aiter_lines():
                pass
    except TimeoutError:
        status = (await client.get(f"/v1/tasks/{task_id}")).json()["status"]
        raise AssertionError(f"task {task_id} still {status} after {timeout_s}s") from None
    response = await client.get(f"/v1/tasks/{task_id}")
    assert response.status_code == 200, response.text
    task: dict[str, object] = response.json()
    assert task["status"] in TERMINAL_NAMES, task
    return task


TERMINAL_NAMES = {"done", "partial_done", "failed", "cancelled", "expired"}


async def follow_to_end(store: TaskStore, task_id: str, timeout_s: float = 15.0) -> Task:
    """Follow the task's event log in the store (no polling) until the task is terminal;
    the final Task."""
    from ponder.states import is_terminal

    after: str | None = None
    async with asyncio.timeout(timeout_s):
        while True:
            task = await store.get_task(task_id)
            assert task is not None
            if is_terminal(task.status):
                return task
            events = await store.read_events(task_id, after, block_ms=500)
            if events:
                after = events[-1].id


def free_port() -> int:
    """A loopback port free now (for a server started as a subprocess)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


async def until(check: Any, timeout_s: float, what: str, interval_s: float = 0.05) -> Any:
    """Poll ``check()`` (sync or async) until it returns something truthy; fail after
    ``timeout_s`` naming ``what``. Only for state that no event announces: other
    processes watched from the outside, the webhook outbox draining."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = check()
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        await asyncio.sleep(interval_s)
