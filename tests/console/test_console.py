"""The web console in a real browser (headless Chromium): what a user sees and does."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest

from ponder.api.deps import key_digest
from ponder.compose import all_in_one
from ponder.config import Settings
from ponder.engines.openvino import OpenVINOEngine
from ponder.store.records import ModelState
from ponder.types import TaskStatus, utcnow
from tests.conftest import ThreadedServer, open_store
from tests.console.browser import DESKTOP, PHONE, console_log, set_viewport
from tests.console.conftest import app_service, console_settings

if TYPE_CHECKING:
    from selenium.webdriver.remote.webdriver import WebDriver

pytestmark = pytest.mark.timeout(120)

WAIT_S = 20.0


def wait(driver: WebDriver, condition: Callable[[Any], Any], timeout_s: float = WAIT_S) -> Any:
    """Until ``condition`` holds (an element missing, or replaced while read, is retried:
    the page redraws as the task moves on)."""
    from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
    from selenium.webdriver.support.ui import WebDriverWait

    ignored = (NoSuchElementException, StaleElementReferenceException)
    return WebDriverWait(driver, timeout_s, 0.05, ignored_exceptions=ignored).until(condition)


def css(driver: WebDriver, selector: str) -> Any:
    from selenium.webdriver.common.by import By

    return driver.find_element(By.CSS_SELECTOR, selector)


def all_css(driver: WebDriver, selector: str) -> list[Any]:
    from selenium.webdriver.common.by import By

    return list(driver.find_elements(By.CSS_SELECTOR, selector))


def loaded(*selectors: str) -> Callable[[Any], bool]:
    return lambda d: all(css(d, s).get_attribute("data-loaded") == "true" for s in selectors)


def errors(driver: WebDriver) -> list[dict[str, Any]]:
    """The console's warnings and errors (messages logged, exceptions, failed loads)."""
    return [e for e in console_log(driver) if e["level"] in ("WARNING", "SEVERE")]


def resources(driver: WebDriver) -> list[str]:
    """Every URL the page loaded or fetched."""
    script = "return performance.getEntriesByType('resource').map(e => e.name)"
    return [str(u) for u in driver.execute_script(script)] + [driver.current_url]


def submit(url: str, body: dict[str, Any], key: str | None = None) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    response = httpx.post(f"{url}/v1/tasks", json=body, headers=headers, timeout=10)
    assert response.status_code == 202, response.text
    task: dict[str, Any] = response.json()
    return task


def test_the_page_loads_without_errors_at_desktop_and_phone_widths(
    page: WebDriver, service: ThreadedServer
) -> None:
    submit(service.url, {"prompt": "[[answers: 3]]", "mode": "fast"})
    for size in (DESKTOP, PHONE):
        set_viewport(page, size)
        page.get(f"{service.url}/console")
        wait(page, loaded("#overview", "#tasks"))
        width = page.execute_script("return document.documentElement.scrollWidth")
        assert width <= size[0], f"the page is {width} px wide in a {size[0]} px viewport"
        overview = css(page, "#overview").text
        assert "undefined" not in overview and "NaN" not in overview, overview
        assert errors(page) == []
        assert all(u.startswith(service.url) for u in resources(page)), resources(page)
    wait(page, lambda d: css(d, "#overview [data-figure=pending]").text == "0")  # it ran


def test_a_task_from_the_form_streams_into_the_page(
    page: WebDriver, service: ThreadedServer
) -> None:
    # the process's counters are shared by every server of this test session
    done_before = httpx.get(f"{service.url}/v1/overview").json()["finished"]["total"]["done"]
    page.get(f"{service.url}/console#/new")
    prompt = wait(page, lambda d: css(d, "#f-prompt"))
    wait(page, lambda d: d.switch_to.active_element == prompt)  # the form has the focus
    prompt.send_keys("What is 2+3? [[answers: 5, 4, 5]] [[tokens: 60]]")
    css(page, "#f-samples").send_keys("3")
    css(page, "#f-submit").click()
    wait(page, lambda d: "#/tasks/" in d.current_url)
    task_id = page.current_url.split("#/tasks/")[1]
    seen: list[str] = []

    def text_grows(d: Any) -> bool:  # sample 0's text, read while the task runs
        status = css(d, "#task").get_attribute("data-status")
        text = css(d, '.sample[data-index="0"] .text').text
        if status == "running" and text:
            seen.append(text)
        return len(set(seen)) >= 2

    wait(page, text_grows)
    wait(page, lambda d: css(d, "#task").get_attribute("data-status") == "done")
    task = httpx.get(f"{service.url}/v1/tasks/{task_id}").json()
    final = next(s["text"] for s in task["samples"] if s["index"] == 0)
    assert all(final.startswith(text) and len(text) < len(final) for text in seen)
    assert css(page, '.sample[data-index="0"] .text').text == final
    assert css(page, "#answer").get_attribute("data-answer") == "5"
    assert css(page, "#answer-value").text == "5"
    votes = {v.get_attribute("data-answer"): v.get_attribute("data-count")
             for v in all_css(page, "#votes .vote")}  # fmt: skip
    assert votes == {"5": "2", "4": "1"}
    assert css(page, "#votes").get_attribute("data-final") == "true"
    assert errors(page) == []
    # the overview, refreshed live, counts it
    page.get(f"{service.url}/console")
    done_now = f"done {done_before + 1}"
    wait(page, lambda d: css(d, "#overview .chip[data-status=done]").text == done_now)


def test_an_auto_task_from_the_form_says_where_its_cascade_ended(
    page: WebDriver, service: ThreadedServer
) -> None:
    page.get(f"{service.url}/console#/new")
    prompt = wait(page, lambda d: css(d, "#f-prompt"))
    prompt.send_keys("What is 2+3? [[answers: 5, 4, 5, 5, 5]]")
    css(page, "#f-mode option[value=auto]").click()
    css(page, "#f-submit").click()
    wait(page, lambda d: "#/tasks/" in d.current_url)
    task_id = page.current_url.split("#/tasks/")[1]
    wait(page, lambda d: css(d, "#task").get_attribute("data-status") == "done")
    result = httpx.get(f"{service.url}/v1/tasks/{task_id}").json()["result"]
    shown = css(page, "#answer-stage").text
    assert shown.startswith(f"stage {result['stage']} of 3 · ")
    assert shown.endswith(f"stopped: {result['stop_reason']}")
    assert all(step in shown for step in result["escalations"])
    assert errors(page) == []


PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
}


def test_a_structured_task_shows_its_fields_as_they_are_voted(
    page: WebDriver, service: ThreadedServer
) -> None:
    # samples 0 and 1 answer, sample 2 never does: the preliminary answer holds until the
    # deadline, then the result stands on the two
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}
    prompt = "Who? [[fields: name = Ann | Ann | Bob; age = 30 | 31 | 30]] [[answers: 1, 1, hang]]"
    body = {"prompt": prompt, "mode": "standard", "samples": 3, "early_stop": False}
    task = submit(service.url, body | {"timeout_s": 6, "response_format": fmt})
    page.get(f"{service.url}/console#/tasks/{task['id']}")

    def fields(d: Any) -> dict[str, dict[str, str]]:
        return {
            row.get_attribute("data-path"): {
                "value": row.get_attribute("data-value"),
                "confidence": row.get_attribute("data-confidence"),
                "votes": row.find_element("css selector", ".field-votes").text,
            }
            for row in all_css(d, "#fields tr[data-path]")
        }

    wait(page, lambda d: css(d, "#answer-value").get_attribute("data-final") == "false"
         and set(fields(d)) == {"name", "age"})  # fmt: skip
    early = fields(page)
    assert early["name"]["value"] == '"Ann"' and early["name"]["votes"] == '"Ann" (2)'
    assert early["age"]["votes"] in ("30 (1) \u00b7 31 (1)", "31 (1) \u00b7 30 (1)")
    assert "Preliminary" in css(page, "#answer h2").text
    wait(page, lambda d: css(d, "#answer-value").get_attribute("data-final") == "true", 30)
    result = httpx.get(f"{service.url}/v1/tasks/{task['id']}").json()["result"]
    assert result["object"] == {"name": "Ann", "age": 30}
    shown = fields(page)
    assert set(shown) == set(result["fields"])
    for path, vote in result["fields"].items():
        assert shown[path]["confidence"] == str(vote["confidence"])
        assert shown[path]["value"] == json.dumps(vote["value"])
    assert json.loads(css(page, "#answer-value").text) == result["object"]
    assert errors(page) == []


def test_a_task_submitted_with_curl_appears_in_the_list(
    page: WebDriver, service: ThreadedServer
) -> None:
    page.get(f"{service.url}/console")
    wait(page, loaded("#tasks"))
    task = submit(service.url, {"prompt": "[[answers: 8]]", "mode": "fast"})
    row = wait(page, lambda d: all_css(d, f'tr[data-task="{task["id"]}"]'))[0]
    row.find_element("css selector", "a").click()
    wait(page, lambda d: css(d, "#task").get_attribute("data-status") == "done")
    assert css(page, "#answer-value").text == "8"
    # the filter: a done task is not among the failed ones
    page.get(f"{service.url}/console")
    wait(page, loaded("#tasks"))
    css(page, "#status-filter option[value=failed]").click()
    wait(page, lambda d: not all_css(d, f'tr[data-task="{task["id"]}"]'))
    assert "No failed tasks" in css(page, "#tasks tbody").text
    assert errors(page) == []


def test_cancel_from_the_task_view(page: WebDriver, service: ThreadedServer) -> None:
    task = submit(service.url, {"prompt": "[[hang]]", "mode": "fast"})
    page.get(f"{service.url}/console#/tasks/{task['id']}")
    wait(page, lambda d: css(d, "#task").get_attribute("data-status") == "running")
    css(page, "#cancel").click()
    wait(page, lambda d: css(d, "#task").get_attribute("data-status") == "cancelled")
    assert not css(page, "#cancel").is_displayed()
    assert httpx.get(f"{service.url}/v1/tasks/{task['id']}").json()["status"] == "cancelled"
    assert errors(page) == []


def test_with_api_keys_it_asks_for_one_and_shows_only_that_keys_tasks(
    page: WebDriver, tmp_path: Path
) -> None:
    settings = console_settings(tmp_path, api_keys=[key_digest("pk_a"), key_digest("pk_b")])
    with app_service(settings) as live:
        theirs = submit(live.url, {"prompt": "[[answers: 1]]", "mode": "fast"}, key="pk_a")
        mine = submit(live.url, {"prompt": "[[answers: 2]] [[tokens: 60]]", "mode": "fast"},
                      key="pk_b")  # fmt: skip
        page.get(f"{live.url}/console")
        dialog = wait(page, lambda d: css(d, "#key-dialog[open]"))
        css(page, "#key-input").send_keys("pk_wrong")
        css(page, "#key-form button").click()
        wait(page, lambda d: "refused" in css(d, "#key-error").text)  # asked again
        assert dialog.is_displayed()
        css(page, "#key-input").send_keys("pk_b")
        css(page, "#key-form button").click()
        wait(page, loaded("#tasks", "#overview"))
        rows = [r.get_attribute("data-task") for r in all_css(page, "#tasks tr[data-task]")]
        assert rows == [mine["id"]]
        assert page.execute_script("return sessionStorage.getItem('ponder-api-key')") == "pk_b"
        assert "key …pk_b" in css(page, "#key-state").text
        # the stream of its own task comes with the key in a header (no key in any URL)
        page.get(f"{live.url}/console#/tasks/{mine['id']}")
        wait(page, lambda d: css(d, "#task").get_attribute("data-status") == "done")
        assert css(page, "#answer-value").text == "2"
        assert not any("pk_" in url for url in resources(page))
        # another key's task is not there
        page.get(f"{live.url}/console#/tasks/{theirs['id']}")
        message = wait(page, lambda d: css(d, "#task-error")).text
        assert "No such task" in message
        # only the refused key and the other key's task made the browser log failures
        failed = [e["message"] for e in errors(page)]
        assert all(" 401 " in m or " 404 " in m for m in failed), failed


def test_the_overview_of_an_api_only_process(page: WebDriver, tmp_path: Path) -> None:
    """The split deployment: no engine here, so the overview has the store's figures."""
    with app_service(console_settings(tmp_path), workers=0) as live:
        for priority in (0, 3, 3):
            submit(live.url, {"prompt": "x", "priority": priority})
        page.get(f"{live.url}/console")
        wait(page, loaded("#overview"))
        assert css(page, "#overview [data-figure=pending]").text == "3"
        assert css(page, "#overview [data-figure=running]").text == "—"
        assert "API only" in css(page, "#overview-note").text
        depths = [r.text.split() for r in all_css(page, "#overview .bar-row")]
        assert ["P0", "1"] in depths and ["P3", "2"] in depths
        assert all_css(page, "#overview [data-figure=rows]") == []
        assert errors(page) == []


@pytest.mark.model
@pytest.mark.timeout(300)
def test_the_engine_panel_shows_a_dead_engine_process_until_it_restarts(
    page: WebDriver, tmp_path: Path
) -> None:
    """The default engine's process killed, and its model file bad for a while (so the
    engine stays down longer than the overview's refresh): the overview's engine tile says
    it is down, with the reason, until a new process is live (issue #47)."""
    import os
    import signal

    settings = console_settings(tmp_path, engine="openvino", engine_threads=1)
    corrupt = tmp_path / "corrupt.gguf"
    corrupt.write_bytes(b"GGUF" + b"\0" * 4096)
    service = all_in_one(settings, workers=1)
    with ThreadedServer(service.app, ws="auto") as live:
        page.get(f"{live.url}/console")
        wait(page, lambda d: css(d, "#engine-process").get_attribute("data-state") == "live")
        engine = service.runtime.engine
        assert isinstance(engine, OpenVINOEngine)
        pid = engine.process_pid
        assert css(page, "#engine-process").text == f"process {pid} live · 0 restarts"
        model_path, engine._config["path"] = engine._config["path"], str(corrupt)
        os.kill(pid, signal.SIGKILL)
        wait(
            page,
            lambda d: css(d, "#engine-process").get_attribute("data-state") == "restarting",
        )
        down = css(page, "#engine-process")
        assert down.text.startswith("process down: the openvino engine process ")
        assert "error" in (down.get_attribute("class") or "")
        wait(page, lambda d: "failed to start" in css(d, "#engine-process").text, 60)
        engine._config["path"] = model_path
        wait(page, lambda d: css(d, "#engine-process").get_attribute("data-state") == "live", 120)
        assert re.fullmatch(r"process \d+ live · \d+ restarts", css(page, "#engine-process").text)
        assert errors(page) == []


MODELS = """
[models.small]
engine = "scripted"

[models.big]
engine = "scripted"
"""


async def _expire_and_serve_big(settings: Settings, task_id: str) -> None:
    """The task ends ``expired`` (as the sweeper writes it) and a worker serving ``big``
    (loaded, 512 MB) registers."""
    async with open_store(settings) as store:
        task = await store.get_task(task_id)
        assert task is not None
        task.status, task.finished_at = TaskStatus.expired, utcnow()
        assert await store.update_task(task, [("status", {"status": "expired"})])
        state = ModelState("big", "test1-big-w0", "loaded", 512.0)
        await store.register_worker("test1-big-w0", 60, [state])


def test_the_model_of_each_task_and_the_models_panel(page: WebDriver, tmp_path: Path) -> None:
    (tmp_path / "models.toml").write_text(MODELS)
    settings = console_settings(tmp_path, models_file=str(tmp_path / "models.toml"))
    with app_service(settings, workers=0) as live:
        big = submit(live.url, {"prompt": "x", "model": "big-fast"})
        small = submit(live.url, {"prompt": "y", "queue_timeout_s": 5})
        asyncio.run(_expire_and_serve_big(settings, small["id"]))
        for size in (DESKTOP, PHONE):
            set_viewport(page, size)
            page.get(f"{live.url}/console")
            wait(page, loaded("#overview", "#tasks"))
            width = page.execute_script("return document.documentElement.scrollWidth")
            assert width <= size[0], f"the page is {width} px wide in a {size[0]} px viewport"
        set_viewport(page, DESKTOP)
        row = css(page, f'tr[data-task="{big["id"]}"]')
        assert row.find_element("css selector", ".model-cell").text == "big"
        expired = css(page, f'tr[data-task="{small["id"]}"] .badge')
        assert expired.get_attribute("data-status") == "expired" and expired.text == "expired"
        loaded_big = css(page, '#models-panel tr[data-model="big"]')
        assert loaded_big.get_attribute("data-state") == "loaded"
        assert "512 MB" in loaded_big.text and "1 worker" in loaded_big.text
        assert "not served" in css(page, '#models-panel tr[data-model="small"]').text
        page.get(f"{live.url}/console#/tasks/{small['id']}")
        wait(page, lambda d: css(d, "#task").get_attribute("data-status") == "expired")
        assert css(page, "#task-model").text == "small"
        assert "never ran" in css(page, "#expired-note").text
        page.get(f"{live.url}/console#/tasks/{big['id']}")
        wait(page, lambda d: css(d, "#task-model").text == "big")
        assert "fast mode" in css(page, "#task .meta").text
        assert errors(page) == []
