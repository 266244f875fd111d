"""Fixtures of the console's browser tests: one headless Chromium for the session, and
the service on loopback in a thread of its own (the tests drive the browser with blocking
Selenium calls, which must not stall the server's event loop)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import uvicorn

from ponder.config import Settings
from tests.conftest import make_settings
from tests.console.browser import chromium, console_log, missing

if TYPE_CHECKING:
    from selenium.webdriver.remote.webdriver import WebDriver

#: 25 ms a step: a sample of 60 words writes for 1.5 s, long enough to watch it grow
SLOW_STEPS = [25.0, 0.0]
_START_TIMEOUT_S = 30.0


class ThreadedServer:
    """``create_app`` served by uvicorn on 127.0.0.1 (a free port) in its own thread."""

    def __init__(self, settings: Settings, workers: int) -> None:
        from ponder.api import create_app

        config = uvicorn.Config(
            create_app(settings, workers=workers), host="127.0.0.1", port=0,
            log_level="warning", lifespan="on",
        )  # fmt: skip
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name="console-test-server")
        self.url = ""

    def __enter__(self) -> ThreadedServer:
        self.thread.start()
        deadline = time.monotonic() + _START_TIMEOUT_S
        while not self.server.started:  # uvicorn has no start-up event to wait on
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the test server did not start")
            time.sleep(0.01)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)


@pytest.fixture(scope="session")
def browser() -> Iterator[WebDriver]:
    """Headless Chromium (Debian's), shared by the session; skipped where it is missing."""
    reason = missing()
    if reason is not None:
        pytest.skip(reason)
    with chromium() as driver:
        driver.implicitly_wait(0)
        yield driver


@pytest.fixture
def page(browser: WebDriver) -> Iterator[WebDriver]:
    """The browser, its console log emptied, on a blank page afterwards."""
    console_log(browser)
    yield browser
    browser.get("about:blank")


def console_settings(tmp_path: Path, **overrides: object) -> Settings:
    return make_settings(
        sqlite_path=str(tmp_path / "ponder.db"), scripted_step_ms=SLOW_STEPS, **overrides
    )


@pytest.fixture
def service(tmp_path: Path) -> Iterator[ThreadedServer]:
    """The all-in-one service (API + one worker, the scripted engine at a visible pace)."""
    with ThreadedServer(console_settings(tmp_path), workers=1) as live:
        yield live
