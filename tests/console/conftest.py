"""Fixtures of the console's browser tests: one headless Chromium for the session, and
the service on loopback in a thread of its own (the tests drive the browser with blocking
Selenium calls, which must not stall the server's event loop)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from ponder.config import Settings
from tests.conftest import ThreadedServer, make_settings, serving_app
from tests.console.browser import chromium, console_log, missing

if TYPE_CHECKING:
    from selenium.webdriver.remote.webdriver import WebDriver

#: 25 ms a step: a sample of 60 words writes for 1.5 s, long enough to watch it grow
SLOW_STEPS = [25.0, 0.0]


def app_service(settings: Settings, workers: int = 1) -> ThreadedServer:
    """The service (as ``ponder serve``) in a thread: the tests block on the browser."""
    return ThreadedServer(serving_app(settings, workers), ws="auto")


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
    with app_service(console_settings(tmp_path)) as live:
        yield live
