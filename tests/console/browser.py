"""Headless Chromium from Debian's packages, driven by Selenium; nothing is downloaded.

Selenium is pointed at ``/usr/bin/chromium`` and ``/usr/bin/chromedriver`` (the
``chromium`` and ``chromium-driver`` packages), which skips Selenium Manager (the part that
would fetch a browser or a driver). Each browser gets a fresh profile directory.
"""

from __future__ import annotations

import base64
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from selenium.webdriver.remote.webdriver import WebDriver

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-dev-shm-usage",
)  # fmt: skip
DESKTOP = (1280, 900)
PHONE = (390, 844)


def missing() -> str | None:
    """Why the browser tests cannot run here (None: they can)."""
    absent = [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not p.exists()]
    if absent:
        return (
            f"{' and '.join(absent)} not found: the console's browser tests need Debian's "
            "chromium and chromium-driver (apt-get install -y chromium chromium-driver)"
        )
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (make install)"
    return None


@contextmanager
def chromium() -> Iterator[WebDriver]:
    """A headless Chromium with a fresh profile; its console log is kept (``browser``)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="ponder-chromium-")
    options = Options()
    options.binary_location = str(CHROMIUM)
    for flag in (*FLAGS, f"--user-data-dir={profile}", "--window-size={},{}".format(*DESKTOP)):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(executable_path=str(CHROMEDRIVER)))
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def set_viewport(driver: WebDriver, size: tuple[int, int]) -> None:
    """Emulate a viewport of ``size`` CSS pixels (a phone's is narrower than any window)."""
    width, height = size
    driver.execute_cdp_cmd(
        "Emulation.setDeviceMetricsOverride",
        {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": width < 500},
    )


def screenshot(driver: WebDriver, path: Path, *, full_page: bool = True) -> None:
    """A PNG of the page (the whole page, not just the viewport, with ``full_page``)."""
    params: dict[str, Any] = {"format": "png", "captureBeyondViewport": full_page}
    if full_page:
        size = driver.execute_cdp_cmd("Page.getLayoutMetrics", {})["cssContentSize"]
        width = driver.execute_script("return window.innerWidth")
        params["clip"] = {"x": 0, "y": 0, "width": width, "height": size["height"], "scale": 1}
    data = driver.execute_cdp_cmd("Page.captureScreenshot", params)["data"]
    path.write_bytes(base64.b64decode(data))


def console_log(driver: WebDriver) -> list[dict[str, Any]]:
    """The browser console's entries since the last call (errors, warnings, messages)."""
    chromium_driver: Any = driver  # get_log is Chromium's own, not in WebDriver's type
    return list(chromium_driver.get_log("browser"))
