"""``/console``: the console's static files, served by the API process itself."""

from __future__ import annotations

import re
from importlib import resources

import httpx
import pytest

from ponder.api.console import FILES, NAMES
from ponder.api.deps import key_digest
from ponder.config import Settings
from ponder.states import is_terminal
from ponder.types import EventName, Mode, TaskStatus, TaskType
from tests.conftest import LiveServer

pytestmark = pytest.mark.timeout(30)


async def test_the_page_and_its_files_come_from_the_service(client: httpx.AsyncClient) -> None:
    page = await client.get("/console")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    csp = page.headers["content-security-policy"]
    assert "default-src 'self'" in csp and "script-src 'self'" in csp
    # everything the page names is one of the console's own files, under /console
    linked = re.findall(r'(?:src|href)="([^"#]+)"', page.text)
    assert linked and all(u.startswith("/console/") for u in linked)
    assert {u.removeprefix("/console/") for u in linked} <= set(FILES)
    for name, media_type in FILES.items():
        response = await client.get(f"/console/{name}")
        assert response.status_code == 200 and response.content
        assert response.headers["content-type"] == media_type
    script = (await client.get("/console/app.js")).text
    assert "http://" not in script and "https://" not in script  # no other origin
    assert (await client.get("/", follow_redirects=False)).headers["location"] == "/console"
    assert (await client.get("/console/", follow_redirects=False)).headers["location"] == (
        "/console"
    )


async def test_an_unknown_file_is_a_404_in_the_envelope(client: httpx.AsyncClient) -> None:
    for name in ("nope.js", "..%2Fapi%2Fapp.py", "config.toml"):
        response = await client.get(f"/console/{name}")
        assert response.status_code == 404
        assert response.json()["error"]["code"] == "not_found"


async def test_config_says_whether_a_key_is_needed(settings: Settings) -> None:
    for keys, auth in (([], False), ([key_digest("pk_a")], True)):
        secured = settings.model_copy(update={"api_keys": keys})
        async with (
            LiveServer(secured, workers=0) as live,
            httpx.AsyncClient(base_url=live.url) as c,
        ):
            config = (await c.get("/console/config.json")).json()
            assert config == {"auth": auth, **NAMES}
            assert (await c.get("/console")).status_code == 200  # the page itself needs no key


def test_config_gives_the_console_the_services_names() -> None:
    """The page keeps no copy of the statuses: it reads them from the config."""
    assert NAMES["statuses"] == [s.value for s in TaskStatus]
    assert NAMES["terminal"] == ["done", "partial_done", "failed", "cancelled", "expired"]
    assert all(is_terminal(s) == (s in NAMES["terminal"]) for s in NAMES["statuses"])
    assert NAMES["status_events"] == ["status", "result"]
    assert NAMES["finished_samples"] == ["done", "timeout", "error", "cancelled", "skipped"]
    assert NAMES["events"] == {e.value: e.value for e in EventName}
    assert NAMES["modes"] == [m.value for m in Mode] and NAMES["default_mode"] == "standard"
    assert NAMES["task_types"] == [t.value for t in TaskType]
    assert NAMES["default_task_type"] == "auto"
    script = (resources.files("ponder") / "console" / "app.js").read_text(encoding="utf-8")
    # no copy of a status, a mode, a task type or an event kind as a string literal
    copies = [f'"{name}"' for name in ("partial_done", "skipped", "deep", "math", "preliminary")]
    assert not [c for c in copies if c in script], copies
